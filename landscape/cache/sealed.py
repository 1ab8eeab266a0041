"""Sealed HDF5 files: built in memory, read from memory, verified by a SHA-256 in the user block.

The first ``USERBLOCK`` bytes of a sealed file (an HDF5 user block, which HDF5 ignores) hold
``SEAL`` and the SHA-256 (hex) of every byte after the user block. The digest is checked
before HDF5 parses anything, so a damaged or truncated file, or one without a seal, gives
:class:`CacheError`, never silently wrong numbers, nor the crash or endless loop HDF5 can fall
into on damaged metadata.

Files are built in a memory buffer and written by the caller in one piece: no h5py object
ever holds a file on disk open for writing, so a full disk cannot leave one behind in a
broken state (a segmentation fault was once seen after a failed on-disk write).
"""
from __future__ import annotations

import hashlib
import io
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from ..infra.errors import CacheError, LandscapeError
from ..infra.reading import prefixed, read_file

USERBLOCK = 512
SEAL = b"landscape-cache sha256 "


def build(fill: Callable[[Any], None]) -> bytearray:
    """The bytes of a new sealed HDF5 file whose content ``fill(root_group)`` writes.

    Parameters
    ----------
    fill : Callable[[h5py.Group], None]
        Called once with the open, empty root group of the file.

    Returns
    -------
    bytearray
        The complete file, seal included.
    """
    import h5py

    buffer = io.BytesIO()
    with h5py.File(buffer, "w", userblock_size=USERBLOCK, locking=False) as f:
        fill(f)
    data = bytearray(buffer.getbuffer())
    digest = hashlib.sha256(memoryview(data)[USERBLOCK:]).hexdigest().encode()
    data[:len(SEAL) + len(digest)] = SEAL + digest
    return data


def is_sealed(data: bytes) -> bool:
    """True if ``data`` starts with a seal (whether or not the digest matches).

    Parameters
    ----------
    data : bytes
        The bytes of a file.

    Returns
    -------
    bool
    """
    return data.startswith(SEAL)


def seal_matches(data: bytes) -> bool:
    """True if ``data`` is sealed and its content matches the sealed digest.

    Parameters
    ----------
    data : bytes
        The bytes of a file.

    Returns
    -------
    bool
        True if the SHA-256 of everything after the user block equals the one sealed into it.
    """
    head = data[len(SEAL):len(SEAL) + 64]
    return is_sealed(data) and len(data) >= USERBLOCK and \
        hashlib.sha256(memoryview(data)[USERBLOCK:]).hexdigest().encode() == head


def corrupt(path: str | os.PathLike, detail: object) -> CacheError:
    """The error for an unreadable cache file ``path``.

    Parameters
    ----------
    path : str or os.PathLike
        The file.
    detail : object
        What went wrong (an exception or a sentence).

    Returns
    -------
    CacheError
        The one-line error (the caller raises it), advising to move the file away.
    """
    return CacheError(f"{path}: not a readable HDF5 cache file (corrupt or truncated?): {detail}. "
                      "Move it away to recompute what it held.")


def read_bytes(path: Path, *, follow_links: bool = True) -> bytes | None:
    """The whole content of ``path`` (one read of one version, even if it is replaced meanwhile), or None if absent.

    Read with :func:`landscape.infra.reading.read_file`: a FIFO, a device, a folder or a file
    larger than a cache entry can be is refused, never read.

    Parameters
    ----------
    path : Path
        The file to read.
    follow_links : bool
        If False, a symbolic link at ``path`` is refused.

    Returns
    -------
    bytes or None
        The file's bytes, or None if it does not exist.

    Raises
    ------
    CacheError
        ``path`` is not a regular file, is too large, cannot be read, or is a symbolic link and
        ``follow_links`` is False.
    """
    try:
        return read_file(path, "cache file", prefixed(CacheError), follow_links=follow_links)
    except FileNotFoundError:
        return None


@contextmanager
def parsed(data: bytes, path: str | os.PathLike) -> Iterator[Any]:
    """Open the HDF5 file held in ``data`` (read from ``path``) after checking its seal.

    A file without a seal is refused too: its numbers cannot be checked (a damaged user block,
    or a file from before caches were sealed), and unchecked bytes can parse as wrong numbers.

    Parameters
    ----------
    data : bytes
        The file's bytes.
    path : str or os.PathLike
        Where they came from (named in errors).

    Yields
    ------
    h5py.File
        Open for reading; errors HDF5 raises while the caller reads become :class:`CacheError`.

    Raises
    ------
    CacheError
        The file has no seal, its content does not match the seal, or HDF5 cannot parse it.
    """
    import h5py

    if not is_sealed(data):
        raise CacheError(f"{path}: has no checksum (no SHA-256 seal in its first {USERBLOCK} bytes: damaged, or "
                         "written before cache files were sealed), so its numbers cannot be checked. Move it "
                         "away or delete it to recompute what it held")
    if not seal_matches(data):
        raise corrupt(path, "its content does not match the SHA-256 sealed into it")
    try:
        f = h5py.File(io.BytesIO(data), "r", locking=False)
    except Exception as exc:  # h5py raises assorted errors on damaged files
        raise corrupt(path, exc) from None
    try:
        yield f
    except LandscapeError:
        raise
    except Exception as exc:  # damaged metadata met while reading
        raise corrupt(path, exc) from None
    finally:
        f.close()
