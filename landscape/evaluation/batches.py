"""Data for alignment and curve training: input batches and shuffled training minibatches.

"data" is a tuple ``(inputs, targets)`` of tensors, a ``Dataset`` yielding such pairs (or
dicts such as ``{"input_ids", "labels"}``), or a ``DataLoader`` (any iterable of batches); each
batch goes through :func:`~landscape.evaluation.inputs.to_pair`, the evaluator's own adapter, so
model inputs may be a tensor, a tuple or a dict of tensors.
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from ..infra.errors import DataError
from .inputs import BatchFn, ModelInputs, leading, map_tensors, to_pair


def _pairs(data: Any, batch_fn: BatchFn | None = None) -> Iterator[tuple[ModelInputs, torch.Tensor]]:
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data):
        if len(data[0]) != len(data[1]):
            raise DataError(f"{len(data[0])} inputs but {len(data[1])} targets")
        yield to_pair(data, batch_fn)
    elif isinstance(data, Dataset) and not isinstance(data, DataLoader):
        for batch in DataLoader(data, batch_size=256):
            yield to_pair(batch, batch_fn)
    elif hasattr(data, "__iter__"):
        for batch in data:
            yield to_pair(batch, batch_fn)
    else:
        raise DataError(f"data must be a tuple (inputs, targets), a Dataset or a DataLoader, got {type(data).__name__}")


def concat_inputs(parts: Sequence[ModelInputs]) -> ModelInputs:
    """Model inputs of several batches joined along the first axis (per position or key).

    Parameters
    ----------
    parts : Sequence[ModelInputs]
        Batches' inputs of one form: tensors, tuples or dicts of tensors.

    Returns
    -------
    ModelInputs
        One input of that form.

    Raises
    ------
    DataError
        When the batches' inputs differ in form, keys or trailing shapes.
    """
    first = parts[0]
    try:
        if isinstance(first, dict):
            return {k: torch.cat([p[k] for p in parts]) for k in first}
        if isinstance(first, tuple):
            return tuple(torch.cat([p[i] for p in parts]) for i in range(len(first)))
        return torch.cat(list(parts))
    except (KeyError, IndexError, TypeError, RuntimeError) as exc:
        raise DataError(f"the batches' inputs cannot be joined (same form and trailing shapes needed, e.g. padded "
                        f"sequences of one length): {type(exc).__name__}: {str(exc).splitlines()[0]}") from None


def first_inputs(data: Any, limit: int, batch_fn: BatchFn | None = None) -> ModelInputs:
    """The first ``limit`` inputs of ``data`` as one tensor.

    Parameters
    ----------
    data : Any
        A tuple ``(inputs, targets)``, a ``Dataset`` or a ``DataLoader``.
    limit : int
        Number of inputs wanted (fewer if the data are shorter).
    batch_fn : callable, optional
        Maps a batch to ``(model_inputs, targets)`` (the evaluator's ``batch_fn``).

    Returns
    -------
    ModelInputs
        Up to ``limit`` inputs (a tensor for tensor data), concatenated along the first axis.

    Raises
    ------
    DataError
        If the data are empty or not of a supported form.
    """
    parts, n = [], 0
    for x, y in _pairs(data, batch_fn):
        parts.append(leading(x, limit - n))
        n += min(len(y), limit - n)
        if n >= limit:
            break
    if n == 0:
        raise DataError("the data are empty")
    return concat_inputs(parts)


def all_pairs(data: Any, batch_fn: BatchFn | None = None) -> tuple[ModelInputs, torch.Tensor]:
    """All of ``data`` as one ``(inputs, targets)`` pair.

    Parameters
    ----------
    data : Any
        A tuple ``(inputs, targets)``, a ``Dataset`` or a ``DataLoader``.
    batch_fn : callable, optional
        Maps a batch to ``(model_inputs, targets)`` (the evaluator's ``batch_fn``).

    Returns
    -------
    (inputs, targets) : tuple[ModelInputs, torch.Tensor]
        Every batch concatenated along the first axis (inputs: a tensor, tuple or dict).

    Raises
    ------
    DataError
        If the data are ``None``, empty or not of a supported form.
    """
    xs, ys = zip(*_pairs(data, batch_fn)) if data is not None else ((), ())
    if not xs or sum(len(y) for y in ys) == 0:
        raise DataError("the training data are empty")
    return concat_inputs(xs), torch.cat(ys)


def minibatches(x: ModelInputs, y: torch.Tensor, batch_size: int, gen: torch.Generator
                ) -> Iterator[tuple[ModelInputs, torch.Tensor]]:
    """One epoch of shuffled minibatches (order drawn from ``gen``).

    Parameters
    ----------
    x : ModelInputs
        Inputs (a tensor, tuple or dict of tensors), aligned with ``y`` along the first axis.
    y : torch.Tensor
        Targets.
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
        yield map_tensors(x, lambda t, idx=idx: t[idx]), y[idx]
