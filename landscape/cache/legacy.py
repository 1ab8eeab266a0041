"""Caches of format 1: one HDF5 file holding every entry (``/points/<key>``, ``/results/<key>``).

Such a file is still read (its whole-file seal checked, as when it was written; a file without
a seal is refused, since its numbers cannot be checked), but never extended: adding to it cost
a copy of the whole file per write. :mod:`.upgrade` copies its
entries into a cache folder::

    python -m landscape.cache.upgrade old.h5 new-cache
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..infra.errors import CacheError
from ..results.base import Result
from .records import Points, read_points, read_result
from .sealed import corrupt, parsed, read_bytes

FORMAT_VERSION = "1"


class LegacyCache:
    """Read-only access to a format-1 cache file.

    Parameters
    ----------
    path : Path
        The cache file; its seal is checked on every read (a file without one is refused).

    Raises
    ------
    CacheError
        The file is not a regular file, unreadable, damaged, without a seal, or of another format
        version.
    """

    def __init__(self, path: Path):
        self.path = path
        with self._open() as f:
            version = f.attrs.get("format_version")
            if version is not None and str(version) != FORMAT_VERSION:
                raise CacheError(f"{path}: cache format {version} is not supported; use a new cache path")

    @contextmanager
    def _open(self) -> Iterator[Any]:
        data = read_bytes(self.path)
        if data is None:
            raise corrupt(self.path, "the file disappeared")
        with parsed(data, self.path) as f:
            yield f

    def points(self, key: str, n: int) -> Points | None:
        """The point set ``key``, or None.

        Parameters
        ----------
        key : str
            The entry's key.
        n : int
            The number of points the set must have.

        Returns
        -------
        Points or None
            The stored arrays, or None if there is no such entry.

        Raises
        ------
        CacheError
            The stored set does not have ``n`` points.
        """
        with self._open() as f:
            group = f.get(f"points/{key}")
            return None if group is None else read_points(group, n, f"{self.path}: entry {key}")

    def load_result(self, key: str) -> Result | None:
        """The complete result ``key``, or None.

        Parameters
        ----------
        key : str
            The entry's key.

        Returns
        -------
        Result or None
            The stored result, or None if absent or not marked complete.
        """
        with self._open() as f:
            group = f.get(f"results/{key}")
            return None if group is None else read_result(group, f"{self.path}: result {key}")

    def keys(self) -> dict[str, list[str]]:
        """Keys of stored point sets and results.

        Returns
        -------
        dict[str, list[str]]
            ``{"points": [...], "results": [...]}``, each sorted.
        """
        with self._open() as f:
            return {g: sorted(f[g].keys()) if g in f else [] for g in ("points", "results")}

    def point_counts(self) -> dict[str, int]:
        """The number of points of every stored point set.

        Returns
        -------
        dict[str, int]
            Key of each point set -> its number of points.
        """
        with self._open() as f:
            return {key: f[f"points/{key}/done"].shape[0] for key in (f["points"].keys() if "points" in f else [])}

    def refuse_writes(self) -> CacheError:
        """The error for an attempt to add to this file.

        Returns
        -------
        CacheError
            Saying how to upgrade the file into a cache folder (the caller raises it).
        """
        return CacheError(f"{self.path}: this cache file was written by an earlier version (one HDF5 file for "
                          "all entries) and can be read but not extended; copy its entries into a cache folder "
                          f"with 'python -m landscape.cache.upgrade {self.path} NEW' and use NEW, or pass a new "
                          "cache path")
