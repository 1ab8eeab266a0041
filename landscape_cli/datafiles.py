"""Data named on the command line: ``--data`` and ``--client-data``.

A **data spec** is ``digits`` or another dataset of the FL engine (``mnist``, ``cifar10``,
..., read from a local root, never downloaded here), or a data file: ``.npz`` (read without
pickles) or ``.pt``/``.pth`` (read with ``weights_only=True``) holding inputs and targets.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from landscape import ConfigError, DataError
from landscape.infra.reading import open_file, prefixed
from landscape_cli.limits import MAX_CLASSES

TensorPair = tuple[torch.Tensor, torch.Tensor]
_INPUT_KEYS = ("inputs", "x", "data", "images", "features")
_TARGET_KEYS = ("targets", "y", "labels", "target", "label")


def load_data(spec: str, *, split: str = "test", root: str | None = None, flatten: bool = False) -> TensorPair:
    """``(inputs, targets)`` for a dataset name or a tensor file.

    Parameters
    ----------
    spec : str
        A dataset name of the FL engine (``digits``, ...) or a ``.pt``/``.pth``/``.npz`` file
        (see :func:`load_tensor_file`).
    split : str
        ``train`` or ``test`` (datasets only).
    root : str, optional
        Folder of torchvision datasets (never downloaded here).
    flatten : bool
        Give each input as a flat vector, shape ``(N, features)`` (the built-in ``digits`` are
        ``(N, 1, 8, 8)``; a model whose first layer is ``Linear(64, ...)`` needs ``(N, 64)``).

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        Inputs and targets.

    Raises
    ------
    ConfigError, DataError
        Unknown split, a folder, an unreadable file or dataset.
    """
    if split not in ("train", "test"):
        raise ConfigError(f"split must be 'train' or 'test', got {split!r}")
    if Path(spec).is_dir():
        from fl.datasets import DATASETS

        raise DataError(f"{spec} is a folder, not data: name a dataset ({', '.join(DATASETS)}) or a .pt/.pth/.npz "
                        "file holding (inputs, targets); a folder of torchvision datasets goes to --data-root")
    if is_file_spec(spec):
        x, y = load_tensor_file(spec)
    else:
        from fl.datasets import load_dataset

        bundle = load_dataset(spec, root=root, download=False)
        x, y = (bundle.train_x, bundle.train_y) if split == "train" else (bundle.test_x, bundle.test_y)
    return (x.reshape(len(x), -1), y) if flatten else (x, y)


def is_file_spec(spec: str) -> bool:
    """Whether a data spec names a data file (``.pt``, ``.pth``, ``.npz``) rather than a dataset.

    Parameters
    ----------
    spec : str
        A ``--data`` value.

    Returns
    -------
    bool
    """
    return Path(spec).suffix in (".pt", ".pth", ".npz")


def load_tensor_file(path: str | Path) -> TensorPair:
    """``(inputs, targets)`` from ``.pt``/``.pth`` (weights only, no pickles) or ``.npz`` (no pickles).

    Accepted layouts: a pair ``(inputs, targets)``, or a mapping with an inputs key
    (``inputs``, ``x``, ``data``, ``images``, ``features``) and a targets key (``targets``,
    ``y``, ``labels``, ...); an ``.npz`` may also hold exactly two unnamed arrays.

    Parameters
    ----------
    path : str or Path
        The file.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        Inputs and targets (integer targets as int64).

    Raises
    ------
    DataError
        A missing file, pickled content, an unknown layout, mismatched lengths, no samples,
        inputs without at least one dimension per sample, 0-d or boolean targets.
    """
    path = Path(path)
    try:  # a FIFO, a device or a folder is refused as such, never read
        fh = open_file(path, "data file", prefixed(DataError), follow_links=True)
    except FileNotFoundError:
        raise DataError(f"data file {path} not found") from None
    with fh:
        if path.suffix == ".npz":
            try:
                with np.load(fh, allow_pickle=False) as npz:
                    obj: Any = {k: npz[k] for k in npz.files}
            except (ValueError, OSError) as exc:
                raise DataError(f"{path}: not a readable .npz file without pickled objects: {exc}") from None
            if set(obj) == {"arr_0", "arr_1"}:
                obj = (obj["arr_0"], obj["arr_1"])
        else:
            try:
                obj = torch.load(fh, map_location="cpu", weights_only=True)
            except Exception as exc:  # torch raises assorted errors on pickles and garbage
                raise DataError(f"{path}: cannot be read as tensors with weights_only=True "
                                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                                "save a tuple (inputs, targets) of tensors") from None
    if isinstance(obj, Mapping):
        x = next((obj[k] for k in _INPUT_KEYS if k in obj), None)
        y = next((obj[k] for k in _TARGET_KEYS if k in obj), None)
        if x is None or y is None:
            raise DataError(f"{path}: a mapping of data needs an inputs key {_INPUT_KEYS} and a targets key "
                            f"{_TARGET_KEYS}; found {sorted(obj)}")
        obj = (x, y)
    if not isinstance(obj, (tuple, list)) or len(obj) != 2:
        raise DataError(f"{path}: expected (inputs, targets), found {type(obj).__name__}")
    try:
        x, y = (torch.as_tensor(t) for t in obj)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise DataError(f"{path}: inputs and targets must be arrays or tensors ({exc})") from None
    if x.ndim < 2 or 0 in x.shape[1:]:
        raise DataError(f"{path}: inputs have shape {tuple(x.shape)}, but they need one row of at least one "
                        "value per sample, shape (N, ...); save the inputs as an array of shape (N, features)")
    if y.ndim < 1:
        raise DataError(f"{path}: targets have shape (), but they need one target per sample, shape (N,)")
    if len(x) != len(y):
        raise DataError(f"{path}: {len(x)} inputs but {len(y)} targets")
    if len(x) == 0:
        raise DataError(f"{path}: holds no samples (0 inputs and 0 targets); save at least one")
    if y.dtype == torch.bool:
        raise DataError(f"{path}: targets are booleans, but labels must be integer class indices >= 0; save "
                        "them as int64 (numpy: y.astype(np.int64), torch: y.long())")
    if not torch.is_floating_point(y):
        y = y.long()
    return x, y


def infer_classes(targets: torch.Tensor) -> int:
    """Number of model outputs the targets call for.

    Parameters
    ----------
    targets : torch.Tensor
        Integer class labels, or float regression targets.

    Returns
    -------
    int
        ``max + 1`` for integer labels; the number of target columns (1 for a vector) for
        float targets.

    Raises
    ------
    DataError
        For no targets, a negative label, or a label of :data:`~landscape_cli.limits.MAX_CLASSES`
        or more (never a model of that many outputs: pass ``--num-classes``).
    """
    if torch.is_floating_point(targets):
        return int(targets.shape[1]) if targets.ndim > 1 else 1
    if targets.numel() == 0:
        raise DataError("there are no targets to infer the number of classes from; pass --num-classes")
    lo, hi = int(targets.min()), int(targets.max())
    if lo < 0:
        raise DataError(f"labels must be class indices 0..C-1, found the label {lo:,}")
    if hi >= MAX_CLASSES:
        raise DataError(f"the largest label is {hi:,}, but at most {MAX_CLASSES:,} classes are inferred from the "
                        "labels; labels must be class indices 0..C-1 (pass --num-classes C for the model's outputs)")
    return hi + 1
