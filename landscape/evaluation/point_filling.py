"""The one loop that fills a point set's metrics: cached points are read, missing ones computed.

Both the in-process evaluator and the sharded (multi-worker) evaluation run
:func:`fill_points`: they differ only in how they compute a run of missing points. Finished
points reach the cache as they arrive (the cache writes them at most every ``flush_interval``
seconds), so an interrupted evaluation resumes with only the missing points.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Iterable

import numpy as np

#: ``compute(todo)`` yields ``(indices, loss, accuracy)`` for runs of the missing indices.
ComputeRuns = Callable[[np.ndarray], Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]]]


def progress_bar(total: int, label: str, show: bool | None) -> Any:
    """A tqdm bar, or ``None`` when hidden (``show`` False, or None and not on a terminal).

    Parameters
    ----------
    total
        Number of points.
    label
        Bar description.
    show
        True / False, or None for "when stderr is a terminal".

    Returns
    -------
    tqdm or None
    """
    if not (show if show is not None else sys.stderr.isatty()) or total < 2:
        return None
    from ..infra.progress import progress_bar

    return progress_bar(total=total, desc=label, unit="pt", leave=False)


def contiguous_run(todo: np.ndarray, pos: int, size: int) -> int:
    """Length (at most ``size``) of the run of consecutive indices starting at ``todo[pos]``.

    Parameters
    ----------
    todo
        Sorted indices.
    pos
        Start position in ``todo``.
    size
        Longest run wanted.

    Returns
    -------
    int
    """
    run = 1
    while run < size and pos + run < todo.size and todo[pos + run] == todo[pos] + run:
        run += 1
    return run


def fill_points(n: int, key: str, cache: Any, compute: ComputeRuns, *, label: str = "points",
                progress: bool | None = None, on_done: Callable[[int], None] | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Loss and accuracy of ``n`` points: cached values read, the rest computed and stored.

    Parameters
    ----------
    n
        Number of points.
    key
        The point set's cache key.
    cache
        A :class:`~landscape.cache.Cache` or ``None``.
    compute
        ``compute(todo)`` yields ``(indices, loss, accuracy)`` for the missing indices ``todo``.
    label
        Progress-bar label, also stored with the points.
    progress
        Show a progress bar (None: when on a terminal).
    on_done
        Called with the number of points of each finished run.

    Returns
    -------
    tuple of numpy.ndarray
        ``(loss, accuracy)``, each of length ``n``.
    """
    if cache is not None:
        loss, acc, done = cache.points(key, n)
    else:
        loss, acc, done = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, dtype=bool)
    todo = np.flatnonzero(~done)
    if todo.size == 0:
        return loss, acc
    bar = progress_bar(todo.size, label, progress)
    try:
        for idx, chunk_loss, chunk_acc in compute(todo):
            loss[idx], acc[idx] = chunk_loss, chunk_acc
            if on_done is not None:
                on_done(idx.size)
            if cache is not None:
                cache.add_points(key, n, idx, chunk_loss, chunk_acc, {"label": label})
            if bar is not None:
                bar.update(idx.size)
    finally:
        if bar is not None:
            bar.close()
        if cache is not None:
            cache.flush()
    return loss, acc
