"""Data for alignment and curve training: input batches and shuffled training minibatches.

"data" is a tuple ``(inputs, targets)`` of tensors, a ``Dataset`` yielding such pairs, or a
``DataLoader`` (any iterable of ``(inputs, targets)`` batches).
"""
from __future__ import annotations

from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from landscape import DataError


def _pairs(data: Any) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data):
        if len(data[0]) != len(data[1]):
            raise DataError(f"{len(data[0])} inputs but {len(data[1])} targets")
        yield data[0], data[1]
    elif isinstance(data, Dataset) and not isinstance(data, DataLoader):
        yield from DataLoader(data, batch_size=256)
    elif hasattr(data, "__iter__"):
        for batch in data:
            if not (isinstance(batch, (tuple, list)) and len(batch) >= 2):
                raise DataError("every batch must be an (inputs, targets) pair")
            yield batch[0], batch[1]
    else:
        raise DataError(f"data must be a tuple (inputs, targets), a Dataset or a DataLoader, got {type(data).__name__}")


def first_inputs(data: Any, limit: int) -> torch.Tensor:
    """The first ``limit`` inputs of ``data`` as one tensor.

    Parameters
    ----------
    data : Any
        A tuple ``(inputs, targets)``, a ``Dataset`` or a ``DataLoader``.
    limit : int
        Number of inputs wanted (fewer if the data are shorter).

    Returns
    -------
    torch.Tensor
        Up to ``limit`` inputs, concatenated along the first axis.

    Raises
    ------
    DataError
        If the data are empty or not of a supported form.
    """
    parts, n = [], 0
    for x, _ in _pairs(data):
        parts.append(x[:limit - n])
        n += len(parts[-1])
        if n >= limit:
            break
    if n == 0:
        raise DataError("the data are empty")
    return torch.cat(parts)


def all_pairs(data: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """All of ``data`` as one ``(inputs, targets)`` pair of tensors.

    Parameters
    ----------
    data : Any
        A tuple ``(inputs, targets)``, a ``Dataset`` or a ``DataLoader``.

    Returns
    -------
    (inputs, targets) : tuple[torch.Tensor, torch.Tensor]
        Every batch concatenated along the first axis.

    Raises
    ------
    DataError
        If the data are ``None``, empty or not of a supported form.
    """
    xs, ys = zip(*_pairs(data)) if data is not None else ((), ())
    if not xs or sum(len(y) for y in ys) == 0:
        raise DataError("the training data are empty")
    return torch.cat(xs), torch.cat(ys)


def minibatches(x: torch.Tensor, y: torch.Tensor, batch_size: int, gen: torch.Generator
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of shuffled minibatches (order drawn from ``gen``).

    Parameters
    ----------
    x, y : torch.Tensor
        Inputs and targets, aligned along the first axis.
    batch_size : int
        Samples per minibatch (the last may be smaller).
    gen : torch.Generator
        Source of the shuffling order.

    Yields
    ------
    (inputs, targets) : tuple[torch.Tensor, torch.Tensor]
        One minibatch.
    """
    order = torch.randperm(len(y), generator=gen)
    for start in range(0, len(y), batch_size):
        idx = order[start:start + batch_size]
        yield x[idx], y[idx]
