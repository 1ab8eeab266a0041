"""Checking one option value against its annotation, range and choices (the validation of :mod:`.options`).

:func:`check_value` accepts ``int``, ``float``, ``bool``, ``str``, ``Literal[...]``, ``X | None``,
``list[X]``, ``tuple[X, Y, ...]``, ``dict[str, Any]``, ``Callable``, any other class (an
``isinstance`` test), ``Any`` and unions of these; numbers must be finite and within the field's
bounds (``ge``/``gt``/``le``/``lt``), strings among its ``choices`` when it declares them. Every
refusal is a one-line :class:`~landscape.infra.errors.ConfigError` naming the option.
"""
from __future__ import annotations

import collections.abc
import difflib
import math
import types
import typing
from typing import Any, Literal, Mapping, Sequence, Union

import numpy as np

from .errors import ConfigError

RANGE_KEYS = ("ge", "gt", "le", "lt")
_MAX_DEPTH = 8  # nesting of dict/list option values (a deeply nested value is refused)


def did_you_mean(key: str, valid: Sequence[str] | Mapping[str, Any]) -> str:
    """``" (did you mean 'x'?)"`` for the closest valid name, or ``""``.

    Parameters
    ----------
    key : str
        The unknown name.
    valid : Sequence[str] | Mapping[str, Any]
        The valid names.

    Returns
    -------
    str
        The suggestion, ready to append to a message.
    """
    close = difflib.get_close_matches(str(key), list(valid), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def choice_names(meta: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The names a field's ``choices`` allow now (a registry's live names; a callable is called).

    Parameters
    ----------
    meta : Mapping[str, Any]
        The field's metadata.

    Returns
    -------
    tuple[str, ...] or None
        None when the field declares no choices.
    """
    choices = meta.get("choices")
    if choices is None:
        return None
    return tuple(choices() if callable(choices) else choices)


def check_value(name: str, value: Any, tp: Any, meta: Mapping[str, Any]) -> Any:
    """Validate one value against an annotation and the range and choices of ``meta``.

    Parameters
    ----------
    name : str
        Name used in the message.
    value : Any
        The value.
    tp : Any
        The field's annotation.
    meta : Mapping[str, Any]
        The field's metadata (bounds ``ge``/``gt``/``le``/``lt``, ``choices``).

    Returns
    -------
    Any
        The value, normalised (numpy scalars to Python, tuples to lists for a ``list``
        annotation, ints to floats where a float is expected).

    Raises
    ------
    ConfigError
        With one line naming the option, what is expected and what was given.
    """
    ok, out = _match(value, tp, 0)
    if not ok:
        raise ConfigError(f"{name} must be {describe_type(tp)}, got {_show(value)}")
    where = _non_finite(out)
    if where is not None:
        raise ConfigError(f"{name}{where} must be a finite number, got {_show(value)}")
    numbers = out if isinstance(out, (list, tuple)) else [out]
    for x in numbers:
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            bad = _out_of_range(x, meta)
            if bad:
                raise ConfigError(f"{name} must be {bad}, got {_show(value)}")
    names = choice_names(meta)
    if names is not None and isinstance(out, str) and out not in names:
        raise ConfigError(f"{name} must be one of {', '.join(map(repr, names))}, got {_show(value)}"
                          f"{did_you_mean(out, names)}")
    return out


def describe_range(meta: Mapping[str, Any]) -> str:
    """The bounds of ``meta`` as text, e.g. ``"> 0 and <= 100"`` (``""`` when unbounded).

    Parameters
    ----------
    meta : Mapping[str, Any]
        Field metadata.

    Returns
    -------
    str
        The bounds joined by "and".
    """
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    return " and ".join(f"{signs[k]} {meta[k] if isinstance(meta[k], int) else format(meta[k], 'g')}"
                        for k in RANGE_KEYS if k in meta)


def describe_type(tp: Any) -> str:
    """A readable name of an annotation (``"an integer"``, ``"one of 'a', 'b'"``, ...).

    Parameters
    ----------
    tp : Any
        The annotation.

    Returns
    -------
    str
        The description used in error messages and help.
    """
    if tp is Any:
        return "any value"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(describe_type(a) for a in args)
    if origin is list:
        return f"a list of {_plural(args[0])}" if args else "a list"
    if origin is tuple:
        return f"{len(args)} {_plural(args[0])}" if len(set(args)) == 1 else f"a tuple of {len(args)} values"
    if origin is dict or tp is dict:
        return "a dict"
    if origin is collections.abc.Callable:
        return "a callable"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string",
            type(None): "None"}.get(tp, getattr(tp, "__name__", str(tp)))


def _plural(tp: Any) -> str:
    """``"integers"`` for ``int``: the description of ``tp`` without its article, plural."""
    return f"{describe_type(tp).removeprefix('a ').removeprefix('an ')}s"


def _match(value: Any, tp: Any, depth: int) -> tuple[bool, Any]:
    """(whether ``value`` fits ``tp``, the normalised value)."""
    if depth > _MAX_DEPTH:
        return False, value
    if tp is Any:
        return not _too_deep(value, _MAX_DEPTH - depth), value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        for arm in args:
            ok, out = _match(value, arm, depth)
            if ok:
                return True, out
        return False, value
    if origin is Literal:
        for a in args:
            if type(value) is type(a) and value == a:
                return True, value
        return False, value
    if tp is type(None):
        return value is None, value
    if tp is bool:
        return isinstance(value, (bool, np.bool_)), bool(value) if isinstance(value, (bool, np.bool_)) else value
    if tp is int:
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
        return ok, int(value) if ok else value
    if tp is float:
        ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
        return ok, float(value) if ok else value
    if tp is str:
        return isinstance(value, str), value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            return False, value
        items = [_match(v, args[0] if args else Any, depth + 1) for v in value]
        return all(ok for ok, _ in items), [out for _, out in items]
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            return False, value
        items = [_match(v, arm, depth + 1) for v, arm in zip(value, args)]
        return all(ok for ok, _ in items), tuple(out for _, out in items)
    if origin is dict or tp is dict:
        ok = (isinstance(value, Mapping) and all(isinstance(k, str) for k in value)
              and not _too_deep(value, _MAX_DEPTH - depth))
        return ok, dict(value) if ok else value
    if origin is collections.abc.Callable:
        return callable(value), value
    if isinstance(tp, type):
        return isinstance(value, tp), value
    raise TypeError(f"unsupported option annotation {tp!r}")


def _too_deep(value: Any, levels: int) -> bool:
    """True when ``value`` nests dicts or lists more than ``levels`` deep (stops there)."""
    if not isinstance(value, (Mapping, list, tuple)):
        return False
    if levels <= 0:
        return True
    children = value.values() if isinstance(value, Mapping) else value
    return any(_too_deep(v, levels - 1) for v in children)


def _non_finite(value: Any) -> str | None:
    """Path (``""``, ``".key"``, ``"[i]"``) of the first NaN or infinity in a value, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else ""
    sequence = isinstance(value, (list, tuple))
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if sequence else ()
    for key, v in items:
        inner = _non_finite(v)
        if inner is not None:
            return (f".{key}" if isinstance(value, Mapping) else f"[{key}]") + inner
    return None


def _out_of_range(x: float, meta: Mapping[str, Any]) -> str:
    """The violated bounds as text, or ``""``."""
    tests = {"ge": x >= meta.get("ge", -math.inf), "gt": x > meta.get("gt", -math.inf),
             "le": x <= meta.get("le", math.inf), "lt": x < meta.get("lt", math.inf)}
    return describe_range(meta) if not all(tests.values()) else ""


def _show(value: Any) -> str:
    """A short repr of a value for a message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
