"""Cache keys: content addresses of computations, and the file names of cache entries."""
from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping
from urllib.parse import quote, unquote

from ..infra.errors import CacheError

#: The two kinds of entry: the metric arrays of a point set, and a finished result.
KINDS = ("points", "result")
SUFFIX = ".h5"
#: Longest entry file name (most file systems allow 255 bytes).
MAX_NAME = 250


def make_key(spec: Mapping[str, Any]) -> str:
    """Content address of a computation: SHA-256 of its canonical JSON spec.

    Parameters
    ----------
    spec : Mapping[str, Any]
        Everything that determines the computation (digests of the models and data, options).

    Returns
    -------
    str
        40 hexadecimal digits; equal specs (whatever the order of their keys) give equal keys.
    """
    text = json.dumps(spec, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def entry_name(kind: str, key: str) -> str:
    """File name of the entry ``key`` of ``kind``: ``points-<key>.h5`` with ``key`` percent-encoded.

    Parameters
    ----------
    kind : str
        One of :data:`KINDS` (``"points"`` or ``"result"``).
    key : str
        The entry's key (any text; usually from :func:`make_key`).

    Returns
    -------
    str
        ``<kind>-<percent-encoded key>.h5``, at most :data:`MAX_NAME` bytes.

    Raises
    ------
    CacheError
        ``key`` is empty or too long for a file name.
    """
    name = f"{kind}-{quote(key, safe='')}{SUFFIX}"
    if not key or len(name.encode()) > MAX_NAME:
        raise CacheError(f"cache key {key[:60]!r} is empty or too long (its file name would have "
                         f"{len(name.encode())} bytes, at most {MAX_NAME}); use make_key(spec) for long specs")
    return name


def parse_entry_name(name: str) -> tuple[str, str] | None:
    """``(kind, key)`` of an entry file name, or None for any other file.

    Parameters
    ----------
    name : str
        A file name (no folder), as :func:`entry_name` writes it.

    Returns
    -------
    tuple[str, str] or None
        The kind and the decoded key (the inverse of :func:`entry_name`), or None if ``name`` is
        not an entry file name.
    """
    kind, sep, rest = name.partition("-")
    if not sep or kind not in KINDS or not rest.endswith(SUFFIX) or len(rest) == len(SUFFIX):
        return None
    return kind, unquote(rest[:-len(SUFFIX)])
