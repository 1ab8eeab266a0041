"""Why a write failed and what to do about it, in one line.

Only a full disk or an exhausted quota is a reason to free space; a read-only file system, a
forbidden folder, a virtual file system that accepts no new files (``/proc``) or a link in the
way each call for another location, and the message says which.
"""
from __future__ import annotations

import errno
import os

from .errors import FileWriteError

_ELSEWHERE = "choose another location"
_FREE = "free space or choose another location"
_WRITABLE = "choose a writable location"

#: errno -> (why a write failed, in words; what to do about it).
WRITE_FAILURES: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("the disk is full", _FREE),
    errno.EDQUOT: ("the disk quota is exceeded", _FREE),
    errno.EROFS: ("the location is not writable (read-only file system)", _WRITABLE),
    errno.EACCES: ("the location is not writable (permission denied)", _WRITABLE),
    errno.EPERM: ("the location is not writable (operation not permitted)", _WRITABLE),
    errno.ENOENT: ("the location accepts no new files (ENOENT, no such file or directory: a virtual file system "
                   "such as /proc, or a folder removed meanwhile)", _ELSEWHERE),
    errno.ELOOP: ("a symbolic link is in the way (files are never written through links)",
                  "remove the link or choose another location"),
}


def write_failure(exc: OSError) -> tuple[str, str]:
    """Why a write failed, in words, and what to do (full disk, read-only location, a link, ...).

    Parameters
    ----------
    exc : OSError
        The operating system's error.

    Returns
    -------
    tuple of str
        ``(cause, remedy)``: a phrase for a known ``errno`` (:data:`WRITE_FAILURES`), else the
        system's own message with the errno's name, and "choose another location".
    """
    if exc.errno in WRITE_FAILURES:
        return WRITE_FAILURES[exc.errno]
    name = errno.errorcode.get(exc.errno or 0)
    return f"{exc.strerror or exc}{f' ({name})' if name else ''}", _ELSEWHERE


def write_error(path: str | os.PathLike, exc: OSError, size: int | None = None) -> FileWriteError:
    """The error for a failed write of ``path``: why, how many bytes, that nothing was replaced, what to do.

    Parameters
    ----------
    path : str or os.PathLike
        The file that was being written.
    exc : OSError
        The operating system's error.
    size : int or None
        Bytes that were to be written (named in the message when known).

    Returns
    -------
    FileWriteError
        To be raised by the caller.
    """
    needed = f" {_size(size)}" if size is not None else ""
    cause, remedy = write_failure(exc)
    return FileWriteError(path, f"cannot write{needed}: {cause}. Nothing was replaced (an earlier version of the "
                                f"file, if any, is intact); {remedy}")


def _size(n: int) -> str:
    """``n`` bytes in words: ``"2.4 MB (2,400,000 bytes)"``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n:,} bytes)"
    return f"{n} bytes"
