"""MNIST and Fashion-MNIST from torchvision's files in the data folder, read and checked here.

torchvision keeps each data set as four idx files under ``<root>/<MNIST|FashionMNIST>/raw``:
``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte`` and
``t10k-labels-idx1-ubyte``. An idx file is a 4-byte magic number (two zero bytes, the element
type, ``0x08`` for unsigned bytes, and the number of dimensions), one big-endian 32-bit size
per dimension, then the elements. Older torchvision versions cached the same tensors as
``processed/training.pt`` and ``processed/test.pt``; those are read only when the four idx
files are not all there.

Every file is checked whole before it is used, and each problem is a one-line
:class:`~landscape.infra.errors.DataError` naming the file: not a regular file or too large;
a wrong magic number (a gzip file not unpacked), element type or number of dimensions; images
that are not 28 x 28; sizes in the header that do not match the file's length; a split with no
images, or with a different number of images and labels; a label outside ``0..9``. A
``processed/*.pt`` file is read with ``torch.load(weights_only=True)``: Python objects in it
are refused, never unpickled, and its tensors are checked as the idx files are.
"""
from __future__ import annotations

import math
import os
import struct
from pathlib import Path

import numpy as np
import torch

from landscape.infra.errors import DataError
from landscape.infra.reading import open_file, prefixed, read_file

from .array_datasets import ARRAY_FORMATS, Split, first_bad_label

#: The split -> the prefix of its idx files (``<prefix>-images-idx3-ubyte``, ``<prefix>-labels-idx1-ubyte``).
SPLITS = {"train": "train", "test": "t10k"}
#: The split -> its file in torchvision's older ``processed`` cache.
PROCESSED = {"train": "training.pt", "test": "test.pt"}
_UBYTE = 0x08
_GZIP = b"\x1f\x8b"
_AGAIN = "delete the damaged files and pass download=True to fetch them again"


def idx_names() -> list[str]:
    """The four idx files of a data set, as torchvision names them in its ``raw`` folder.

    Returns
    -------
    list of str
        Training images and labels, then test images and labels.
    """
    return [f"{prefix}-{kind}" for prefix in SPLITS.values()
            for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")]


def has_files(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` (``<root>/MNIST`` or ``<root>/FashionMNIST``) holds a full set of files to read.

    Parameters
    ----------
    folder : str or os.PathLike
        The data set's torchvision folder.

    Returns
    -------
    bool
        True when all four idx files, or both ``processed`` files, are there (anything at each
        path: what it is, is checked when it is read).
    """
    folder = Path(folder)
    return (all(os.path.lexists(folder / "raw" / name) for name in idx_names())
            or all(os.path.lexists(folder / "processed" / name) for name in PROCESSED.values()))


def read_mnist_files(folder: str | os.PathLike, key: str) -> tuple[Split, Split, int]:
    """The training and test splits of ``key`` from its torchvision folder, checked.

    Parameters
    ----------
    folder : str or os.PathLike
        ``<root>/MNIST`` or ``<root>/FashionMNIST``, for which :func:`has_files` is True.
    key : str
        ``"mnist"`` or ``"fashionmnist"``.

    Returns
    -------
    tuple
        ``(train_images, train_labels), (test_images, test_labels), num_classes``: images uint8
        ``(N, 1, 28, 28)``, labels int64.

    Raises
    ------
    DataError
        A file is not a regular file, too large, a link to nothing, not an idx file of the data
        set's images or labels (magic number, element type, dimensions, image size), shorter or
        longer than its header declares, or (``processed``) not plain tensors; a split has no
        images, or not as many labels as images; a label is outside ``0..C-1``.
    """
    folder = Path(folder)
    raw = folder / "raw"
    if all(os.path.lexists(raw / name) for name in idx_names()):
        splits = [_idx_split(raw / f"{prefix}-images-idx3-ubyte", raw / f"{prefix}-labels-idx1-ubyte", key)
                  for prefix in SPLITS.values()]
    else:
        splits = [_processed_split(folder / "processed" / name, key) for name in PROCESSED.values()]
    return splits[0], splits[1], ARRAY_FORMATS[key][1]


def _idx_split(images_path: Path, labels_path: Path, key: str) -> Split:
    """One split from its images and labels idx files."""
    (height, width, _), classes = ARRAY_FORMATS[key]
    images = _read_idx(images_path, key, "images", (height, width))
    labels = _read_idx(labels_path, key, "labels", ())
    return _checked(images, labels, classes, key, images_path, labels_path)


def _read_idx(path: Path, key: str, what: str, item: tuple[int, ...]) -> np.ndarray:
    """The array of an idx file of unsigned bytes whose items have shape ``item``."""
    try:
        data = read_file(path, "data file", prefixed(DataError), follow_links=True)
    except FileNotFoundError:
        raise DataError(f"{path}: is a link to a missing file; remove it, or point it at the {key} idx file") from None
    dims = 1 + len(item)
    if data[:2] == _GZIP:
        raise DataError(f"{path}: is gzip-compressed; unpack it (gunzip) or pass download=True, which unpacks "
                        "torchvision's downloads")
    if len(data) < 4 or data[:2] != b"\0\0":
        raise DataError(f"{path}: is not an idx file (its magic number is {data[:4].hex() or 'missing'}, not "
                        f"0000080{dims}); {_AGAIN}")
    if data[2] != _UBYTE:
        raise DataError(f"{path}: holds elements of type 0x{data[2]:02x}, but {key} {what} are unsigned bytes "
                        f"(0x{_UBYTE:02x}); {_AGAIN}")
    if data[3] != dims:
        raise DataError(f"{path}: has {data[3]} dimension{'s' if data[3] != 1 else ''}, but {key} {what} files "
                        f"have {dims}; is it the {'labels' if what == 'images' else 'images'} file?")
    header = 4 + 4 * dims
    if len(data) < header:
        raise DataError(f"{path}: is truncated within its header ({len(data)} bytes of {header}); {_AGAIN}")
    shape = struct.unpack(f">{dims}I", data[4:header])
    if shape[1:] != item:
        raise DataError(f"{path}: holds images of {' x '.join(map(str, shape[1:]))} pixels, but {key} images "
                        f"are {' x '.join(map(str, item))}")
    stored, declared = len(data) - header, math.prod(shape)
    if stored != declared:
        raise DataError(f"{path}: its header declares {shape[0]:,} {what} ({declared:,} bytes) but it holds "
                        f"{stored:,} bytes after the header; the file is truncated or damaged: {_AGAIN}")
    return np.frombuffer(data, np.uint8, offset=header).reshape(shape).copy()


def _processed_split(path: Path, key: str) -> Split:
    """One split from torchvision's older cache, ``processed/<training|test>.pt``: ``(images, labels)``."""
    (height, width, _), classes = ARRAY_FORMATS[key]
    remedy = (f"delete {path.parent} to read the raw idx files ({', '.join(idx_names())}) under "
              f"{path.parent.parent / 'raw'}, which download=True fetches")
    try:
        fh = open_file(path, "data file", prefixed(DataError), follow_links=True)
    except FileNotFoundError:
        raise DataError(f"{path}: is a link to a missing file; {remedy}") from None
    with fh:
        try:
            content = torch.load(fh, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises assorted errors on pickles and garbage
            raise DataError(f"{path}: is not a file of plain tensors ({_refusal(exc)}), and it is never "
                            f"unpickled; {remedy}") from None
    if not (isinstance(content, (tuple, list)) and len(content) == 2
            and all(isinstance(t, torch.Tensor) for t in content)):
        raise DataError(f"{path}: holds {type(content).__name__}, not the tensors (images, labels); {remedy}")
    images, labels = content
    if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (height, width) \
            or labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool or labels.ndim != 1:
        raise DataError(f"{path}: holds images {images.dtype} {tuple(images.shape)} and labels {labels.dtype} "
                        f"{tuple(labels.shape)}, but {key} has uint8 images (N, {height}, {width}) and integer "
                        f"labels (N,); {remedy}")
    return _checked(images.numpy(), labels.numpy(), classes, key, path, path)


def _checked(images: np.ndarray, labels: np.ndarray, classes: int, key: str, images_path: Path,
             labels_path: Path) -> Split:
    """A split after the checks that take images and labels together; images gain their channel axis."""
    if len(images) == 0:
        raise DataError(f"{images_path}: holds no images; a data set needs at least one per split")
    if len(images) != len(labels):
        where = " but" if images_path == labels_path else f", but {labels_path} holds"
        raise DataError(f"{images_path}: holds {len(images):,} images{where} {len(labels):,} labels; each image "
                        f"needs one label: {_AGAIN}")
    bad = first_bad_label(labels, classes)
    if bad is not None:
        raise DataError(f"{labels_path}: holds the label {bad}, but {key} labels are 0..{classes - 1}")
    return images[:, None], torch.from_numpy(labels.astype(np.int64))


def _refusal(exc: Exception) -> str:
    """What torch.load refused, in one line (the line naming a forbidden global, when there is one)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    detail = next((line for line in lines if "GLOBAL" in line), lines[0] if lines else "")
    return f"{type(exc).__name__}: {detail}".rstrip(": ")
