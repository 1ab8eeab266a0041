"""The HDF5 result cache: a folder of sealed entry files, resumable, crash-safe, one writer at a time.

Layout of a cache folder::

    landscape-cache.json        format marker (written first)
    points-<key>.h5             metric arrays of one point set (see :mod:`.records`)
    result-<key>.h5             one finished result
    .lock                       the writers' lock file

Every entry is its own sealed HDF5 file (:mod:`.sealed`: SHA-256 of its content in the user
block, checked on every read), built in memory and written with
:func:`landscape.infra.files.write_atomic` (unique temporary name, fsync, rename, never
through a link). The folder is the index: an entry appears, or changes, by one atomic rename.
Reading or writing one entry therefore costs the same whatever the number of entries; a
process killed at any moment leaves every entry either old or new, both readable, and at
most a temporary file, which the next writer removes. Writers hold an exclusive lock on
``.lock`` (a second writer waits up to ``lock_timeout`` seconds, then fails clearly);
readers take no lock. Pending point values are flushed at most every ``flush_interval``
seconds, so an interrupted computation loses only the last moments of work and resumes
from the rest. Nothing is ever pickled.

A path that is a file is a cache of format 1 (one HDF5 file for all entries): it is read,
not extended (:mod:`.legacy`). Every file is read through :mod:`landscape.infra.reading`: an
entry, marker or cache path that is a FIFO, a device, a folder or far too large is refused with a
:class:`CacheError` naming it, never read.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from ..infra.errors import CacheError
from ..infra.files import discard, exclusive_lock, is_temporary, write_atomic, write_json
from ..infra.reading import load_json, prefixed, read_file
from ..results.base import Result
from .keys import entry_name, make_key, parse_entry_name
from .legacy import LegacyCache
from .records import Points, read_points, read_result, write_points, write_result
from .sealed import build, parsed, read_bytes

__all__ = ["Cache", "make_key"]

FORMAT_VERSION = "2"
MARKER = "landscape-cache.json"
LOCK = ".lock"

#: queued points of one key: (indices, loss, accuracy, number of points, meta)
Pending = tuple[np.ndarray, np.ndarray, np.ndarray, int, dict]


class Cache:
    """A folder of HDF5 entries holding point metrics and results, safe against kills and concurrent writers.

    Parameters
    ----------
    path : str or os.PathLike
        The cache folder (created on the first write), or a format-1 cache file (read only).
    lock_timeout : float
        Seconds a writer waits for another writer to finish before failing.
    flush_interval : float
        Queued points are written when this many seconds have passed since the last write.
    root : str, os.PathLike or None
        The folder the user chose, above ``path`` (see :func:`landscape.infra.files.write_atomic`):
        every folder below it down to the cache folder must not be a link. Default: only the
        cache folder itself must not be one.

    Raises
    ------
    CacheError
        ``path`` is a folder that is not a cache, holds another cache format, is neither a folder
        nor a regular file, or is an unreadable format-1 file.
    """

    def __init__(self, path: str | os.PathLike, *, lock_timeout: float = 600.0, flush_interval: float = 1.0,
                 root: str | os.PathLike | None = None):
        self.path = Path(path)
        self.root = root
        self.lock_timeout = lock_timeout
        self.flush_interval = flush_interval
        self._pending: dict[str, list[Pending]] = {}
        self._last_flush = time.monotonic()
        self._swept = False  # temporary files of killed writers removed (once per instance)
        #: the format-1 file at ``path``, if it is one
        self.legacy: LegacyCache | None = None
        if self.path.is_dir():
            self._check_folder()
        elif os.path.lexists(self.path):  # a file (or a FIFO, ...: refused there)
            self.legacy = LegacyCache(self.path)

    @property
    def lock_path(self) -> Path:
        """The writers' lock file."""
        return self.path / LOCK

    # ------------------------------------------------------------------ reading
    def _check_folder(self) -> None:
        marker = self.path / MARKER
        try:
            info = load_json(read_file(marker, "JSON file", prefixed(CacheError)))
            version = str(info["version"])
        except FileNotFoundError:
            others = [p for p in os.listdir(self.path) if not p.startswith(".")]
            if others:
                raise CacheError(f"{self.path}: is a folder but not a landscape cache (no {MARKER}); pass "
                                 "an empty or new folder as the cache") from None
            return  # an empty folder: a new cache
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise CacheError(f"{marker}: unreadable cache marker ({exc}); move the cache away to start "
                             "a fresh one") from None
        if version != FORMAT_VERSION:
            raise CacheError(f"{self.path}: cache format {version} is not supported (this version writes "
                             f"{FORMAT_VERSION}); use a new cache path")

    @contextmanager
    def _entry(self, kind: str, key: str) -> Iterator[Any]:
        """The open root group of entry ``key`` (None if absent), after its seal is checked."""
        path = self.path / entry_name(kind, key)
        data = read_bytes(path, follow_links=False)
        if data is None:
            yield None
            return
        with parsed(data, path) as f:
            if str(f.attrs.get("kind")) != kind or str(f.attrs.get("key")) != key:
                raise CacheError(f"{path}: holds entry {f.attrs.get('kind')}/{f.attrs.get('key')}, not "
                                 f"{kind}/{key} (renamed by hand?); delete it to recompute")
            yield f

    def _stored_points(self, key: str, n: int) -> Points | None:
        if self.legacy is not None:
            return self.legacy.points(key, n)
        with self._entry("points", key) as f:
            return None if f is None else read_points(f, n, str(self.path / entry_name("points", key)))

    def points(self, key: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(loss, accuracy, done)`` of the point set ``key`` of ``n`` points; all NaN / False if unknown.

        Points queued but not yet flushed are included.

        Parameters
        ----------
        key : str
            The point set's key.
        n : int
            Its number of points.

        Returns
        -------
        loss, accuracy : np.ndarray
            float64 of shape ``(n,)``, NaN where not computed.
        done : np.ndarray
            bool of shape ``(n,)``.

        Raises
        ------
        CacheError
            The stored entry is damaged or does not have ``n`` points.
        """
        stored = self._stored_points(key, n) or Points.empty(n)
        for idx, loss, acc, _, _ in self._pending.get(key, []):
            stored.update(idx, loss, acc)
        return stored.loss, stored.accuracy, stored.done

    def load_result(self, key: str) -> Result | None:
        """The stored (complete) result for ``key``, or None.

        Parameters
        ----------
        key : str
            The result's key.

        Returns
        -------
        Result or None
            The stored result, or None if there is none.

        Raises
        ------
        CacheError
            The stored entry is damaged or of an unknown result type.
        """
        if self.legacy is not None:
            return self.legacy.load_result(key)
        with self._entry("result", key) as f:
            return None if f is None else read_result(f, str(self.path / entry_name("result", key)))

    def keys(self) -> dict[str, list[str]]:
        """Keys of stored point sets (``"points"``) and results (``"results"``).

        Returns
        -------
        dict[str, list[str]]
            ``{"points": [...], "results": [...]}``, each sorted.
        """
        if self.legacy is not None:
            return self.legacy.keys()
        found: dict[str, list[str]] = {"points": [], "result": []}
        if self.path.is_dir():
            for name in os.listdir(self.path):
                parsed_name = parse_entry_name(name)
                if parsed_name is not None:
                    found[parsed_name[0]].append(parsed_name[1])
        return {"points": sorted(found["points"]), "results": sorted(found["result"])}

    # ------------------------------------------------------------------ writing
    def add_points(self, key: str, n: int, idx: np.ndarray, loss: np.ndarray, acc: np.ndarray,
                   meta: Mapping[str, Any] | None = None, *, force: bool = False) -> None:
        """Queue computed points of the set ``key`` (``n`` points in all).

        They are written when ``flush_interval`` seconds have passed since the last write, or
        at once with ``force``.

        Parameters
        ----------
        key : str
            The point set's key.
        n : int
            Its number of points.
        idx : np.ndarray
            Indices of the computed points.
        loss, acc : np.ndarray
            Their loss and accuracy, aligned with ``idx``.
        meta : Mapping[str, Any] or None
            Description stored with the set when its entry is first written.
        force : bool
            Write now, whatever the time since the last write.
        """
        self._pending.setdefault(key, []).append(
            (np.asarray(idx), np.asarray(loss, dtype=np.float64), np.asarray(acc, dtype=np.float64),
             n, dict(meta or {})))
        if force or time.monotonic() - self._last_flush >= self.flush_interval:
            self.flush()

    def flush(self) -> None:
        """Write all queued points: one entry file per point set, merged with what is stored.

        On failure the queued points are kept for a later attempt.
        """
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        try:
            with self.writer_lock():
                for key, items in pending.items():
                    n, meta = items[0][3], items[0][4]
                    points = self._stored_points(key, n) or Points.empty(n, meta)
                    for idx, loss, acc, _, _ in items:
                        points.update(idx, loss, acc)
                    self._write_entry("points", key, lambda f, p=points: write_points(f, p))
        except BaseException:
            for key, items in pending.items():  # keep them for a later attempt
                self._pending.setdefault(key, [])[:0] = items
            raise
        self._last_flush = time.monotonic()

    def save_result(self, key: str, result: Result) -> None:
        """Store ``result`` (complete) under ``key``, replacing any earlier one.

        Parameters
        ----------
        key : str
            The result's key.
        result : Result
            Any registered result dataclass.
        """
        with self.writer_lock():
            self._write_entry("result", key, lambda f: write_result(f, result))

    def _write_entry(self, kind: str, key: str, fill: Callable[[Any], None]) -> None:
        def content(f: Any) -> None:
            f.attrs["format_version"] = FORMAT_VERSION
            f.attrs["kind"] = kind
            f.attrs["key"] = key
            fill(f)

        write_atomic(self.path / entry_name(kind, key), build(content), root=self.root)

    @contextmanager
    def writer_lock(self) -> Iterator[None]:
        """Hold the writers' lock (waiting up to ``lock_timeout`` seconds for another writer).

        On the first write the folder and its format marker are created and temporary files
        left by killed writers are removed.

        Yields
        ------
        None
            While the lock is held.

        Raises
        ------
        CacheError
            The cache is a format-1 file, or another process held the lock for too long.
        FileWriteError
            The folder cannot be written (full disk, read-only location, a link).
        """
        if self.legacy is not None:
            raise self.legacy.refuse_writes()

        def busy() -> CacheError:
            return CacheError(f"{self.path}: another process has been writing this cache for more than "
                              f"{self.lock_timeout:.0f} s; wait for it to finish or use another cache folder")

        with exclusive_lock(self.lock_path, timeout=self.lock_timeout, busy=busy, root=self.root):
            if not self._swept:
                for name in os.listdir(self.path):
                    if is_temporary(name):  # only writers create them, and no other writer runs now
                        discard(self.path / name)
                if not (self.path / MARKER).exists():
                    write_json(self.path / MARKER, {"format": "landscape-fl HDF5 cache", "version": FORMAT_VERSION,
                                                    "layout": "one sealed HDF5 file per entry"}, root=self.root)
                self._swept = True
            yield
