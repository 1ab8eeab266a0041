"""Evaluation data: moved to the device once, fingerprinted for the cache.

"data" is a ``DataLoader``, a ``Dataset`` yielding ``(input, target)`` pairs, or a tuple
``(inputs, targets)`` of tensors. Its batches may be pairs, tuples or dicts, or anything a
``batch_fn`` maps to ``(model_inputs, targets)`` (:mod:`.inputs`). It is materialised as a list
of ``(x, y)`` batches that stay resident on the evaluation device (``x`` a tensor, or a tuple or
dict of tensors).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from ..infra.errors import DataError
from .inputs import BatchFn, ModelInputs, input_length, map_tensors, tensors, to_pair
from .losses import IGNORE_INDEX, LOSSES

DEFAULT_BATCH_SIZE = 1024


@dataclass(frozen=True)
class DeviceData:
    """Batches on the device, their sample count and a fingerprint of the bytes.

    Attributes
    ----------
    batches
        ``(x, y)`` batches, resident on the evaluation device.
    num_samples
        Total number of samples.
    fingerprint
        First 32 hexadecimal digits of a SHA-256 over the dtypes, shapes and bytes of every
        batch (as given, before any cast), for the cache key.
    """

    batches: tuple[tuple[ModelInputs, torch.Tensor], ...]
    num_samples: int
    fingerprint: str


def prepare_data(data: Any, device: torch.device, dtype: torch.dtype,
                 batch_size: int | None = None, max_batches: int | None = None,
                 batch_fn: BatchFn | None = None) -> DeviceData:
    """Materialise ``data`` as device-resident batches (floating-point inputs cast to ``dtype``).

    Parameters
    ----------
    data
        A ``DataLoader``, a ``Dataset`` of ``(input, target)`` pairs, or a tuple
        ``(inputs, targets)`` of tensors.
    device
        Where the batches live.
    dtype
        Floating-point inputs and targets are cast to it.
    batch_size
        Batch size for datasets and tensor pairs (default :data:`DEFAULT_BATCH_SIZE`; a
        ``DataLoader`` keeps its own).
    max_batches
        Keep only the first this many batches.
    batch_fn
        ``batch -> (model_inputs, targets)`` applied to every batch (see :mod:`.inputs`).

    Returns
    -------
    DeviceData
        The batches, the sample count and the fingerprint.

    Raises
    ------
    DataError
        If the data are empty, of an unusable type, not ``(inputs, targets)`` tensor pairs,
        of mismatched lengths, or hold NaN or infinite values.
    """
    cpu_batches = list(_iter_batches(data, batch_size, batch_fn))
    if max_batches is not None:
        cpu_batches = cpu_batches[:max_batches]
    if not cpu_batches or sum(len(y) for _, y in cpu_batches) == 0:
        raise DataError("the dataset is empty: nothing to evaluate on")
    digest = hashlib.sha256()
    batches = []
    n = 0
    for x, y in cpu_batches:
        if input_length(x) != len(y):
            raise DataError(f"a batch has {input_length(x)} inputs but {len(y)} targets")
        x = map_tensors(x, torch.Tensor.contiguous)
        y = y.contiguous()
        named = [(f"inputs {key}".rstrip(), t) for key, t in tensors(x)] + [("targets", y)]
        for name, t in named:
            if torch.is_floating_point(t) and not torch.isfinite(t).all():
                bad = int((~torch.isfinite(t)).sum())
                raise DataError(f"the {name} contain {bad} NaN or infinite values (batch {len(batches)}); "
                                "every loss would be NaN: clean or impute the data first")
        for key, t in named:
            if not isinstance(x, torch.Tensor):  # a tensor's digest stays what it was before structured inputs
                digest.update(key.encode())
            digest.update(f"{t.dtype}:{tuple(t.shape)}".encode())
            digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        x = map_tensors(x, lambda t: (t.to(dtype) if torch.is_floating_point(t) else t).to(device))
        if torch.is_floating_point(y):
            y = y.to(dtype)
        batches.append((x, y.to(device)))
        n += len(y)
    return DeviceData(tuple(batches), n, digest.hexdigest()[:32])


def _iter_batches(data: Any, batch_size: int | None, batch_fn: BatchFn | None):
    if isinstance(data, DataLoader):
        for item in data:
            yield to_pair(item, batch_fn)
        return
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data):
        x, y = data
        if len(x) != len(y):
            raise DataError(f"inputs have {len(x)} samples but targets have {len(y)}")
        bs = batch_size or DEFAULT_BATCH_SIZE
        for start in range(0, len(x), bs):
            yield to_pair((x[start:start + bs], y[start:start + bs]), batch_fn)
        return
    if isinstance(data, Dataset) or hasattr(data, "__getitem__"):
        loader = DataLoader(data, batch_size=batch_size or DEFAULT_BATCH_SIZE, shuffle=False)
        for item in loader:
            yield to_pair(item, batch_fn)
        return
    raise DataError(f"cannot use {type(data).__name__} as data: pass a DataLoader, a Dataset of "
                    "(input, target) pairs, or a tuple (inputs, targets) of tensors")


def check_targets(outputs: torch.Tensor, targets: torch.Tensor, loss: str) -> None:
    """Fail early on labels that do not fit the model's outputs.

    Parameters
    ----------
    outputs
        The model's outputs on a batch, classes on the last dimension.
    targets
        The batch's targets.
    loss
        The loss name; integer labels are checked for ``cross_entropy``, ``nll``, ``mse`` and the
        token losses (``causal_lm``, ``masked_lm``, ``token``).

    Raises
    ------
    DataError
        If an integer label lies outside ``[0, C - 1]`` for ``C`` outputs (``-100``, ignored, is
        allowed for token losses), the labels of a classification loss are booleans, floating
        point (other than class probabilities of the outputs' shape for cross-entropy) or not
        one-dimensional, or token labels do not have the ``(N, T)`` shape of ``(N, T, V)`` logits.
    """
    found = LOSSES.find(loss)
    if found is not None and found.tokens:
        _check_token_labels(outputs, targets, loss)
    if loss in ("cross_entropy", "nll"):
        shape = tuple(targets.shape)
        if targets.dtype == torch.bool:
            raise DataError(f"labels are booleans, but {loss} needs integer class indices >= 0 of shape (N,); "
                            "convert them with labels.long()")
        if torch.is_floating_point(targets) and (targets.ndim != outputs.ndim or shape[1:] != tuple(outputs.shape[1:])):
            probabilities = " (or class probabilities of the outputs' shape)" if loss == "cross_entropy" else ""
            raise DataError(f"labels are floating point with shape {shape}: {loss} needs integer class indices "
                            f"of shape (N,){probabilities}; convert them with labels.long().reshape(-1)")
        if not torch.is_floating_point(targets) and targets.ndim != 1:
            hint = ("; for a language model's (N, T, V) logits pass loss='causal_lm' (next-token labels) or "
                    "loss='token' (one label per position)" if outputs.ndim == 3 and targets.ndim == 2
                    else "; flatten them with labels.reshape(-1)")
            raise DataError(f"labels have shape {shape}: {loss} needs class indices of shape (N,){hint}")
        if torch.is_floating_point(targets) and loss == "nll":
            raise DataError("nll needs integer class indices, not floating-point labels")
    if loss in ("cross_entropy", "nll", "mse") or (found is not None and found.tokens):
        if torch.is_floating_point(targets):
            return
        counted = targets[targets != IGNORE_INDEX] if found is not None and found.tokens else targets
        if not counted.numel():
            return
        classes = outputs.shape[-1]
        lo, hi = int(counted.min()), int(counted.max())
        if lo < 0 or hi >= classes:
            kind = " (integer class indices >= 0)" if lo < 0 else ""
            raise DataError(f"labels must lie in [0, {classes - 1}] for a model with {classes} outputs{kind}; "
                            f"found labels in [{lo}, {hi}]")


def _check_token_labels(outputs: torch.Tensor, targets: torch.Tensor, loss: str) -> None:
    """Token losses need integer ``(N, T)`` labels for ``(N, T, V)`` logits."""
    if outputs.ndim != 3 or torch.is_floating_point(targets) or targets.dtype == torch.bool \
            or targets.ndim != 2 or targets.shape[1] != outputs.shape[1]:
        raise DataError(f"loss={loss!r} needs (N, T, V) logits and integer (N, T) labels (-100 for ignored "
                        f"tokens), got logits of shape (N, {', '.join(map(str, outputs.shape[1:]))}) and labels "
                        f"of shape {tuple(targets.shape)} ({targets.dtype})")
