"""The base of every result: a frozen dataclass of numpy arrays plus the spec that produced it.

Every registered result round-trips through the HDF5 cache (:mod:`landscape.cache`): array
fields become datasets, everything else a JSON attribute. No pickles. Every result prints a
short summary (``repr``: the numbers a reader wants, never whole arrays) and renders as a small
HTML table in a notebook (``_repr_html_``).
"""
from __future__ import annotations

import dataclasses
import html
import json
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import numpy as np

from ..infra.registry import Registry

#: class name -> result class, for reading results back from the cache; discovery imports every
#: module of this package, so a result type is one module here
RESULT_TYPES: Registry[type] = Registry("result type", package="landscape.results")


def result_type(name: str) -> type | None:
    """The registered result class called ``name``, importing the modules that define results if needed.

    A cache can hold results of modules this process has not imported yet (a learned curve read
    back in a fresh process), so a name not yet registered imports every module of
    :mod:`landscape.results` first.

    Parameters
    ----------
    name
        The class name stored with the result.

    Returns
    -------
    type or None
        The class, or None when no module defines it.
    """
    return RESULT_TYPES.find(name)


def register(cls: type) -> type:
    """Register a result class (for the cache) and give it the summary ``repr``.

    Parameters
    ----------
    cls
        A dataclass subclass of :class:`Result`.

    Returns
    -------
    type
        The class itself.
    """
    RESULT_TYPES.add(cls.__name__, cls)
    cls.__repr__ = Result.__repr__  # the dataclass-generated repr would print whole arrays
    return cls


@dataclass(frozen=True)
class Result:
    """Base class: conversion to and from a flat record of arrays and JSON values, and summaries.

    Subclasses list their array fields in ``array_fields`` and the scalar numbers their summary
    shows first (fields or properties) in ``summary_fields``.

    Attributes
    ----------
    spec : Mapping[str, Any]
        What produced the result (function, options, digests of models and data); keyword-only,
        empty by default. Stored as a JSON attribute in the cache.
    """

    spec: Mapping[str, Any] = field(default_factory=dict, kw_only=True)

    array_fields: ClassVar[tuple[str, ...]] = ()
    summary_fields: ClassVar[tuple[str, ...]] = ()

    def to_record(self) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """Arrays (datasets) and JSON attributes of this result, for the cache.

        Returns
        -------
        tuple of dict
        """
        arrays, attrs = {}, {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in self.array_fields:
                if value is not None:
                    arrays[f.name] = np.asarray(value)
            else:
                attrs[f.name] = json.dumps(jsonable(value))
        return arrays, attrs

    @classmethod
    def from_record(cls, arrays: Mapping[str, np.ndarray], attrs: Mapping[str, str]) -> "Result":
        """The result stored as ``arrays`` and ``attrs`` (see :meth:`to_record`).

        Parameters
        ----------
        arrays, attrs
            As written by :meth:`to_record`.

        Returns
        -------
        Result
        """
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in cls.array_fields:
                kwargs[f.name] = arrays.get(f.name)
            elif f.name in attrs:
                kwargs[f.name] = from_json(json.loads(attrs[f.name]))
        return cls(**kwargs)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                if a is None or b is None or not np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True):
                    return False
            elif jsonable(a) != jsonable(b):
                return False
        return True

    __hash__ = None  # type: ignore[assignment]

    # ------------------------------------------------------------------ summaries
    def summary(self) -> dict[str, str]:
        """The numbers a reader wants, formatted.

        ``summary_fields`` first, then the other scalar fields, then the shapes of the arrays
        (never their contents).

        Returns
        -------
        dict
            name -> formatted value.
        """
        out: dict[str, str] = {}
        for name in self.summary_fields:
            out[name] = format_value(getattr(self, name))
        for f in dataclasses.fields(self):
            if f.name in out or f.name == "spec":
                continue
            value = getattr(self, f.name)
            if f.name in self.array_fields:
                if value is not None:
                    out[f.name] = "array" + str(tuple(np.shape(value))).replace(",)", ")")
            else:
                out[f.name] = format_value(value)
        evaluator = self.spec.get("evaluator", {}) if isinstance(self.spec, Mapping) else {}
        if isinstance(evaluator, Mapping) and evaluator.get("batchnorm_layers"):
            out["bn"] = str(evaluator.get("bn"))  # the BatchNorm mode can decide a barrier
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{k}={v}" for k, v in self.summary().items()) + ")"

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                       for k, v in self.summary().items())
        return f"<table><caption><b>{html.escape(type(self).__name__)}</b></caption>{rows}</table>"


def format_value(value: Any) -> str:
    """A short text for a summary: 4 significant digits for floats, sizes for containers.

    Parameters
    ----------
    value
        Any field or property value.

    Returns
    -------
    str
    """
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return repr(v) if not math.isfinite(v) else f"{v:.4g}"
    if isinstance(value, np.ndarray):
        if value.size <= 6:
            return "[" + ", ".join(format_value(v) for v in value.reshape(-1)) + "]"
        return "array" + str(tuple(value.shape)).replace(",)", ")")
    if isinstance(value, Mapping):
        keys = list(value)[:4]
        more = ", ..." if len(value) > 4 else ""
        return "{" + ", ".join(map(str, keys)) + more + "}" + f" ({len(value)})"
    if isinstance(value, (list, tuple)):
        if len(value) <= 6 and all(isinstance(v, (str, int, float)) for v in value):
            return "[" + ", ".join(format_value(v) if not isinstance(v, str) else v for v in value) + "]"
        return f"list({len(value)})"
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def jsonable(value: Any) -> Any:
    """``value`` as JSON-compatible data (arrays as lists, non-finite floats tagged).

    Parameters
    ----------
    value
        Numbers, strings, arrays, mappings, sequences.

    Returns
    -------
    Any
    """
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return {"__float__": repr(value)}
    return value


def from_json(value: Any) -> Any:
    """Inverse of :func:`jsonable` (arrays come back as lists).

    Parameters
    ----------
    value
        Parsed JSON.

    Returns
    -------
    Any
    """
    if isinstance(value, dict):
        if set(value) == {"__float__"}:
            return float(value["__float__"])
        return {k: from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json(v) for v in value]
    return value
