"""Evaluation data: moved to the device once, fingerprinted for the cache.

"data" is a ``DataLoader``, a ``Dataset`` yielding ``(input, target)`` pairs, or a tuple
``(inputs, targets)`` of tensors. It is materialised as a list of ``(x, y)`` batches that
stay resident on the evaluation device.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from ..infra.errors import DataError

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

    batches: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    num_samples: int
    fingerprint: str


def prepare_data(data: Any, device: torch.device, dtype: torch.dtype,
                 batch_size: int | None = None, max_batches: int | None = None) -> DeviceData:
    """Materialise ``data`` as device-resident batches (inputs cast to ``dtype`` if floating).

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
    cpu_batches = list(_iter_batches(data, batch_size))
    if max_batches is not None:
        cpu_batches = cpu_batches[:max_batches]
    if not cpu_batches or sum(len(y) for _, y in cpu_batches) == 0:
        raise DataError("the dataset is empty: nothing to evaluate on")
    digest = hashlib.sha256()
    batches = []
    n = 0
    for x, y in cpu_batches:
        if len(x) != len(y):
            raise DataError(f"a batch has {len(x)} inputs but {len(y)} targets")
        x = x.contiguous()
        y = y.contiguous()
        for name, t in (("inputs", x), ("targets", y)):
            if torch.is_floating_point(t) and not torch.isfinite(t).all():
                bad = int((~torch.isfinite(t)).sum())
                raise DataError(f"the {name} contain {bad} NaN or infinite values (batch {len(batches)}); "
                                "every loss would be NaN: clean or impute the data first")
        for t in (x, y):
            digest.update(f"{t.dtype}:{tuple(t.shape)}".encode())
            digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        if torch.is_floating_point(x):
            x = x.to(dtype)
        if torch.is_floating_point(y):
            y = y.to(dtype)
        batches.append((x.to(device), y.to(device)))
        n += len(y)
    return DeviceData(tuple(batches), n, digest.hexdigest()[:32])


def _iter_batches(data: Any, batch_size: int | None):
    if isinstance(data, DataLoader):
        for item in data:
            yield _pair(item)
        return
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data):
        x, y = data
        if len(x) != len(y):
            raise DataError(f"inputs have {len(x)} samples but targets have {len(y)}")
        bs = batch_size or DEFAULT_BATCH_SIZE
        for start in range(0, len(x), bs):
            yield x[start:start + bs].detach().cpu(), y[start:start + bs].detach().cpu()
        return
    if isinstance(data, Dataset) or hasattr(data, "__getitem__"):
        loader = DataLoader(data, batch_size=batch_size or DEFAULT_BATCH_SIZE, shuffle=False)
        for item in loader:
            yield _pair(item)
        return
    raise DataError(f"cannot use {type(data).__name__} as data: pass a DataLoader, a Dataset of "
                    "(input, target) pairs, or a tuple (inputs, targets) of tensors")


def _pair(item: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(item, (tuple, list)) or len(item) < 2:
        raise DataError("each batch must be an (inputs, targets) pair")
    x, y = item[0], item[1]
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise DataError("inputs and targets must be tensors")
    return x.detach().cpu(), y.detach().cpu()


def check_targets(outputs: torch.Tensor, targets: torch.Tensor, loss: str) -> None:
    """Fail early on labels that do not fit the model's outputs.

    Parameters
    ----------
    outputs
        The model's outputs on a batch, classes on the last dimension.
    targets
        The batch's targets.
    loss
        The loss name; integer labels are checked for ``cross_entropy``, ``nll`` and ``mse``.

    Raises
    ------
    DataError
        If an integer label lies outside ``[0, C - 1]`` for ``C`` outputs, or the labels of a
        classification loss are booleans, floating point (other than class probabilities of
        the outputs' shape for cross-entropy) or not one-dimensional.
    """
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
            raise DataError(f"labels have shape {shape}: {loss} needs class indices of shape (N,); "
                            "flatten them with labels.reshape(-1)")
        if torch.is_floating_point(targets) and loss == "nll":
            raise DataError("nll needs integer class indices, not floating-point labels")
    if loss in ("cross_entropy", "nll", "mse") and not torch.is_floating_point(targets):
        classes = outputs.shape[-1]
        lo, hi = int(targets.min()), int(targets.max())
        if lo < 0 or hi >= classes:
            kind = " (integer class indices >= 0)" if lo < 0 else ""
            raise DataError(f"labels must lie in [0, {classes - 1}] for a model with {classes} outputs{kind}; "
                            f"found labels in [{lo}, {hi}]")
