"""MNIST-1D (Greydanus and Kobak, ICML 2024), generated locally and cached as ``.npz``.

The arrays come from the ``mnist1d`` package's own ``make_dataset`` with its default
arguments (``get_dataset_args()``: 5000 signals, 80/20 split, length 40, seed 42), so
the data are the paper's standard 4000 training and 1000 test signals. The package's
download path and its pickle cache are never used. The generated arrays are cached as
``<root>/mnist1d-<package version>.npz`` together with a SHA-256 digest of their bytes.

The generator is deterministic, so a fingerprint of its output is recorded here: the
SHA-256 of the labels (integers: the same bits on every machine) and four random
projections of the inputs (:data:`INPUT_PROJECTIONS`). The inputs are float32 results of
float64 arithmetic whose last bits may differ between CPUs (NumPy dispatches other SIMD
kernels on AVX-512), so the projections are compared to ``PROJECTION_RTOL`` of their scale
``sum_i |w_i x_i|``, not bit for bit. A cache file that does not match (unreadable, damaged,
or edited with a recomputed digest) is regenerated with a warning, never trusted, and
generated data that do not match (another ``mnist1d`` or NumPy) are refused with a
``DataError``. Writes go through the toolkit's link-safe atomic writer (:mod:`landscape.infra.files`),
so a reader never sees a partial file and no existing file or link is written through; the data
folder itself may be a link (the user's choice of where data live) and is followed.

A second draw, :data:`PRETRAIN`, is the same generator with the same arguments and another seed
(5000 more signals, cached as ``<root>/mnist1d-pretrain-<package version>.npz`` and checked
against its own recorded fingerprint): data from the same distribution that share no signal
with the standard training and test sets, for pretraining a model before a federated run
(:func:`fl.pretrain.pretrain`). Each draw is standardised by the generator with its own
sample's mean and standard deviation, which agree between draws of 5000 signals to sampling error.
"""
from __future__ import annotations

import hashlib
import io
import random
import warnings
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Mapping

import numpy as np

from landscape.infra.errors import DataError, LandscapeError
from landscape.infra.files import write_atomic

#: Keys of the cached arrays, in digest order.
KEYS = ("x", "y", "x_test", "y_test")
#: SHA-256 of the generator's labels ``y`` then ``y_test`` as little-endian int64 (mnist1d 0.0.2.post1).
LABELS_SHA256 = "6feec4a017698c7fe237c8854cbd2e338c6dd5c16240f6fa79daefaaa129e169"
#: ``w_j @ x`` of the generator's inputs for the four integer weight vectors ``w_j`` in [-1000, 1000]
#: drawn by ``numpy.random.default_rng(PROJECTION_SEED)`` (``x`` first, then ``x_test``).
INPUT_PROJECTIONS = {
    "x": (-130210.87063254233, 411755.4912186445, 56580.482636525965, -204531.2698208622),
    "x_test": (21073.03874381671, -98005.40899410177, -81958.16676058927, 83813.24555440113)}
PROJECTION_SEED = 20261125
#: Relative tolerance of a projection, against its scale ``sum_i |w_i x_i|``. Inputs that differ
#: by one float32 rounding (2**-24 relative) per value move a projection by at most 6e-8 of its
#: scale; an edit is found when it moves one by 1e-6 of it (about 60 in these units: scaling
#: the inputs by 1.001 or adding 1e-3 to every value is found).
PROJECTION_RTOL = 1e-6


@dataclass(frozen=True)
class Draw:
    """One draw of the MNIST-1D generator: its seed and the recorded fingerprint of its output.

    Parameters
    ----------
    name : str
        Stem of its cache file (``<name>-<package version>.npz``).
    seed : int
        The generator's ``seed`` argument (every other argument is the package default).
    labels_sha256 : str
        SHA-256 of its labels ``y`` then ``y_test`` as little-endian int64.
    projections : Mapping[str, tuple[float, ...]]
        ``w_j @ x`` of its inputs (``x``, ``x_test``) for the weights drawn from ``PROJECTION_SEED``.
    """

    name: str
    seed: int
    labels_sha256: str
    projections: Mapping[str, tuple[float, ...]]


#: The paper's standard data (the package's default seed 42): the training and test sets of ``fl``.
MAIN = Draw("mnist1d", 42, LABELS_SHA256, INPUT_PROJECTIONS)
#: Pretraining data: the same generator and arguments with seed 2024, disjoint from :data:`MAIN`.
PRETRAIN = Draw(
    "mnist1d-pretrain", 2024, "5bd95631a74a64a80ec411e34ccb881235dc6bdbd720893eb04a9a3be1442a9d",
    {"x": (-254643.87608028375, -334693.6837447819, 249534.0888255705, -422338.64957458014),
     "x_test": (68966.14234142125, 69532.24923757692, -133741.4471415475, -49930.382239739076)})


def load_mnist1d(root: Path, draw: Draw = MAIN) -> dict[str, np.ndarray]:
    """The MNIST-1D arrays, from the cache in ``root`` or freshly generated (and cached).

    Parameters
    ----------
    root : Path
        Cache folder (created when missing).
    draw : Draw
        Which draw of the generator (default: the standard data).

    Returns
    -------
    dict
        ``x`` (4000, 1, 40) and ``x_test`` (1000, 1, 40) float32 signals, ``y`` and
        ``y_test`` int64 labels in 0..9.

    Raises
    ------
    DataError
        When the installed generator does not produce the recorded data (:func:`matches_generator`).
    """
    path = cache_path(root, draw)
    arrays = _read_cache(path, draw)
    if arrays is None:
        if path.exists() or path.is_symlink():
            warnings.warn(f"{path}: not the MNIST-1D data of the mnist1d generator (unreadable, damaged, or "
                          "its arrays differ from the generator's recorded fingerprint); regenerating it", stacklevel=2)
        arrays = generate(draw)
        if not matches_generator(arrays, draw):
            raise DataError(f"mnist1d {_package_version()} generated data that differ from the recorded "
                            f"fingerprint of its output (labels SHA-256 {draw.labels_sha256[:12]}...); install the "
                            "versions pinned in constraints.txt (mnist1d==0.0.2.post1)")
        _write_cache(path, arrays)
    return arrays


def cache_path(root: Path, draw: Draw = MAIN) -> Path:
    """Cache file of the installed ``mnist1d`` version under ``root``.

    Parameters
    ----------
    root : Path
        Cache folder.
    draw : Draw
        Which draw of the generator.

    Returns
    -------
    Path
        ``root / "<draw name>-<version>.npz"`` (``mnist1d-<version>.npz`` for the standard data).
    """
    return Path(root) / f"{draw.name}-{_package_version()}.npz"


def generate(draw: Draw = MAIN) -> dict[str, np.ndarray]:
    """Run ``mnist1d.data.make_dataset`` with the package's default arguments and ``draw``'s seed.

    The generator seeds Python's and NumPy's global random state; both are restored
    afterwards so the caller's random streams are unchanged.

    Parameters
    ----------
    draw : Draw
        Which draw (default: the standard data, the package's own seed 42).

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
    args = get_dataset_args()
    args.seed = draw.seed
    try:
        data = make_dataset(args)
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


def matches_generator(arrays: dict[str, np.ndarray], draw: Draw = MAIN) -> bool:
    """Whether ``arrays`` are the generator's output: labels bit for bit, inputs to rounding.

    Parameters
    ----------
    arrays : dict
        The four MNIST-1D arrays.
    draw : Draw
        The draw they should be (default: the standard data).

    Returns
    -------
    bool
        The labels' SHA-256 is ``draw.labels_sha256`` and every projection of
        ``draw.projections`` agrees to ``PROJECTION_RTOL`` of its scale.
    """
    labels = hashlib.sha256()
    for key in ("y", "y_test"):
        labels.update(np.ascontiguousarray(arrays[key]).astype("<i8").tobytes())
    if labels.hexdigest() != draw.labels_sha256:
        return False
    rng = np.random.default_rng(PROJECTION_SEED)
    for key, recorded in draw.projections.items():
        if arrays[key].shape != (len(arrays[key.replace("x", "y")]), 1, 40):
            return False
        x = np.asarray(arrays[key], dtype=np.float64).ravel()
        if not np.isfinite(x).all():
            return False
        w = rng.integers(-1000, 1001, size=(len(recorded), x.size)).astype(np.float64)
        scale = np.abs(w) @ np.abs(x)
        if not np.all(np.abs(w @ x - np.asarray(recorded)) <= PROJECTION_RTOL * scale):
            return False
    return True


def _read_cache(path: Path, draw: Draw) -> dict[str, np.ndarray] | None:
    """The cached arrays, or None when the file is missing, unreadable or not the generator's data."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in KEYS}
            stored = str(npz["digest"])  # the file's own digest: damage to the bytes
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    return arrays if stored == digest(arrays) and matches_generator(arrays, draw) else None


def _write_cache(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write the cache with the toolkit's link-safe atomic writer.

    The data folder is the user's choice (``root=``, ``$LANDSCAPE_DATA``): when it is a link, the
    file is written where it points; a link at the file itself is never followed. An unwritable
    cache folder is not an error (the arrays are already in memory).
    """
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
