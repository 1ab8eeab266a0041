"""HDF5 result cache: content-addressed, resumable, crash-safe, one writer at a time.

Layout of the file::

    /points/<key>/loss, accuracy   float64, NaN until computed
    /points/<key>/done             uint8, 1 where a point has been computed
    /results/<key>/...             a result dataclass: arrays as datasets, the rest as JSON attrs

Every write is copy-on-write: the file is copied to a temporary file beside it, changed,
flushed, fsynced and renamed over the original while an exclusive lock on ``<file>.lock`` is
held. A process killed at any moment therefore leaves either the old or the new file, both
readable, and never a half-written one (its temporary file is removed by the next writer).
Pending point values are flushed at most every ``flush_interval`` seconds, so an interrupted
computation loses only the last moments of work and resumes from the rest. Nothing is ever
pickled.

The file is sealed: its first ``USERBLOCK`` bytes (an HDF5 user block, ignored by HDF5)
hold the SHA-256 of the rest, checked before HDF5 parses the file. A damaged or truncated
file therefore gives :class:`CacheError`, never silently wrong numbers, nor the crash or
endless loop that HDF5 itself can fall into on damaged metadata.
"""
from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Mapping

import numpy as np

from ..infra.files import discard, write_failure_reason
from ..infra.errors import CacheError, LandscapeError
from ..results.base import RESULT_TYPES, Result

FORMAT_VERSION = "1"
USERBLOCK = 512
SEAL = b"landscape-cache sha256 "


def make_key(spec: Mapping[str, Any]) -> str:
    """Content address of a computation: SHA-256 of its canonical JSON spec."""
    text = json.dumps(spec, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _content_digest(fh: BinaryIO) -> bytes:
    """SHA-256 (hex) of an open file's bytes after the user block."""
    h = hashlib.sha256()
    fh.seek(USERBLOCK)
    for chunk in iter(lambda: fh.read(1 << 20), b""):
        h.update(chunk)
    return h.hexdigest().encode()


def _seal(path: Path) -> None:
    """Write the content digest into the user block."""
    with open(path, "r+b") as fh:
        digest = _content_digest(fh)
        fh.seek(0)
        fh.write(SEAL + digest)


class Cache:
    """An HDF5 file holding point metrics and results, safe against kills and concurrent writers."""

    def __init__(self, path: str | os.PathLike, *, lock_timeout: float = 600.0,
                 flush_interval: float = 1.0):
        self.path = Path(path)
        self.lock_timeout = lock_timeout
        self.flush_interval = flush_interval
        self._pending: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray, int, dict]]] = {}
        self._last_flush = time.monotonic()
        if self.path.exists():
            self._check_readable()

    # ------------------------------------------------------------------ reading
    def _check_readable(self) -> None:
        with self._open_read() as f:
            version = f.attrs.get("format_version")
            if version is not None and str(version) != FORMAT_VERSION:
                raise CacheError(f"{self.path}: cache format {version} is not supported "
                                 f"(this version writes {FORMAT_VERSION}); use a new cache file")

    @contextmanager
    def _open_read(self) -> Iterator[Any]:
        import h5py

        # One open file for the seal check and for HDF5: a writer may rename a new version
        # over the path at any moment, and both must see the same version.
        try:
            fh = open(self.path, "rb")
        except OSError as exc:
            raise self._corrupt(exc) from None
        try:
            head = fh.read(len(SEAL) + 64)
            if head.startswith(SEAL) and head[len(SEAL):] != _content_digest(fh):
                raise self._corrupt("its content does not match the SHA-256 sealed into it")
            fh.seek(0)
            try:
                f = h5py.File(fh, "r", locking=False)
            except OSError as exc:
                raise self._corrupt(exc) from None
            try:
                yield f
            except LandscapeError:
                raise
            except Exception as exc:  # h5py raises assorted errors on damaged metadata
                raise self._corrupt(exc) from None
            finally:
                f.close()
        finally:
            fh.close()

    def _corrupt(self, detail: object) -> CacheError:
        return CacheError(f"{self.path}: not a readable HDF5 cache (corrupt or truncated?): {detail}. "
                          "Move it away to start a fresh cache.")

    def points(self, key: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(loss, accuracy, done)`` for a point set; all NaN / False if unknown."""
        loss = np.full(n, np.nan)
        acc = np.full(n, np.nan)
        done = np.zeros(n, dtype=bool)
        if self.path.exists():
            with self._open_read() as f:
                grp = f.get(f"points/{key}")
                if grp is not None:
                    if grp["done"].shape != (n,):
                        raise CacheError(f"{self.path}: entry {key} has {grp['done'].shape[0]} points, "
                                         f"expected {n}; the cache is inconsistent, delete the entry or file")
                    loss[:] = grp["loss"][...]
                    acc[:] = grp["accuracy"][...]
                    done[:] = grp["done"][...].astype(bool)
        for idx, l, a, _, _ in self._pending.get(key, []):
            loss[idx], acc[idx], done[idx] = l, a, True
        return loss, acc, done

    def load_result(self, key: str) -> Result | None:
        """The stored result for ``key``, or None."""
        if not self.path.exists():
            return None
        with self._open_read() as f:
            grp = f.get(f"results/{key}")
            if grp is None or not grp.attrs.get("complete", False):
                return None
            cls = RESULT_TYPES.get(str(grp.attrs["type"]))
            if cls is None:
                raise CacheError(f"{self.path}: result {key} has unknown type {grp.attrs['type']!r}")
            arrays = {name: grp[name][...] for name in grp.keys()}
            attrs = {k: str(v) for k, v in grp.attrs.items() if k not in ("type", "complete")}
            return cls.from_record(arrays, attrs)

    def keys(self) -> dict[str, list[str]]:
        """Keys of stored point sets and results."""
        if not self.path.exists():
            return {"points": [], "results": []}
        with self._open_read() as f:
            return {g: sorted(f[g].keys()) if g in f else [] for g in ("points", "results")}

    # ------------------------------------------------------------------ writing
    def add_points(self, key: str, n: int, idx: np.ndarray, loss: np.ndarray, acc: np.ndarray,
                   meta: Mapping[str, Any] | None = None, *, force: bool = False) -> None:
        """Queue computed points; written when ``flush_interval`` has passed (or ``force``)."""
        self._pending.setdefault(key, []).append(
            (np.asarray(idx), np.asarray(loss, dtype=np.float64), np.asarray(acc, dtype=np.float64),
             n, dict(meta or {})))
        if force or time.monotonic() - self._last_flush >= self.flush_interval:
            self.flush()

    def flush(self) -> None:
        """Write all queued points."""
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        try:
            with self._writing() as f:
                for key, items in pending.items():
                    n = items[0][3]
                    grp = f.get(f"points/{key}")
                    if grp is None:
                        grp = f.create_group(f"points/{key}")
                        grp.create_dataset("loss", data=np.full(n, np.nan))
                        grp.create_dataset("accuracy", data=np.full(n, np.nan))
                        grp.create_dataset("done", data=np.zeros(n, dtype=np.uint8))
                        grp.attrs["meta"] = json.dumps(items[0][4], sort_keys=True, default=str)
                    for idx, l, a, _, _ in items:
                        order = np.argsort(idx)
                        idx, l, a = idx[order], l[order], a[order]
                        loss, acc, done = grp["loss"][...], grp["accuracy"][...], grp["done"][...]
                        loss[idx], acc[idx], done[idx] = l, a, 1
                        grp["loss"][...] = loss
                        grp["accuracy"][...] = acc
                        grp["done"][...] = done
        except BaseException:
            for key, items in pending.items():  # keep them for a later attempt
                self._pending.setdefault(key, [])[:0] = items
            raise
        self._last_flush = time.monotonic()

    def save_result(self, key: str, result: Result) -> None:
        """Store a result (complete) under ``key``, replacing any earlier one."""
        arrays, attrs = result.to_record()
        with self._writing() as f:
            if f"results/{key}" in f:
                del f[f"results/{key}"]
            grp = f.create_group(f"results/{key}")
            for name, arr in arrays.items():
                arr = np.asarray(arr)
                kwargs = {"compression": "gzip"} if arr.size > 4096 else {}
                grp.create_dataset(name, data=arr, **kwargs)
            for name, value in attrs.items():
                grp.attrs[name] = value
            grp.attrs["type"] = type(result).__name__
            grp.attrs["complete"] = True

    @contextmanager
    def _writing(self) -> Iterator[Any]:
        import h5py

        with self._lock():
            for stale in self.path.parent.glob(f".{glob.escape(self.path.name)}.tmp-*"):  # of a killed writer
                stale.unlink(missing_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
            try:
                if self.path.exists():
                    self._check_readable()
                    shutil.copyfile(self.path, tmp)
                new = {} if tmp.exists() else {"userblock_size": USERBLOCK}
                f = h5py.File(tmp, "a", locking=False, **new)
                try:
                    sealed = f.userblock_size == USERBLOCK  # older files have no user block
                    f.attrs["format_version"] = FORMAT_VERSION
                    yield f
                finally:
                    f.close()
                if sealed:
                    _seal(tmp)
                with open(tmp, "rb") as fh:
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path)
            except OSError as exc:
                discard(tmp)
                raise CacheError(f"{self.path}: cannot write the cache: {write_failure_reason(exc)}. "
                                 "Earlier cached results are intact.") from None
            except LandscapeError:
                discard(tmp)
                raise
            except Exception as exc:  # damaged metadata met while updating the copy
                discard(tmp)
                raise self._corrupt(exc) from None
            except BaseException:
                discard(tmp)
                raise

    @contextmanager
    def _lock(self) -> Iterator[None]:
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise CacheError(f"{self.path}: cannot create the lock file {lock_path}: {exc.strerror}. "
                             "Is the location writable?") from None
        try:
            deadline = time.monotonic() + self.lock_timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise CacheError(f"{self.path}: another process has been writing this cache for "
                                         f"more than {self.lock_timeout:.0f} s; wait for it to finish or "
                                         "use another cache file") from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # closing releases the lock
