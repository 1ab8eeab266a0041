"""Link-safe atomic file writes and lock files: the one way this toolkit writes a file.

A file is never written in place and never through a link:

1. the folder is opened with ``O_NOFOLLOW`` (a folder that is a symbolic link is refused: it
   was not created here), and so is every folder between it and ``root`` when the caller names
   the folder the user chose (``root``: its own links are the user's choice and are followed):
   each is opened relative to the one above it, created there if missing, so a link anywhere
   below ``root`` is refused before anything is written. Every later step is relative to the
   open folder, so a folder swapped for a link in between cannot redirect the write;
2. the target is refused if it is a symbolic link or not a regular file;
3. the bytes go to a new, unique temporary name beside the target (``.<name>.tmp-<random>``),
   created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode 0600, so a link planted at any
   name is never followed and a guessed name is never reused; the file is written, given
   its final mode, fsynced, renamed over the target, and the folder is fsynced.

Readers therefore see the old or the new file, never a half-written one; a process killed at
any moment leaves at most a temporary file (``.tmp-`` in its name) that callers holding a lock
may remove. A full disk or a read-only location gives one :class:`FileWriteError` naming the
path and the number of bytes that were to be written, removes the temporary file, and leaves
the previous file intact.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import stat
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import FileWriteError, LandscapeError
from .write_failures import write_error, write_failure

#: Marker in the name of every temporary file written here (``.<name>.tmp-<random>``).
TEMP_MARKER = ".tmp-"
#: How often a busy lock is retried while waiting for it (seconds).
LOCK_POLL = 0.05


def write_atomic(path: str | os.PathLike, data: bytes | bytearray | memoryview, *, mode: int | None = None,
                 root: str | os.PathLike | None = None) -> Path:
    """Write ``data`` to ``path`` atomically, never through a link.

    Parameters
    ----------
    path : str or os.PathLike
        The file to create or replace. Its folder is created if missing; a folder or a target
        that is a symbolic link is refused.
    data : bytes, bytearray or memoryview
        The complete new content.
    mode : int or None
        Permission bits of the new file; default: those of the file it replaces, or
        ``0o666`` less the process umask for a new file.
    root : str, os.PathLike or None
        The folder the user chose, above ``path``: it (and what is above it) is taken as it is,
        links included, and every folder below it down to ``path``'s folder must not be a link.
        Default: only ``path``'s own folder is checked.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    FileWriteError
        A folder below ``root`` or the target is a link or not a regular file/folder, or the write
        failed (full disk, read-only or forbidden location); nothing was replaced.
    """
    path = Path(path)
    view = memoryview(data).cast("B")
    folder_fd = _open_folder(path.parent, root)
    tmp: str | None = None
    try:
        old_mode = _check_target(path, folder_fd)
        tmp, fd = _create_temporary(path.name, folder_fd)
        try:
            _write_all(fd, view)
            os.fchmod(fd, mode if mode is not None else old_mode if old_mode is not None else 0o666 & ~_umask())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path.name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        tmp = None
        with contextlib.suppress(OSError):  # some file systems cannot fsync a folder
            os.fsync(folder_fd)
    except OSError as exc:
        raise write_error(path, exc, len(view)) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder_fd)
        os.close(folder_fd)
    return path


def write_text(path: str | os.PathLike, text: str, *, mode: int | None = None,
               root: str | os.PathLike | None = None) -> Path:
    """Write ``text`` encoded as UTF-8 with :func:`write_atomic`.

    Parameters
    ----------
    path, mode, root
        As for :func:`write_atomic`.
    text : str
        The complete new content.

    Returns
    -------
    Path
        ``path``.
    """
    return write_atomic(path, text.encode("utf-8"), mode=mode, root=root)


def write_json(path: str | os.PathLike, value: Any, *, indent: int | None = 2, sort_keys: bool = False,
               mode: int | None = None, root: str | os.PathLike | None = None) -> Path:
    """Write ``value`` as JSON text and a final newline with :func:`write_atomic`.

    Parameters
    ----------
    path, mode, root
        As for :func:`write_atomic`.
    value : Any
        Anything :func:`json.dumps` accepts.
    indent, sort_keys
        Passed to :func:`json.dumps`.

    Returns
    -------
    Path
        ``path``.
    """
    return write_text(path, json.dumps(value, indent=indent, sort_keys=sort_keys) + "\n", mode=mode, root=root)


def discard(path: str | os.PathLike) -> None:
    """Remove a file if possible (nothing happens on a read-only disk or if it is absent).

    Parameters
    ----------
    path : str or os.PathLike
        The file (a link at ``path`` is removed, not followed).
    """
    with contextlib.suppress(OSError):
        os.unlink(path)


def is_temporary(name: str) -> bool:
    """True for the name of a temporary file left by :func:`write_atomic` (``.<name>.tmp-<random>``).

    Parameters
    ----------
    name : str
        A file name (no folder).

    Returns
    -------
    bool
    """
    return name.startswith(".") and TEMP_MARKER in name


def open_lock(path: str | os.PathLike, *, root: str | os.PathLike | None = None) -> int:
    """Open (creating it if missing) a lock file without following links; returns the descriptor.

    The file is opened for reading and writing but never truncated or written, so even a hard
    link planted at ``path`` loses nothing.

    Parameters
    ----------
    path : str or os.PathLike
        The lock file; its folder is created if missing.
    root : str, os.PathLike or None
        As for :func:`write_atomic`: the folders below it must not be links.

    Returns
    -------
    int
        An open file descriptor (the caller closes it).

    Raises
    ------
    FileWriteError
        ``path`` or its folder is a symbolic link or not a regular file, or it cannot be created.
    """
    path = Path(path)
    folder_fd = _open_folder(path.parent, root)
    try:
        return open_lock_at(folder_fd, path)
    finally:
        os.close(folder_fd)


def open_lock_at(folder_fd: int, path: str | os.PathLike, *, mode: int = 0o644) -> int:
    """:func:`open_lock` for a caller that has opened (and checked) the folder of ``path`` itself.

    Parameters
    ----------
    folder_fd : int
        A descriptor of the folder of ``path`` (the caller closes it).
    path : str or os.PathLike
        The lock file: its name is opened relative to ``folder_fd``; the whole path is named in errors.
    mode : int
        Permission bits of a new lock file.

    Returns
    -------
    int
        An open file descriptor (the caller closes it).

    Raises
    ------
    FileWriteError
        ``path`` is a symbolic link or not a regular file, or it cannot be created.
    """
    path = Path(path)
    try:
        fd = os.open(path.name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=folder_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _link_error(path, folder_fd) from None
        raise write_error(path, exc) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileWriteError(path, "is not a regular file; remove it (it is only a lock file)")
    return fd


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike, *, timeout: float, busy: Callable[[], LandscapeError],
                   root: str | os.PathLike | None = None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the lock file ``path`` (see :func:`open_lock`).

    Parameters
    ----------
    path : str or os.PathLike
        The lock file.
    timeout : float
        Seconds to wait for another holder to finish (0: do not wait).
    busy : Callable[[], LandscapeError]
        Builds the error raised when the lock is still held after ``timeout``.
    root : str, os.PathLike or None
        As for :func:`open_lock`.

    Yields
    ------
    None
        While the lock is held. The kernel releases the lock when the holder exits, even
        after SIGKILL.

    Raises
    ------
    LandscapeError
        ``busy()``, when the lock is still held after ``timeout`` seconds.
    FileWriteError
        The lock file cannot be opened (see :func:`open_lock`).
    """
    fd = open_lock(path, root=root)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise busy() from None
                time.sleep(LOCK_POLL)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _open_folder(folder: Path, root: str | os.PathLike | None = None) -> int:
    """Open ``folder`` (created if missing) never through a link; its descriptor.

    It and every folder below ``root`` down to it are opened one at a time relative to the one above.
    """
    if not folder.name:  # "/" or ".": nothing above it to check
        top, parts = folder, ()
    elif root is None:
        top, parts = folder.parent, (folder.name,)
    else:
        top, parts = Path(root), folder.relative_to(root).parts
    try:
        top.mkdir(parents=True, exist_ok=True)
        fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _folder_error(top, exc) from None
    for name in parts:
        top = top / name
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, dir_fd=fd)
            below = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            os.close(fd)
            raise _folder_error(top, exc) from None
        os.close(fd)
        fd = below
    return fd


def _folder_error(folder: Path, exc: OSError) -> FileWriteError:
    """The error for a folder that cannot be created or opened (a link, a file, a failed write)."""
    if folder.is_symlink():
        return FileWriteError(folder, "is a symbolic link; files are never written through links. Pass "
                                      f"the real folder ({os.path.realpath(folder)}) if you trust it")
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        return FileWriteError(folder, "is not a folder")
    cause, remedy = write_failure(exc)
    return FileWriteError(folder, f"cannot create or open this folder: {cause}. Nothing was written there; {remedy}")


def _check_target(path: Path, folder_fd: int) -> int | None:
    """Refuse a target that is a link or not a regular file; returns its permission bits (None if absent)."""
    try:
        st = os.lstat(path.name, dir_fd=folder_fd)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise _link_error(path, folder_fd)
    if not stat.S_ISREG(st.st_mode):
        raise FileWriteError(path, "exists and is not a regular file; move it away or choose another name")
    return stat.S_IMODE(st.st_mode)


def _link_error(path: Path, folder_fd: int) -> FileWriteError:
    try:
        to = f" (to {os.readlink(path.name, dir_fd=folder_fd)!r})"
    except OSError:
        to = ""
    return FileWriteError(path, f"is a symbolic link{to}; files are never written through links. Remove the "
                                "link if you did not put it there")


def _create_temporary(name: str, folder_fd: int) -> tuple[str, int]:
    """A new file ``.<name>.tmp-<random>`` (mode 0600), created exclusively, never through a link."""
    for _ in range(16):
        tmp = f".{name}{TEMP_MARKER}{secrets.token_hex(6)}"
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                                dir_fd=folder_fd)
        except FileExistsError:
            continue  # someone planted this name: draw another
    raise FileExistsError(errno.EEXIST, "no free temporary name", name)


def _write_all(fd: int, view: memoryview) -> None:
    """``os.write`` until every byte is written (it may write fewer bytes than asked)."""
    done = 0
    while done < len(view):
        done += os.write(fd, view[done:])


def _umask() -> int:
    """The process umask, read without changing it (Linux), else the usual 0o022."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022
