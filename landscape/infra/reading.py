"""Checked reads of run-folder, cache and checkpoint files: the one way this toolkit opens such a file.

A file named by a run folder or a cache may be anything: a FIFO (reading it blocks forever), a
character device such as ``/dev/zero`` (reading it never ends and fills the memory), a folder,
a symbolic link, or a regular file far larger than any the toolkit writes. Every such read
therefore:

1. opens the path with ``O_NONBLOCK`` (opening a FIFO does not wait for a writer) and, unless
   the caller trusts links at that place, ``O_NOFOLLOW``;
2. ``fstat``-s the *opened descriptor* (not the name, which may be swapped meanwhile) and refuses
   anything that is not a regular file, naming what it is (FIFO, character device, folder, ...);
3. refuses a file larger than the limit of its kind (:data:`LIMITS`, each with its reason), and
   reads at most that many bytes even if the file grows while it is read.

Libraries that open files by name (``h5py``, ``np.load``, ``torch.load``, ``safetensors``) are
given the checked file object where they accept one, or the path right after
:func:`check_file`. Refusals are one line: ``"<path>: is a FIFO (named pipe), not a regular file; ..."``.
"""
from __future__ import annotations

import errno
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, BinaryIO, Callable

from .errors import LandscapeError
from .host_memory import format_bytes

#: Builds the caller's error from the path and the problem (e.g. ``CheckpointError``).
ErrorFactory = Callable[[Path, str], LandscapeError]


def prefixed(cls: Callable[[str], LandscapeError]) -> ErrorFactory:
    """The error factory that builds ``cls("<path>: <problem>")``.

    Parameters
    ----------
    cls : Callable[[str], LandscapeError]
        An error class taking one message (``CacheError``, ``DataError``, ...).

    Returns
    -------
    Callable[[Path, str], LandscapeError]
        The factory, for :func:`open_file`, :func:`read_file` and :func:`check_file`.
    """
    def factory(path: Path, problem: str) -> LandscapeError:
        return cls(f"{path}: {problem}")

    return factory

#: Largest size of each kind of file that is read (bytes), and why. A larger file is refused, never read.
LIMITS: dict[str, tuple[int, str]] = {
    "JSON file": (16 << 20, "config.json, progress.json and a cache's marker are written by this toolkit "
                              "and hold a few kB"),
    "metrics log": (256 << 20, "metrics.jsonl has one line per round, a few kB even with 1,000 clients: "
                               "10,000 rounds take about 80 MB"),
    "run manifest": (1 << 30, "manifest.json holds about 150 bytes per checkpoint of a run: 1 GiB is 7 million "
                              "checkpoints"),
    "partition file": (4 << 30, "partition.npz holds one 8-byte index per training sample: 4 GiB is 500 million "
                           "samples"),
    "cache file": (4 << 30, "a cache entry is built in memory by its writer and read whole to check its "
                             "SHA-256; a 1000 x 1000 plane takes 25 MB"),
    "checkpoint": (4 << 40, "checkpoints are streamed or mapped by torch and safetensors; the largest models "
                            "(a trillion parameters in 16 bits) take 2 TB"),
    "data file": (64 << 30, "a .pt/.npz data file is loaded whole into memory"),
}

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISLNK, "a symbolic link"))


def what_is(mode: int) -> str:
    """What a file of mode ``mode`` is, in words (``"a FIFO (named pipe)"``, ``"a folder"``, ...).

    Parameters
    ----------
    mode : int
        ``st_mode`` of an ``os.stat`` or ``os.lstat`` result.

    Returns
    -------
    str
        ``"a regular file"`` for a regular file.
    """
    return next((words for test, words in _KINDS if test(mode)), "a regular file" if stat.S_ISREG(mode)
                else "a special file")


def open_file(path: str | os.PathLike, kind: str, error: ErrorFactory, *, follow_links: bool = False) -> BinaryIO:
    """Open ``path`` for reading after checking that it is a regular file within the limit of ``kind``.

    Parameters
    ----------
    path : str or os.PathLike
        The file.
    kind : str
        A key of :data:`LIMITS` (named in errors).
    error : Callable[[Path, str], LandscapeError]
        Builds the error to raise from the path and the problem (``CheckpointError``, ...).
    follow_links : bool
        If False (run-folder and cache files), a symbolic link at ``path`` is refused; True for
        files the user named, whose links are the user's own choice.

    Returns
    -------
    BinaryIO
        The open file (the caller closes it), positioned at the start.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist (callers decide what a missing file means).
    LandscapeError
        ``error(path, problem)``: a link (unless followed), not a regular file, larger than the
        limit, or unreadable.
    """
    path = Path(path)
    limit, reason = LIMITS[kind]
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links and path.is_symlink():
            raise error(path, f"is a symbolic link; a {kind} is never read through a link: remove the link "
                              "if you did not put it there") from None
        raise error(path, f"cannot be read: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(path, f"is {what_is(st.st_mode)}, not a regular file; a {kind} must be a regular file: "
                              "move it away")
        if st.st_size > limit:
            raise error(path, f"is {format_bytes(st.st_size)}, more than a {kind} can be ({format_bytes(limit)}: "
                              f"{reason}); it was not written by this toolkit: move it away")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_file(path: str | os.PathLike, kind: str, error: ErrorFactory, *, follow_links: bool = False) -> bytes:
    """The whole content of ``path``, checked as by :func:`open_file` and read within its kind's limit.

    Parameters
    ----------
    path, kind, error, follow_links
        As for :func:`open_file`.

    Returns
    -------
    bytes
        The file's bytes (one read of one version, even if it is replaced meanwhile).

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    LandscapeError
        As for :func:`open_file`, and when the file grew past the limit while it was read.
    """
    limit, _ = LIMITS[kind]
    with open_file(path, kind, error, follow_links=follow_links) as fh:
        try:  # the size it has, plus one byte so that growth shows; the limit's worth is never allocated at once
            data = fh.read(min(os.fstat(fh.fileno()).st_size, limit) + 1)
            while len(data) <= limit and (more := fh.read(min(1 << 24, limit + 1 - len(data)))):
                data += more
        except OSError as exc:
            raise error(Path(path), f"cannot be read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise error(Path(path), f"grew past {format_bytes(limit)} while it was read, more than a {kind} can be; "
                                "move it away")
    return data


def check_file(path: str | os.PathLike, kind: str, error: ErrorFactory, *, follow_links: bool = False) -> None:
    """Check ``path`` as :func:`open_file` does, for a library that then opens it by name.

    Parameters
    ----------
    path, kind, error, follow_links
        As for :func:`open_file`.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    LandscapeError
        As for :func:`open_file`.
    """
    open_file(path, kind, error, follow_links=follow_links).close()


def load_json(text: str | bytes, **hooks: Any) -> Any:
    """``json.loads`` for text read from a file or given as an option: every refusal is a ``ValueError``.

    An integer longer than Python converts (``sys.get_int_max_str_digits()``, 4,300 digits by
    default) is refused with a message that says so, instead of advising to raise that limit:
    no file or option of this toolkit holds one, so such a file is damaged or forged.

    Parameters
    ----------
    text : str or bytes
        The JSON text (bytes are decoded as UTF-8, -16 or -32, as by ``json.loads``).
    **hooks : Any
        Other keyword arguments of ``json.loads`` (``parse_constant``, ...).

    Returns
    -------
    Any
        The parsed value.

    Raises
    ------
    ValueError
        Not JSON (``json.JSONDecodeError``), not text (``UnicodeDecodeError``), or an integer of
        too many digits.
    RecursionError
        Nested too deeply for the parser.
    """
    return json.loads(text, parse_int=_parse_int, **hooks)


def _parse_int(digits: str) -> int:
    """An integer of the JSON text, or a ValueError naming its length and Python's limit."""
    try:
        return int(digits)
    except ValueError:
        raise ValueError(f"an integer of {len(digits.lstrip('-')):,} digits (Python converts at most "
                         f"{sys.get_int_max_str_digits():,}; this toolkit never writes one)") from None
