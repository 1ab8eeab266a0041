"""Command-line flags generated from :class:`~landscape.infra.options.Options` classes: the one generator.

:func:`add_option_flags` turns each field of an option set into one flag, so a flag's name,
default, help, range and checks are declared once, beside the option they set:

* the flag is ``--field-name`` (or the field's ``flag``); its value is stored under the field's
  name (or the first flag's name, when the field declares one);
* numbers (``int``, ``float``, optionally ``| None``) must be finite and within the field's
  bounds (``must be an integer >= 1 and <= 100000, got '0'``); text goes through the field's
  ``parse`` when it declares one;
* strings offer their choices: a ``Literal[...]`` annotation's values or the field's
  ``choices`` (a registry's live names);
* booleans are ``--flag/--no-flag``; a field named ``no_x`` is the switch ``--no-x``;
* ``list[X]`` takes one or more values, ``tuple[X, Y]`` exactly two, a ``repeat`` field may be
  given several times; any other annotation (dicts, unions with lists) takes JSON;
* with ``validate`` (the default) a converted value is also checked by the option set itself
  (:meth:`~landscape.infra.options.Options.from_mapping`), so a flag refuses exactly what the
  Python API refuses; argparse then prints ``PROG: error: argument --flag: <why>`` on one line;
* the help is the field's help followed by its range, the source of its default and, where the
  parser does not show defaults itself, the default.

``fl-run`` and ``landscape train`` generate the run settings and every algorithm's options
with it; every ``landscape`` command its models-and-data, evaluation, output and analysis flags.
"""
from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import math
import operator
import types
import typing
from typing import Any, Callable, Literal, Mapping, Sequence, Union

from .commandline import parse_json
from .errors import LandscapeError
from .options import Options, field_default
from .values import RANGE_KEYS, choice_names, describe_range

_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def add_option_flags(group: Any, cls: type[Options], *, only: Sequence[str] | None = None,
                     skip: Sequence[str] = (), defaults: Mapping[str, Any] | None = None, suppress: bool = False,
                     validate: bool = True, choices: Mapping[str, Sequence[str]] | None = None,
                     notes: Mapping[str, str] | None = None) -> None:
    """Add one flag per command-line field of ``cls`` to ``group``.

    Parameters
    ----------
    group : argparse.ArgumentParser or argument group
        Where the flags go.
    cls : type[Options]
        The option set.
    only : sequence of str, optional
        Only these fields (in the class's order).
    skip : sequence of str
        Fields left out (expressed by another flag, or not offered by this command).
    defaults : Mapping[str, Any], optional
        Defaults of this command that differ from the fields' (e.g. fewer alphas for a matrix).
    suppress : bool
        Leave flags that are not given out of the namespace (only the help then names the
        default).
    validate : bool
        Also check each converted value with ``cls.from_mapping`` (constraints beyond type and
        range); off where the option set is validated as a whole later.
    choices : Mapping[str, Sequence[str]], optional
        Choices of string fields that depend on the caller (e.g. the algorithms registered now).
    notes : Mapping[str, str], optional
        A note per field appended to its help (e.g. which algorithms share an option).
    """
    types_ = cls.types()
    for name, f in cls.fields().items():
        if (only is not None and name not in only) or name in skip or not f.metadata.get("cli", True):
            continue
        default = (defaults or {}).get(name, field_default(f))
        kind = argument_kind(cls, f, types_[name], validate=validate)
        if choices and name in choices:
            kind["choices"] = list(choices[name])
        shown = default if suppress or "action" not in kind else None  # a formatter shows a switch's default
        group.add_argument(*flag_names(f), dest=flag_dest(f), default=argparse.SUPPRESS if suppress else default,
                           help=help_text(f, shown, (notes or {}).get(name, "")), **kind)


def option_values(cls: type[Options], args: argparse.Namespace, *, only: Sequence[str] | None = None) -> dict[str, Any]:
    """The values of ``cls``'s fields parsed from flags made by :func:`add_option_flags`.

    Parameters
    ----------
    cls : type[Options]
        The option set.
    args : argparse.Namespace
        Parsed arguments.
    only : sequence of str, optional
        Only these fields (default: every field whose flag the command has).

    Returns
    -------
    dict[str, Any]
        Field name -> value, ready to pass as keyword arguments or to ``cls.from_mapping``.
    """
    given = vars(args)
    return {name: given[flag_dest(f)] for name, f in cls.fields().items()
            if (only is None or name in only) and flag_dest(f) in given}


def flag_names(field: dataclasses.Field) -> tuple[str, ...]:
    """The flags of a field: its declared ``flag`` (one or more), or ``--field-name``.

    Parameters
    ----------
    field : dataclasses.Field
        A field declared with :func:`~landscape.infra.options.option`.

    Returns
    -------
    tuple[str, ...]
        Long flag first.
    """
    return field.metadata.get("flag") or ("--" + field.name.replace("_", "-"),)


def flag_dest(field: dataclasses.Field) -> str:
    """Where the parsed value of a field is stored: the field's name, or its declared flag's.

    Parameters
    ----------
    field : dataclasses.Field
        The field.

    Returns
    -------
    str
        The attribute of the parsed namespace.
    """
    declared = field.metadata.get("flag")
    return declared[0].lstrip("-").replace("-", "_") if declared else field.name


def help_text(field: dataclasses.Field, default: Any = None, note: str = "") -> str:
    """The help of a field's flag: its help, then range, source, ``default`` (when given) and ``note``.

    Parameters
    ----------
    field : dataclasses.Field
        The field.
    default : Any
        The default to write into the help (None: none is written; a switch's is left to the formatter).
    note : str
        Text appended last.

    Returns
    -------
    str
        argparse help text (``%`` escaped).
    """
    meta = field.metadata
    parts = [f"default {default!r}"] if default is not None else []
    parts += [text for text in (describe_range(meta), meta.get("source") or "", note) if text]
    text = meta["help"] + (f" ({'; '.join(parts)})" if parts else "")
    return text.replace("%", "%%")


def argument_kind(cls: type[Options], field: dataclasses.Field, hint: Any, *, validate: bool = True) -> dict[str, Any]:
    """Argparse keywords (type, choices, nargs, metavar or action) of one field's flag.

    Parameters
    ----------
    cls : type[Options]
        The option set (its ``from_mapping`` checks each value when ``validate``).
    field : dataclasses.Field
        The field.
    hint : Any
        Its evaluated annotation.
    validate : bool
        Check each converted scalar with the option set.

    Returns
    -------
    dict[str, Any]
        Keywords for ``add_argument``.
    """
    meta = field.metadata
    base = without_none(hint)
    if base is bool:
        return {"action": "store_true" if field.name.startswith("no_") else argparse.BooleanOptionalAction}
    bounds = {key: meta[key] for key in RANGE_KEYS if key in meta}
    origin, args = typing.get_origin(base), typing.get_args(base)
    kind: dict[str, Any]
    if meta.get("repeat"):
        kind = {"action": "append", "type": meta.get("parse", str)}
    elif "parse" in meta:
        kind = {"type": meta["parse"], "metavar": field.name.upper()}
    elif literal_choices(hint) or choice_names(meta):
        kind = {"type": str, "choices": list(choice_names(meta) or literal_choices(hint))}
    elif base in (int, float):
        kind = {"type": number(base, **bounds), "metavar": "N" if base is int else "X"}
    elif base is str:
        kind = {"type": str}
    elif origin is list and args and args[0] in (int, float, str):
        kind = {"type": _element(args[0], bounds), "nargs": "+"}
    elif origin is tuple and args and all(a in (int, float, str) for a in args):
        kind = {"type": _element(args[0], bounds), "nargs": len(args)}
    else:
        kind = {"type": json_value, "metavar": "JSON"}
    if "metavar" in meta:
        kind["metavar"] = meta["metavar"]
    if meta.get("required"):
        kind["required"] = True
    if validate and "nargs" not in kind and "choices" not in kind and "action" not in kind:
        kind["type"] = _validated(kind["type"], cls, field.name)
    else:
        kind["type"] = _one_line(kind["type"])
    return kind


def literal_choices(hint: Any) -> tuple[str, ...]:
    """The strings a ``Literal[...]`` annotation allows, when the command line can take nothing else.

    Parameters
    ----------
    hint : Any
        A field's evaluated annotation, e.g. ``Literal["loop", "vmap"] | None``; ``None`` and
        ``Callable`` arms (Python only) are ignored.

    Returns
    -------
    tuple[str, ...]
        Empty when another arm (a number, a list, ...) is allowed too, or there is no ``Literal``.
    """
    arms = [a for a in (typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,))
            if a is not type(None) and typing.get_origin(a) is not collections.abc.Callable]
    if not arms or any(typing.get_origin(a) is not Literal for a in arms):
        return ()
    return tuple(v for a in arms for v in typing.get_args(a) if isinstance(v, str))


def without_none(hint: Any) -> Any:
    """``X`` for ``X | None``; any other annotation unchanged.

    Parameters
    ----------
    hint : Any
        An annotation.

    Returns
    -------
    Any
        The annotation without its ``None`` arm when one other arm remains.
    """
    if typing.get_origin(hint) in (Union, types.UnionType):
        arms = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(arms) == 1:
            return arms[0]
    return hint


def number(kind: type = float, *, gt: float | None = None, ge: float | None = None,
           lt: float | None = None, le: float | None = None) -> Callable[[str], float | int]:
    """A ``type=`` converter for a finite number within bounds.

    Parameters
    ----------
    kind : type
        ``int`` or ``float``.
    gt, ge, lt, le : float, optional
        Bounds ``>``, ``>=``, ``<``, ``<=``.

    Returns
    -------
    Callable[[str], float | int]
        Parses a string; raises ``argparse.ArgumentTypeError`` naming the expected range for
        text that is not a number of that kind, NaN, infinite, or out of range.
    """
    bounds = [(op, b) for op, b in ((">", gt), (">=", ge), ("<", lt), ("<=", le)) if b is not None]
    wanted = ("an integer" if kind is int else "a finite number") + "".join(
        f"{' and' if i else ''} {op} {_show(b)}" for i, (op, b) in enumerate(bounds))

    def convert(text: str) -> float | int:
        try:
            value = int(text) if kind is int else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}") from None
        if not math.isfinite(value) or not all(_OPS[op](value, bound) for op, bound in bounds):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value

    convert.__name__ = f"{kind.__name__}_in_range"
    return convert


def key_value(text: str) -> tuple[str, Any]:
    """Parse ``KEY=VALUE``, VALUE as JSON when it parses, else the text (``mc_samples=4``, ``per_sample=vmap``).

    Parameters
    ----------
    text : str
        The command-line text.

    Returns
    -------
    tuple[str, Any]
        Key and value.

    Raises
    ------
    argparse.ArgumentTypeError
        Without ``=`` or a key, or as for :func:`json_value`.
    """
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key, json_value(value)


def json_value(text: str) -> Any:
    """A JSON value, or the text itself when it is not JSON (``last`` -> ``"last"``).

    Parameters
    ----------
    text : str
        The command-line text.

    Returns
    -------
    Any
        The parsed value.

    Raises
    ------
    argparse.ArgumentTypeError
        For JSON longer or nested deeper than :mod:`landscape.infra.commandline` allows.
    """
    try:
        return parse_json(text, "the JSON value", text_if_invalid=True)
    except LandscapeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _element(kind: type, bounds: Mapping[str, float]) -> Callable[[str], Any]:
    """The converter of one value of a list or tuple flag."""
    return number(kind, **bounds) if kind in (int, float) else str


def _one_line(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """``convert``, whose ``LandscapeError`` or ``ValueError`` becomes an argparse error (which names the flag)."""
    def converted(text: str) -> Any:
        try:
            return convert(text)
        except LandscapeError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}") from None

    converted.__name__ = getattr(convert, "__name__", "value")
    return converted


def _validated(convert: Callable[[str], Any], cls: type[Options], name: str) -> Callable[[str], Any]:
    """``convert``, then the option set's own check of the value.

    A ``LandscapeError`` of either becomes an argparse error, which names the flag.
    """
    convert = _one_line(convert)

    def checked(text: str) -> Any:
        value = convert(text)
        try:
            cls.from_mapping({name: value})
        except LandscapeError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    checked.__name__ = name
    return checked


def _show(bound: float) -> str:
    """A bound as the message writes it (``1`` rather than ``1.0``)."""
    return str(int(bound)) if float(bound).is_integer() else str(bound)
