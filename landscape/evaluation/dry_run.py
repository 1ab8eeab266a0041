"""Dry runs of the jobs that evaluate point sets (planes, paths, groups, a curve's evaluation).

:func:`estimate_points` runs the job's own function with a :class:`RecordingEvaluator` in place of
the evaluator: the function builds its point sets as usual (directions, grids, fused models:
cheap), and the stand-in records each set instead of evaluating it, answering NaN. Then each
set's cache key is looked up (:meth:`~landscape.cache.Cache.points`, read only), and a few of
the missing points of the largest set are evaluated for a warm-up and then timed, with the
evaluator's own strategy, chunking and input-layer shortcut but outside the cache
(:func:`~landscape.infra.estimate.time_once`). Nothing is written. One forward pass is one point
on one batch; under ``bn="recompute"`` a point also runs ``bn_batches`` training batches. The
set-up pass of the input-layer shortcut (one forward pass per batch, once per point set) is timed
with the points but not counted.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import torch

from ..infra.errors import ConfigError, NonFiniteLossWarning
from ..infra.estimate import CacheLookup, JobEstimate, Work, plural, tensor_bytes, time_once
from ..space.points import PointSet
from .evaluator import Evaluator
from .memory import default_budget

#: Missing points evaluated per timed call (:func:`~landscape.infra.estimate.time_once`) to time a point.
TIMED_POINTS = 8
#: The unit of work of point evaluations.
FORWARD = "forward pass"


class RecordingEvaluator:
    """Stands in for an :class:`Evaluator` in a dry run: records the point sets, computes nothing.

    Every attribute but :meth:`evaluate_points` and :meth:`evaluate` is the evaluator's.

    Parameters
    ----------
    evaluator : Evaluator
        The evaluator the job was given.

    Attributes
    ----------
    requests : list of (PointSet, torch.Tensor, str)
        The point sets asked for, with their reference point and label, in order.
    """

    def __init__(self, evaluator: Evaluator):
        self.evaluator = evaluator
        self.requests: list[tuple[PointSet, torch.Tensor, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.evaluator, name)

    def evaluate_points(self, points: PointSet, *, reference: torch.Tensor | None = None, label: str = "points",
                        input_shortcut: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Record ``points``; NaN loss and accuracy for each.

        Parameters
        ----------
        points : PointSet
            The point set the job asks for.
        reference : torch.Tensor, optional
            Its reference point (default its origin), as for :meth:`Evaluator.evaluate_points`.
        label : str
            What the points are (``"plane"``, ``"group"``).
        input_shortcut : bool, optional
            Ignored (the timing decides as the evaluator does).

        Returns
        -------
        tuple of numpy.ndarray
            ``(loss, accuracy)``, NaN.
        """
        ref = (reference if reference is not None else points.origin).to(torch.float64)
        self.requests.append((points, ref, label))
        return np.full(len(points), np.nan), np.full(len(points), np.nan)

    evaluate = Evaluator.evaluate


def estimate_points(job: str, evaluator: Any, run: Callable[[Any], Any], notes: tuple[str, ...] = ()) -> JobEstimate:
    """The dry run of a job that evaluates point sets with ``evaluator``.

    Parameters
    ----------
    job : str
        The job's name (``"plane"``).
    evaluator : Evaluator
        The evaluator the job was given.
    run : callable
        ``run(stand_in)`` runs the job with a stand-in evaluator (its result is discarded).
    notes : tuple of str
        Remarks to add.

    Returns
    -------
    JobEstimate
        Forward passes (points x batches), the cache's stored points per set, the peak memory and the time.

    Raises
    ------
    ConfigError
        ``evaluator`` is not a :class:`~landscape.Evaluator` (a dry run times its strategy).
    """
    if not isinstance(evaluator, Evaluator):
        raise ConfigError(f"dry_run needs a landscape.Evaluator, got {type(evaluator).__name__}")
    recorder = RecordingEvaluator(evaluator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteLossWarning)  # the stand-in's NaN metrics
        run(recorder)
    return points_estimate(job, evaluator, recorder.requests, notes)


def points_estimate(job: str, evaluator: Evaluator, requests: list[tuple[PointSet, torch.Tensor, str]],
                    notes: tuple[str, ...] = ()) -> JobEstimate:
    """The estimate of evaluating ``requests`` (point sets with their reference and label).

    Parameters
    ----------
    job : str
        The job's name.
    evaluator : Evaluator
        Evaluates the points.
    requests : list of (PointSet, torch.Tensor, str)
        As recorded by :class:`RecordingEvaluator`.
    notes : tuple of str
        Remarks to add.

    Returns
    -------
    JobEstimate
    """
    ev = evaluator
    passes = len(ev.batches) + (ev.bn_batches if ev.bn == "recompute" and ev.batchnorm.layers else 0)
    lookups, total, missing, largest = [], 0, 0, None
    for points, ref, label in requests:
        n = len(points)
        key = ev.points_key(points, ref)
        done = ev.cache.points(key, n)[2] if ev.cache is not None else np.zeros(n, dtype=bool)
        if ev.cache is not None:
            lookups.append(CacheLookup(f"{label} points", int(done.sum()), n, key))
        todo = np.flatnonzero(~done)
        total, missing = total + n, missing + todo.size
        if todo.size and (largest is None or todo.size > largest[2].size):
            largest = (points, ref, todo)
    per_point = 0.0 if largest is None else time_points(ev, *largest)
    work = Work(FORWARD, total * passes, missing * passes, per_point / passes,
                f"{total:,} points x {passes} {plural('batch', passes)}")
    biggest = max((len(p) for p, _, _ in requests), default=0)
    return JobEstimate(job, (work,), evaluation_memory(ev, biggest), tuple(lookups), notes)


def time_points(evaluator: Evaluator, points: PointSet, reference: torch.Tensor, todo: np.ndarray) -> float:
    """Seconds per point of evaluating some of ``todo`` as the evaluator would, outside its cache.

    Parameters
    ----------
    evaluator : Evaluator
        Evaluates the points (its strategy, chunking and input-layer shortcut).
    points : PointSet
        The whole point set (the shortcut is decided from it).
    reference : torch.Tensor
        Its reference point.
    todo : numpy.ndarray
        Indices of its missing points; the first :data:`TIMED_POINTS` are timed.

    Returns
    -------
    float
    """
    sample = todo[:TIMED_POINTS]
    ref = reference.to(evaluator.device, evaluator.dtype)

    def once() -> None:
        for _ in evaluator.runner.runs(points, sample, ref):
            pass

    return time_once(once, evaluator.device) / sample.size


def evaluation_memory(evaluator: Evaluator, points: int, *, second_order: bool = False) -> dict[str, int]:
    """Parts of the peak memory of evaluating ``points`` points (or of curvature products) with ``evaluator``.

    The chunk follows :func:`~.memory.fitting_chunk` (three flat vectors per point, plus vmap's
    activations of every point); activations are :func:`~.memory.activation_bytes` of the largest
    batch, three times that for second-order products (the graph of a gradient is kept).

    Parameters
    ----------
    evaluator : Evaluator
        The evaluator.
    points : int
        Points of the largest set (0 for curvature products).
    second_order : bool
        Curvature products instead of point evaluations.

    Returns
    -------
    dict
        ``parameters`` (the module copies), ``data`` (the batches on the device), ``chunk`` (point
        vectors) and ``activations`` (one batch), in bytes.
    """
    ev = evaluator
    item = torch.tensor([], dtype=ev.dtype).element_size()
    # not chosen yet: the loop on CPU (as ``auto`` chooses there), else vmap's larger chunks (an upper bound)
    strategy = ev.strategy or ("loop" if ev.device.type == "cpu" or ev.requested_strategy == "loop" else "vmap")
    chunk = min(points, ev.chunk_size or ev.chunk_limit(strategy))
    activations = ev.activation_bytes() * (3 if second_order else max(chunk, 1) if strategy == "vmap" else 1)
    memory = {"parameters": 2 * ev.space.size * item, "data": tensor_bytes(ev.batches)}
    if chunk:
        memory["chunk"] = min(chunk * ev.space.size * item * 3, ev.memory_budget or default_budget(ev.device))
    memory["activations"] = activations
    return memory
