"""Copy the entries of a format-1 cache file (one HDF5 file) into a cache folder.

From the shell::

python -m landscape.cache.upgrade old.h5 new-cache
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Sequence

from ..infra.errors import CacheError, LandscapeError
from .legacy import LegacyCache
from .store import Cache


def upgrade(old: str | os.PathLike, new: str | os.PathLike) -> int:
    """Copy every entry of the format-1 file ``old`` into the cache folder ``new``.

    Parameters
    ----------
    old : str or os.PathLike
        A format-1 cache file (left unchanged).
    new : str or os.PathLike
        A cache folder (created if missing); point sets with the same keys are merged, results replaced.

    Returns
    -------
    int
        The number of entries copied.

    Raises
    ------
    CacheError
        ``old`` is not a readable format-1 file, or ``new`` is a cache file rather than a folder.
    """
    source = LegacyCache(Path(old))
    target = Cache(new)
    if target.legacy is not None:
        raise CacheError(f"{new}: is a cache file itself; pass a new folder path")
    keys = source.keys()
    sizes = source.point_counts()
    for key, n in sizes.items():
        points = source.points(key, n)
        idx = points.done.nonzero()[0]
        target.add_points(key, n, idx, points.loss[idx], points.accuracy[idx], points.meta, force=True)
    for key in keys["results"]:
        result = source.load_result(key)
        if result is not None:
            target.save_result(key, result)
    return len(sizes) + len(keys["results"])


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m landscape.cache.upgrade OLD NEW``: copy a format-1 cache file into a cache folder.

    Parameters
    ----------
    argv : Sequence[str] or None
        The two arguments ``OLD NEW``; None reads them from ``sys.argv``.

    Returns
    -------
    int
        The exit status: 0 on success, 2 on a usage error or a :class:`LandscapeError`
        (printed as one line on standard error).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m landscape.cache.upgrade OLD_FILE NEW_FOLDER", file=sys.stderr)
        return 2
    try:
        count = upgrade(*args)
    except LandscapeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"copied {count} entries from {args[0]} into {args[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
