"""Datasets for the FL engine, loaded once into memory as normalised float tensors.

``"digits"`` is embedded (scikit-learn's 8x8 handwritten digits, no download).
``"mnist1d"`` is generated locally by the ``mnist1d`` package (Greydanus and Kobak, ICML
2024; see :mod:`fl.mnist1d`), no download either. MNIST,
Fashion-MNIST, CIFAR-10, CIFAR-100 and SVHN are read from a local ``root``: from the array
file ``<root>/<name>.npz`` when it is there (:mod:`fl.array_datasets`, read without pickles),
else from torchvision's files (MNIST's idx files are read and checked by :mod:`fl.idx_files`;
the others through the real torchvision dataset classes), which are downloaded only when
``download=True``.

Normalisation: digits are divided by 16 (pixel range [0, 16] -> [0, 1]); torchvision
datasets are scaled to [0, 1] and standardised per channel with the usual training-set
mean/std (``NORMALIZATION``). No augmentation, as in the FedGuCci, FLOCO and IMA code.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch.utils.data import TensorDataset

from landscape.infra.errors import ConfigError, DataError
from landscape.infra.options import did_you_mean

from .array_datasets import array_file, read_array_file
from .idx_files import has_files, idx_names, read_mnist_files

DATASETS = ("digits", "mnist1d", "mnist", "fashionmnist", "cifar10", "cifar100", "svhn")

#: Per-channel (mean, std) of the training images in [0, 1], used to standardise.
NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashionmnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "svhn": ((0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
}

#: The fixed digits split: 20% of each class is test data, drawn with this seed.
DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0

_DEFAULT_ROOT_ENV = "LANDSCAPE_DATA"


@dataclass(frozen=True)
class DataBundle:
    """A dataset held in memory.

    Inputs float32 (images ``(N, C, H, W)``, MNIST-1D signals ``(N, 1, L)``), labels
    ``(N,)`` int64.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input, ``(C, H, W)`` (``(1, L)`` for MNIST-1D)."""
        return tuple(self.train_x.shape[1:])

    def train_dataset(self, indices: np.ndarray | None = None) -> TensorDataset:
        """The training samples (all, or those at ``indices``) as a ``TensorDataset``."""
        if indices is None:
            return TensorDataset(self.train_x, self.train_y)
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        return TensorDataset(self.train_x[idx], self.train_y[idx])

    def test_dataset(self) -> TensorDataset:
        """The test samples as a ``TensorDataset``."""
        return TensorDataset(self.test_x, self.test_y)


NORMALIZE_MODES = ("mean_std", "half", "none")


def load_dataset(name: str = "digits", *, root: str | os.PathLike | None = None,
                 download: bool = False, normalize: str = "mean_std") -> DataBundle:
    """Load ``name`` (one of ``DATASETS``) with its standard train/test split.

    ``root`` is the folder holding the data sets' array files (``<root>/cifar10.npz``, ...,
    read first when present: :mod:`fl.array_datasets`), the torchvision files and the MNIST-1D
    cache (default: :func:`default_root`); it is ignored for ``"digits"``. ``normalize``
    applies to the torchvision datasets (from either source): ``"mean_std"`` (per-channel ``NORMALIZATION``),
    ``"half"`` (``(x - 0.5) / 0.5``, FedGuCci's CIFAR code) or ``"none"`` (``x`` in [0, 1]);
    digits are always in [0, 1] and MNIST-1D signals are standardised by its generator.
    Raises ``DataError`` for an unknown name, an array file or MNIST file that fails its checks
    (:mod:`fl.array_datasets`, :mod:`fl.idx_files`), or when the files are missing and ``download``
    is False.
    """
    key = canonical_name(name)
    if normalize not in NORMALIZE_MODES:
        raise ConfigError(f"normalize must be one of {', '.join(NORMALIZE_MODES)}, got {normalize!r}.")
    if key == "digits":
        return _load_digits()
    if key not in _READERS and key != "mnist1d":
        raise DataError(unknown_dataset(name))
    root = default_root() if root is None else Path(root).expanduser()
    if key == "mnist1d":
        from .mnist1d import load_mnist1d

        arrays = load_mnist1d(root)
        return DataBundle("mnist1d", *(torch.from_numpy(arrays[k]) for k in ("x", "y", "x_test", "y_test")),
                          num_classes=10)
    npz = array_file(root, key)
    (train_x, train_y), (test_x, test_y), num_classes = (
        read_array_file(npz, key) if npz is not None else _READERS[key](key, root, download))
    return DataBundle(key, _scale(train_x, key, normalize), train_y, _scale(test_x, key, normalize),
                      test_y, num_classes)


def default_root() -> Path:
    """Folder of downloaded and generated data sets.

    ``$LANDSCAPE_DATA`` when set, else ``$XDG_CACHE_HOME/landscape-fl/data``
    (``~/.cache/landscape-fl/data`` without it).

    The folder may be a symbolic link (for example to a larger disk): it is the user's own
    choice, so it is followed and the data cache is written where it points. Links inside it
    (at a cache file) are never written through.

    Returns
    -------
    Path
        The folder (not created here).
    """
    if os.environ.get(_DEFAULT_ROOT_ENV):
        return Path(os.environ[_DEFAULT_ROOT_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "landscape-fl" / "data"


def _load_digits() -> DataBundle:
    """scikit-learn digits, 1797 images 1x8x8 in [0, 1]; stratified 80/20 split (seed 0)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=DIGITS_TEST_FRACTION,
                                              stratify=y, random_state=DIGITS_SPLIT_SEED)
    return DataBundle("digits", torch.from_numpy(x_tr), torch.from_numpy(y_tr),
                      torch.from_numpy(x_te), torch.from_numpy(y_te), num_classes=10)


def _scale(images: np.ndarray | torch.Tensor, key: str, normalize: str) -> torch.Tensor:
    """uint8 images ``(N, C, H, W)`` -> float32 ``x / 255``, then standardised per ``normalize``."""
    x = torch.as_tensor(np.ascontiguousarray(images)).to(torch.float32).div_(255.0)
    if normalize == "none":
        return x
    stats = NORMALIZATION[key] if normalize == "mean_std" else ((0.5,), (0.5,))
    mean, std = (torch.tensor(v, dtype=torch.float32).view(1, -1, 1, 1) for v in stats)
    return x.sub_(mean).div_(std)


def _open(cls: type, root: Path, download: bool, expected: list[str], **kwargs):
    """Instantiate a torchvision dataset class; turn its 'not found' error into a DataError."""
    try:
        return cls(root=str(root), download=download, **kwargs)
    except (RuntimeError, OSError) as err:
        files = ", ".join(str(root / f) for f in expected)
        raise DataError(
            f"{cls.__name__} files not found, corrupted or not downloadable under {root} ({err}). "
            f"Expected: {files}. Pass download=True to fetch them, or root=<folder that contains them>, "
            f"or save the arrays as {root / cls.__name__.lower()}.npz (docs/datasets.md)."
        ) from err


_Split = tuple[np.ndarray | torch.Tensor, torch.Tensor]  # uint8 images (N, C, H, W), int64 labels


def _read_mnist_like(key: str, root: Path, download: bool) -> tuple[_Split, _Split, int]:
    """MNIST / Fashion-MNIST idx files under ``root/<MNIST|FashionMNIST>/raw``, read and checked by :mod:`fl.idx_files`.

    torchvision only downloads them (when they are missing and ``download`` is True) or says
    which are missing; it never reads a file that was already there.
    """
    from torchvision import datasets

    cls = {"mnist": datasets.MNIST, "fashionmnist": datasets.FashionMNIST}[key]
    folder = root / cls.__name__
    if not has_files(folder):
        expected = [str(Path(cls.__name__) / "raw" / name) for name in idx_names()]
        _open(cls, root, download, expected, train=True)  # downloads the files, or says what is missing
    return read_mnist_files(folder, key)


def _read_cifar(key: str, root: Path, download: bool) -> tuple[_Split, _Split, int]:
    """CIFAR python batches.

    torchvision verifies each batch file's md5 before unpickling it, which is what makes
    reading this pickled format safe; we keep that check.
    """
    from torchvision import datasets

    cls = {"cifar10": datasets.CIFAR10, "cifar100": datasets.CIFAR100}[key]
    files = [f for f, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
    expected = [str(Path(cls.base_folder) / f) for f in files]
    train, test = (_open(cls, root, download, expected, train=flag) for flag in (True, False))
    split = [(s.data.transpose(0, 3, 1, 2), torch.as_tensor(np.asarray(s.targets), dtype=torch.int64))
             for s in (train, test)]  # torchvision keeps CIFAR images as (N, H, W, C)
    return split[0], split[1], len(train.classes)


def _read_svhn(key: str, root: Path, download: bool) -> tuple[_Split, _Split, int]:
    """SVHN cropped digits (``root/train_32x32.mat``, ``root/test_32x32.mat``); torchvision maps label 10 to digit 0."""
    from torchvision import datasets

    cls = datasets.SVHN
    train, test = (_open(cls, root, download, [cls.split_list[split][1]], split=split)
                   for split in ("train", "test"))
    return ((train.data, torch.as_tensor(train.labels, dtype=torch.int64)),
            (test.data, torch.as_tensor(test.labels, dtype=torch.int64)), 10)


_READERS: dict[str, Callable[[str, Path, bool], tuple[_Split, _Split, int]]] = {
    "mnist": _read_mnist_like, "fashionmnist": _read_mnist_like,
    "cifar10": _read_cifar, "cifar100": _read_cifar, "svhn": _read_svhn,
}
_ALIASES = {"fmnist": "fashionmnist"}


def unknown_dataset(name: str) -> str:
    """The message for a dataset name that is not one of :data:`DATASETS`: the list and a did-you-mean.

    Parameters
    ----------
    name : str
        The name given.

    Returns
    -------
    str
    """
    return (f"unknown dataset {name!r}{did_you_mean(canonical_name(name), DATASETS)}; "
            f"choose one of {', '.join(DATASETS)}.")


def canonical_name(name: str) -> str:
    """Dataset key: case, '-' and '_' are ignored ("CIFAR-10" -> "cifar10"); "fmnist" is accepted."""
    key = name.lower().replace("-", "").replace("_", "")
    return _ALIASES.get(key, key)
