"""A torchvision data set held in one local ``.npz`` file of plain arrays, read without pickles.

``<root>/<name>.npz`` (``cifar10.npz``, ``cifar100.npz``, ``mnist.npz``, ``fashionmnist.npz``,
``svhn.npz``) holds four arrays:

* ``train_x``, ``test_x``: the images as uint8 pixels ``0..255``, shape ``(N, H, W, C)``
  (channels last, as CIFAR stores them): ``(N, 28, 28, 1)`` for MNIST and Fashion-MNIST,
  ``(N, 32, 32, 3)`` for CIFAR-10, CIFAR-100 and SVHN;
* ``train_y``, ``test_y``: integer class labels ``0..C-1``, shape ``(N,)``.

When the file is there, :func:`fl.datasets.load_dataset` reads it instead of torchvision's
files and scales it exactly as it scales those, so a model sees identical tensors from either
source. The file is read with ``allow_pickle=False`` and checked whole before it is used:
anything else (pickled objects, other dtypes or shapes, labels out of range, splits whose
images and labels differ in number) is a one-line :class:`~landscape.infra.errors.DataError`.
How to write the file from a torchvision download: ``docs/datasets.md``.
"""
from __future__ import annotations

import math
import os
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from landscape.infra.errors import DataError
from landscape.infra.host_memory import format_bytes
from landscape.infra.reading import LIMITS, open_file, prefixed

#: Data set -> (shape of one image ``(H, W, C)``, number of classes) of its array file.
ARRAY_FORMATS: dict[str, tuple[tuple[int, int, int], int]] = {
    "mnist": ((28, 28, 1), 10), "fashionmnist": ((28, 28, 1), 10),
    "cifar10": ((32, 32, 3), 10), "cifar100": ((32, 32, 3), 100), "svhn": ((32, 32, 3), 10),
}
#: The arrays an array file holds.
ARRAYS = ("train_x", "train_y", "test_x", "test_y")

Split = tuple[np.ndarray, torch.Tensor]  # uint8 images (N, C, H, W), int64 labels (N,)


def array_file(root: str | os.PathLike, key: str) -> Path | None:
    """The array file of data set ``key`` under ``root``, if anything is at that path.

    Parameters
    ----------
    root : str or os.PathLike
        The data folder.
    key : str
        A canonical data-set name.

    Returns
    -------
    Path or None
        ``root/<key>.npz`` when ``key`` has an array format and something (even a broken link)
        is at that path; None otherwise (the data set is then read from torchvision's files).
    """
    path = Path(root) / f"{key}.npz"
    return path if key in ARRAY_FORMATS and os.path.lexists(path) else None


def read_array_file(path: str | os.PathLike, key: str) -> tuple[Split, Split, int]:
    """The training and test splits of data set ``key`` from its array file, checked.

    Parameters
    ----------
    path : str or os.PathLike
        The ``.npz`` file (a link the user made is followed).
    key : str
        A key of :data:`ARRAY_FORMATS`.

    Returns
    -------
    tuple
        ``(train_images, train_labels), (test_images, test_labels), num_classes``: images uint8
        ``(N, C, H, W)`` (a channels-first view of the stored arrays), labels int64.

    Raises
    ------
    DataError
        The path is not a regular file (a FIFO, a device, a folder, a broken link) or is too
        large; it is not an ``.npz`` archive, or its arrays hold pickled objects or are damaged;
        an array is missing; images are not uint8 of the data set's shape; labels are not
        integers of shape ``(N,)`` or not in ``0..C-1``; a split has no images, or a different
        number of images and labels.
    """
    path = Path(path)
    try:
        fh = open_file(path, "data file", prefixed(DataError), follow_links=True)
    except FileNotFoundError:
        raise DataError(f"{path}: is a link to a missing file; remove it, or point it at the {key} array "
                        "file (docs/datasets.md)") from None
    with fh:
        arrays = _load(fh, path)
    shape, classes = ARRAY_FORMATS[key]
    return (_split(arrays, "train", path, key, shape, classes), _split(arrays, "test", path, key, shape, classes),
            classes)


#: What reading a damaged or foreign archive may raise (zipfile, zlib and numpy's .npy reader).
_UNREADABLE = (ValueError, OSError, EOFError, RuntimeError, NotImplementedError, zipfile.BadZipFile, zlib.error)


def _load(fh: BinaryIO, path: Path) -> dict[str, np.ndarray]:
    """The four arrays of an open ``.npz`` file.

    Every array's header is checked before any data is read: no Python objects (pickles), no
    more data declared than stored (zipfile never reads past a member's stored size), and at
    most the data-file limit in all.
    """
    try:
        npz = np.load(fh, allow_pickle=False)
    except _UNREADABLE as exc:
        raise DataError(f"{path}: is not an .npz archive of plain arrays ({str(exc).split('. ')[0]}); write it "
                        "with np.savez (docs/datasets.md)") from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise DataError(f"{path}: is a single .npy array, not an .npz archive of {', '.join(ARRAYS)}; write it "
                        "with np.savez (docs/datasets.md)")
    with npz:
        members = set(npz.zip.namelist())
        missing = [k for k in ARRAYS if f"{k}.npy" not in members]
        if missing:
            raise DataError(f"{path}: has no array {', '.join(missing)}; an array file holds {', '.join(ARRAYS)} "
                            f"(found: {', '.join(sorted(npz.files)) or 'none'})")
        total = 0
        for k in ARRAYS:
            shape, dtype = _header(npz, k, path)
            if dtype.hasobject:
                raise DataError(f"{path}: the array {k} holds Python objects (dtype {dtype}), which are never "
                                "unpickled; save numeric arrays (docs/datasets.md)")
            nbytes, stored = math.prod(shape) * dtype.itemsize, npz.zip.getinfo(f"{k}.npy").file_size
            if nbytes > stored:
                raise DataError(f"{path}: the array {k} declares shape {shape} ({format_bytes(nbytes)}) but holds "
                                f"{format_bytes(stored)}; the file is truncated or forged: write it again")
            total += nbytes
        limit, reason = LIMITS["data file"]
        if total > limit:
            raise DataError(f"{path}: its arrays take {format_bytes(total)}, more than a data file can be "
                            f"({format_bytes(limit)}: {reason})")
        try:
            return {k: npz[k] for k in ARRAYS}
        except _UNREADABLE as exc:
            raise DataError(f"{path}: an array is damaged ({exc}); write the file again (docs/datasets.md)") from None


def _header(npz: np.lib.npyio.NpzFile, name: str, path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of array ``name`` of ``npz``, from its ``.npy`` header (no data is read)."""
    fmt = np.lib.format
    try:
        with npz.zip.open(f"{name}.npy") as member:
            read = fmt.read_array_header_1_0 if fmt.read_magic(member) == (1, 0) else fmt.read_array_header_2_0
            shape, _, dtype = read(member)
    except _UNREADABLE as exc:
        raise DataError(f"{path}: the array {name} is not a readable .npy array ({exc}); write the file with "
                        "np.savez (docs/datasets.md)") from None
    return shape, dtype


def _split(arrays: dict[str, np.ndarray], split: str, path: Path, key: str, shape: tuple[int, int, int],
           classes: int) -> Split:
    """One split's images (as a channels-first view) and labels, checked against the data set's format."""
    x, y = arrays[f"{split}_x"], arrays[f"{split}_y"]
    expected = f"(N, {shape[0]}, {shape[1]}, {shape[2]})"
    if x.dtype != np.uint8:
        raise DataError(f"{path}: {split}_x has dtype {x.dtype}, but images are uint8 pixels 0..255 (the raw "
                        "pixels, not normalised floats)")
    if x.shape[1:] != shape:
        hint = ("; channels first? save x.transpose(0, 2, 3, 1)" if x.shape[1:] == (shape[2], *shape[:2])
                else "; save x[..., None]" if x.shape[1:] == shape[:2] else "")
        raise DataError(f"{path}: {split}_x has shape {x.shape}, but {key} images are {expected} "
                        f"(height, width, channels){hint}")
    if y.dtype.kind not in "iu" or y.ndim != 1:
        raise DataError(f"{path}: {split}_y has dtype {y.dtype} and shape {y.shape}, but labels are integers of "
                        "shape (N,) (save y.reshape(-1).astype(np.int64))")
    if len(x) != len(y):
        raise DataError(f"{path}: {split}_x holds {len(x):,} images but {split}_y {len(y):,} labels; each image "
                        "needs one label")
    if len(x) == 0:
        raise DataError(f"{path}: {split}_x holds no images; a data set needs at least one per split")
    bad = first_bad_label(y, classes)
    if bad is not None:
        raise DataError(f"{path}: {split}_y holds the label {bad}, but {key} labels are 0..{classes - 1}")
    return x.transpose(0, 3, 1, 2), torch.from_numpy(y.astype(np.int64))


def first_bad_label(labels: np.ndarray, classes: int) -> int | None:
    """The first label outside ``0..classes-1``, if any.

    Parameters
    ----------
    labels : np.ndarray
        Integer class labels.
    classes : int
        The number of classes.

    Returns
    -------
    int or None
        The label, or None when every label is a class.
    """
    bad = labels[(labels < 0) | (labels >= classes)]
    return int(bad[0]) if len(bad) else None
