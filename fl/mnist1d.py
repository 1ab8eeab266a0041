"""MNIST-1D (Greydanus and Kobak, ICML 2024), generated locally and cached as ``.npz``.

The arrays come from the ``mnist1d`` package's own ``make_dataset`` with its default
arguments (``get_dataset_args()``: 5000 signals, 80/20 split, length 40, seed 42), so
the data are the paper's standard 4000 training and 1000 test signals. The package's
download path and its pickle cache are never used. The generated arrays are cached as
``<root>/mnist1d-<package version>.npz`` together with a SHA-256 digest of their bytes.
The generator is deterministic, so the digest of its output is recorded here
(:data:`DATA_SHA256`): a cache file whose arrays do not have it (unreadable, damaged, or
edited with a recomputed digest) is regenerated with a warning, never trusted, and generated
data without it (another ``mnist1d`` or NumPy) are refused with a ``DataError``. Writes go through the toolkit's link-safe atomic writer (:mod:`landscape.infra.files`),
so a reader never sees a partial file and no existing file or link is written through; the data
folder itself may be a link (the user's choice of where data live) and is followed.
"""
from __future__ import annotations

import hashlib
import io
import random
import warnings
import zipfile
from importlib import metadata
from pathlib import Path

import numpy as np

from landscape import DataError, LandscapeError
from landscape.infra.files import write_atomic

#: Keys of the cached arrays, in digest order.
KEYS = ("x", "y", "x_test", "y_test")
#: :func:`digest` of :func:`generate`'s arrays with mnist1d 0.0.2.post1 and NumPy 2.4 (constraints.txt).
DATA_SHA256 = "07baaaae71e3adcf985b8fde2c7b9ed8630efb6fa82db702a49387331482a30a"


def load_mnist1d(root: Path) -> dict[str, np.ndarray]:
    """The MNIST-1D arrays, from the cache in ``root`` or freshly generated (and cached).

    Parameters
    ----------
    root : Path
        Cache folder (created when missing).

    Returns
    -------
    dict
        ``x`` (4000, 1, 40) and ``x_test`` (1000, 1, 40) float32 signals, ``y`` and
        ``y_test`` int64 labels in 0..9.

    Raises
    ------
    DataError
        When the installed generator does not produce the recorded data (:data:`DATA_SHA256`).
    """
    path = cache_path(root)
    arrays = _read_cache(path)
    if arrays is None:
        if path.exists() or path.is_symlink():
            warnings.warn(f"{path}: not the MNIST-1D data of the mnist1d generator (unreadable, or its SHA-256 "
                          "differs from the generator's output); regenerating it", stacklevel=2)
        arrays = generate()
        if digest(arrays) != DATA_SHA256:
            raise DataError(f"mnist1d {_package_version()} generated data whose SHA-256 differs from the "
                            f"recorded one of its output ({DATA_SHA256[:12]}...); install the versions pinned "
                            "in constraints.txt (mnist1d==0.0.2.post1)")
        _write_cache(path, arrays)
    return arrays


def cache_path(root: Path) -> Path:
    """Cache file of the installed ``mnist1d`` version under ``root``.

    Parameters
    ----------
    root : Path
        Cache folder.

    Returns
    -------
    Path
        ``root / "mnist1d-<version>.npz"``.
    """
    return Path(root) / f"mnist1d-{_package_version()}.npz"


def generate() -> dict[str, np.ndarray]:
    """Run ``mnist1d.data.make_dataset`` with the package's default arguments.

    The generator seeds Python's and NumPy's global random state; both are restored
    afterwards so the caller's random streams are unchanged.

    Returns
    -------
    dict
        The arrays described in :func:`load_mnist1d`.
    """
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as err:
        raise DataError("MNIST-1D needs the 'mnist1d' package: pip install mnist1d") from err
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        data = make_dataset(get_dataset_args())
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    return {"x": data["x"].astype(np.float32)[:, None, :], "y": data["y"].astype(np.int64),
            "x_test": data["x_test"].astype(np.float32)[:, None, :],
            "y_test": data["y_test"].astype(np.int64)}


def digest(arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 over the keys, dtypes, shapes and bytes of ``arrays`` (in :data:`KEYS` order).

    Parameters
    ----------
    arrays : dict
        The four MNIST-1D arrays.

    Returns
    -------
    str
        Hex digest.
    """
    h = hashlib.sha256()
    for key in KEYS:
        a = np.ascontiguousarray(arrays[key])
        h.update(f"{key}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _read_cache(path: Path) -> dict[str, np.ndarray] | None:
    """The cached arrays, or None when the file is missing, unreadable or not the generator's data."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in KEYS}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    return arrays if digest(arrays) == DATA_SHA256 else None


def _write_cache(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write the cache with the toolkit's link-safe atomic writer.

    The data folder is the user's choice (``root=``, ``$LANDSCAPE_DATA``): when it is a link, the
    file is written where it points; a link at the file itself is never followed. An unwritable
    cache folder is not an error (the arrays are already in memory)."""
    buffer = io.BytesIO()
    np.savez(buffer, digest=np.array(digest(arrays)), **arrays)
    try:
        write_atomic(path, buffer.getbuffer(), root=path.parent)
    except (OSError, LandscapeError):
        return


def _package_version() -> str:
    try:
        return metadata.version("mnist1d")
    except metadata.PackageNotFoundError as err:
        raise DataError("MNIST-1D needs the 'mnist1d' package: pip install mnist1d") from err
