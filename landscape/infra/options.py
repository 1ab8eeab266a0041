"""Typed option sets: one frozen dataclass per set of options, one source of truth.

A field is declared with :func:`option`, whose metadata carries the help text, the source of
the default (a paper equation, the official code, or a choice of ours) and the allowed range
(``ge``/``gt``/``le``/``lt``). From these declarations come:

* validation (:meth:`Options.from_mapping`): unknown keys (with a did-you-mean), wrong types,
  NaN and infinite numbers, values out of range, each a one-line ``ConfigError`` naming the
  option;
* the command-line flags with their help and choices (``fl.cli`` for runs,
  ``landscape_cli.evaluator_flags`` for the evaluator);
* the configuration digest (``fl.config.config_digest``: fields marked ``volatile`` are left
  out).

Used by every option set of the toolkit: the FL run configuration and each algorithm's options
(``fl``) and the evaluator's options (:class:`landscape.evaluation.options.EvaluatorOptions`).

Supported annotations: ``int``, ``float``, ``bool``, ``str``, ``Literal[...]``, ``X | None``,
``list[X]``, ``dict[str, Any]``, ``Callable``, any other class (an ``isinstance`` test), ``Any``
and unions of these.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import math
import types
import typing
from typing import Any, Literal, Mapping, Sequence, TypeVar, Union

import numpy as np

from .errors import ConfigError

T = TypeVar("T", bound="Options")
_RANGE_KEYS = ("ge", "gt", "le", "lt")
_MAX_DEPTH = 8  # nesting of dict/list option values (a deeply nested value is refused)


def option(default: Any, *, help: str, source: str | None = None, ge: float | None = None,
           gt: float | None = None, le: float | None = None, lt: float | None = None,
           volatile: bool = False, parse: Any = None, cli: bool = True) -> Any:
    """Declare a dataclass field of an :class:`Options` class.

    Parameters
    ----------
    default : Any
        Default value (a dict or list default is copied for every instance).
    help : str
        One-line help shown by the command line.
    source : str, optional
        Where the default comes from, e.g. ``"FedProx Eq. 2"`` or ``"official code"``.
    ge, gt, le, lt : float, optional
        Bounds of a number (or of every number of a list): ``>=``, ``>``, ``<=``, ``<``.
    volatile : bool
        True for options that may change when a stored run is resumed (device, back end):
        they are left out of the configuration digest and of the stored-run comparison.
    parse : callable, optional
        Turns a command-line string into the value (for types argparse cannot convert alone).
    cli : bool
        False for options that only make sense from Python (callables, data).

    Returns
    -------
    dataclasses.Field
        The field, to be assigned in the class body.
    """
    meta = {"help": help, "source": source, "volatile": volatile, "cli": cli,
            **({"parse": parse} if parse is not None else {}),
            **{k: v for k, v in zip(_RANGE_KEYS, (ge, gt, le, lt)) if v is not None}}
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Options:
    """Base class of a typed option set (subclass it as a frozen dataclass).

    Subclasses may override :meth:`resolved` (defaults derived from the run configuration)
    and :meth:`check` (constraints between fields).
    """

    @classmethod
    def fields(cls) -> dict[str, dataclasses.Field]:
        """The declared fields by name.

        Returns
        -------
        dict[str, dataclasses.Field]
            Field objects in declaration order.
        """
        return {f.name: f for f in dataclasses.fields(cls)}

    @classmethod
    def types(cls) -> dict[str, Any]:
        """The evaluated annotation of every field.

        Returns
        -------
        dict[str, Any]
            Field name -> type (``typing`` objects, strings resolved in the class's module).
        """
        return typing.get_type_hints(cls)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Default values of the fields.

        Returns
        -------
        dict[str, Any]
            Field name -> default (fresh copies of dict and list defaults).
        """
        return {name: field_default(f) for name, f in cls.fields().items()}

    @classmethod
    def from_mapping(cls: type[T], values: Mapping[str, Any], *, owner: str = "") -> T:
        """Validate ``values`` (missing keys take their defaults) and build the option set.

        Parameters
        ----------
        values : Mapping[str, Any]
            Option name -> value.
        owner : str
            Prefix naming the option set in messages, e.g. ``"fedprox option "``.

        Returns
        -------
        Options
            The validated instance (ints stay ints, numbers given for floats become floats).

        Raises
        ------
        ConfigError
            For an unknown key (with the closest valid name), a wrong type, a non-finite
            number, a value out of range, or a failed :meth:`check`.
        """
        fields = cls.fields()
        unknown = [k for k in values if k not in fields]
        if unknown:
            raise ConfigError(f"unknown {owner or 'option '}{unknown[0]!r}{did_you_mean(unknown[0], fields)}; "
                              f"valid: {', '.join(fields)}")
        types_ = cls.types()
        given = {**cls.defaults(), **values}
        checked = {name: check_value(f"{owner}{name}", given[name], types_[name], fields[name].metadata)
                   for name in fields}
        instance = cls(**checked)
        instance.check()
        return instance

    def to_dict(self) -> dict[str, Any]:
        """The options as a plain (JSON-ready) dict.

        Returns
        -------
        dict[str, Any]
            Field name -> value, in declaration order.
        """
        return {name: getattr(self, name) for name in self.fields()}

    def resolved(self: T, config: Mapping[str, Any]) -> T:
        """Defaults that depend on the run configuration filled in (default: unchanged).

        Parameters
        ----------
        config : Mapping[str, Any]
            The run configuration (``rounds``, ``local_epochs``, ...).

        Returns
        -------
        Options
            An instance without unresolved (``None``) derived defaults.
        """
        return self

    def check(self) -> None:
        """Constraints between fields (default: none); raise ``ConfigError``."""

    def validate(self) -> None:
        """Check every field of this instance against its annotation and range, then :meth:`check`.

        For option sets that validate on construction (call it from ``__post_init__``); values
        are normalised in place as :func:`check_value` does.

        Raises
        ------
        ConfigError
            Naming the first invalid option.
        """
        types_ = self.types()
        for name, f in self.fields().items():
            object.__setattr__(self, name, check_value(name, getattr(self, name), types_[name], f.metadata))
        self.check()


def field_default(field: dataclasses.Field) -> Any:
    """The default of a field declared with :func:`option` (a fresh copy of a dict or list).

    Parameters
    ----------
    field : dataclasses.Field
        The field.

    Returns
    -------
    Any
        Its default value.
    """
    return field.default_factory() if field.default is dataclasses.MISSING else field.default  # type: ignore[misc]


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


def check_value(name: str, value: Any, tp: Any, meta: Mapping[str, Any]) -> Any:
    """Validate one value against an annotation and the range of ``meta``.

    Parameters
    ----------
    name : str
        Name used in the message.
    value : Any
        The value.
    tp : Any
        The field's annotation.
    meta : Mapping[str, Any]
        The field's metadata (bounds ``ge``/``gt``/``le``/``lt``).

    Returns
    -------
    Any
        The value, normalised (numpy scalars to Python, tuples to lists, ints to floats
        where a float is expected).

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
    numbers = out if isinstance(out, list) else [out]
    for x in numbers:
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            bad = _out_of_range(x, meta)
            if bad:
                raise ConfigError(f"{name} must be {bad}, got {_show(value)}")
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
                        for k in _RANGE_KEYS if k in meta)


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
        return f"a list of {describe_type(args[0]).removeprefix('a ').removeprefix('an ')}s" if args else "a list"
    if origin is dict or tp is dict:
        return "a dict"
    if origin is collections.abc.Callable:
        return "a callable"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string",
            type(None): "None"}.get(tp, getattr(tp, "__name__", str(tp)))


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
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(value, (list, tuple)) else ()
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
