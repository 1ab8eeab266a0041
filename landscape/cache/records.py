"""The HDF5 layout of one cache entry (the same in a sealed entry file and in a format-1 group).

A point set::

    loss, accuracy   float64 (n,), NaN until computed
    done             uint8 (n,), 1 where a point has been computed
    attrs: meta      JSON of the caller's description (e.g. the label of the computation)

A result: one dataset per array field of the result dataclass, attributes holding the other
fields as JSON, ``type`` (the class name) and ``complete``. Nothing is ever pickled.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..infra.errors import CacheError
from ..results.base import Result, result_type

#: Arrays larger than this many elements are stored gzip-compressed.
COMPRESS_ABOVE = 4096


@dataclass
class Points:
    """The metric arrays of a point set of ``n`` points.

    Attributes
    ----------
    loss, accuracy : np.ndarray
        float64 of shape ``(n,)``; NaN where a point is not computed yet.
    done : np.ndarray
        bool of shape ``(n,)``: True where a point has been computed.
    meta : dict
        The caller's description of the computation (stored as JSON).
    """

    loss: np.ndarray
    accuracy: np.ndarray
    done: np.ndarray
    meta: dict

    @classmethod
    def empty(cls, n: int, meta: Mapping[str, Any] | None = None) -> "Points":
        """``n`` points, none computed.

        Parameters
        ----------
        n : int
            The number of points.
        meta : Mapping[str, Any] or None
            The description stored with the set (copied); None for none.

        Returns
        -------
        Points
            NaN metrics and ``done`` all False.
        """
        return cls(np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, dtype=bool), dict(meta or {}))

    def update(self, idx: np.ndarray, loss: np.ndarray, acc: np.ndarray) -> None:
        """Mark points ``idx`` computed with the given values.

        Parameters
        ----------
        idx : np.ndarray
            Indices of the computed points.
        loss, acc : np.ndarray
            Their loss and accuracy, aligned with ``idx``.
        """
        self.loss[idx], self.accuracy[idx], self.done[idx] = loss, acc, True


def read_points(group: Any, n: int, where: str) -> Points:
    """The point set stored in ``group``; ``where`` names it in errors.

    Parameters
    ----------
    group : h5py.Group
        The entry's group (root of a sealed entry file, or a format-1 group).
    n : int
        The number of points the set must have.
    where : str
        Names the entry in errors.

    Returns
    -------
    Points
        The stored arrays (loss and accuracy as float64) and description.

    Raises
    ------
    CacheError
        The stored set does not have ``n`` points.
    """
    stored = group["done"].shape
    if stored != (n,):
        raise CacheError(f"{where}: holds {stored[0] if stored else 0} points, expected {n}; the cache is "
                         "inconsistent: delete this entry")
    meta = json.loads(str(group.attrs.get("meta", "{}")))
    return Points(group["loss"][...].astype(np.float64), group["accuracy"][...].astype(np.float64),
                  group["done"][...].astype(bool), meta)


def write_points(group: Any, points: Points) -> None:
    """Store ``points`` in the empty ``group``.

    Parameters
    ----------
    group : h5py.Group
        An empty group of a file open for writing.
    points : Points
        The arrays and description to store (``done`` as uint8, ``meta`` as JSON).
    """
    group.create_dataset("loss", data=points.loss)
    group.create_dataset("accuracy", data=points.accuracy)
    group.create_dataset("done", data=points.done.astype(np.uint8))
    group.attrs["meta"] = json.dumps(points.meta, sort_keys=True, default=str)


def read_result(group: Any, where: str) -> Result | None:
    """The result stored in ``group``, or None if it is not marked complete.

    Parameters
    ----------
    group : h5py.Group
        The entry's group.
    where : str
        Names the entry in errors.

    Returns
    -------
    Result or None
        Rebuilt with ``from_record`` of the stored class, or None if not marked complete.

    Raises
    ------
    CacheError
        The stored type is not a known result class.
    """
    if not group.attrs.get("complete", False):
        return None
    cls = result_type(str(group.attrs["type"]))
    if cls is None:
        raise CacheError(f"{where}: unknown result type {group.attrs['type']!r} (written by another version?)")
    arrays = {name: group[name][...] for name in group.keys()}
    attrs = {k: str(v) for k, v in group.attrs.items() if k not in ("type", "complete", "key", "kind",
                                                                        "format_version")}
    return cls.from_record(arrays, attrs)


def write_result(group: Any, result: Result) -> None:
    """Store ``result`` (marked complete) in the empty ``group``.

    Parameters
    ----------
    group : h5py.Group
        An empty group of a file open for writing.
    result : Result
        Stored through its ``to_record`` (arrays gzip-compressed above :data:`COMPRESS_ABOVE`
        elements); never pickled.
    """
    arrays, attrs = result.to_record()
    for name, arr in arrays.items():
        arr = np.asarray(arr)
        group.create_dataset(name, data=arr, **({"compression": "gzip"} if arr.size > COMPRESS_ABOVE else {}))
    for name, value in attrs.items():
        group.attrs[name] = value
    group.attrs["type"] = type(result).__name__
    group.attrs["complete"] = True
