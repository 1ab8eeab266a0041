"""The ``evaluation`` flags, generated from :class:`landscape.evaluation.options.EvaluatorOptions`.

Every field of the dataclass becomes ``--field-name`` with the field's help, its choices (the
``Literal`` values of its annotation), its bounds (metadata ``ge``) and its parser (metadata
``parse``), as declared with :func:`landscape.infra.options.option`, so the command line offers
exactly the options of the Python API and validates them the same way. A field whose metadata
says ``cli=False`` is Python-only; ``progress`` is expressed by ``--quiet``.
"""
from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, Callable

import torch

from landscape import LandscapeError
from landscape.evaluation.options import EvaluatorOptions
from landscape_cli.parsing import device_name, number

#: Options the command line expresses with another flag (the option -> that flag).
ELSEWHERE = {"progress": "--quiet"}


def cli_fields() -> list[dataclasses.Field]:
    """The fields of ``EvaluatorOptions`` that get a flag of their own.

    Returns
    -------
    list[dataclasses.Field]
        In declaration order.
    """
    return [f for f in dataclasses.fields(EvaluatorOptions)
            if f.metadata.get("cli", True) and f.name not in ELSEWHERE]


def add_evaluator_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per evaluator option to an ``evaluation`` group of ``parser``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        A parent parser shared by the analysis commands.
    """
    group = parser.add_argument_group("evaluation", "options of the evaluation engine (landscape.Evaluator)")
    hints = typing.get_type_hints(EvaluatorOptions)
    for f in cli_fields():
        flag = "--" + f.name.replace("_", "-")
        group.add_argument(flag, dest=f.name, default=f.default, help=f.metadata["help"],
                           **_argument_kind(f, hints[f.name]))


def literal_choices(hint: Any) -> tuple[str, ...]:
    """The string values a ``Literal[...]`` annotation (alone or in a union) allows.

    Parameters
    ----------
    hint : Any
        A field's evaluated annotation, e.g. ``Literal["loop", "vmap"] | None``.

    Returns
    -------
    tuple[str, ...]
        Empty when the annotation holds no ``Literal``.
    """
    members = typing.get_args(hint) if typing.get_origin(hint) is not typing.Literal else (hint,)
    return tuple(value for member in members if typing.get_origin(member) is typing.Literal
                 for value in typing.get_args(member) if isinstance(value, str))


def _argument_kind(f: dataclasses.Field, hint: Any) -> dict[str, Any]:
    """argparse keywords (type, choices, metavar or action) for one field.

    Every converted value is checked by the dataclass itself (:func:`_validated`), so a flag
    refuses exactly what ``EvaluatorOptions`` refuses, and the message names the flag.
    """
    meta = f.metadata
    members = set(typing.get_args(hint)) or {hint}
    bounds = {key: meta[key] for key in ("gt", "ge", "lt", "le") if key in meta}
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction}
    if "parse" in meta:
        kind: dict[str, Any] = {"type": meta["parse"], "metavar": f.name.upper()}
    elif literal_choices(hint):
        kind = {"type": str, "choices": literal_choices(hint)}
    elif torch.device in members:
        kind = {"type": device_name}
    elif members <= {int, type(None)}:
        kind = {"type": number(int, **bounds), "metavar": "N"}
    elif members <= {float, int, type(None)}:
        kind = {"type": number(float, **bounds), "metavar": "X"}
    elif int in members:  # a key or an index: digits give the index
        kind = {"type": _key_or_index, "metavar": "KEY|INDEX"}
    else:
        kind = {"type": str}
    kind["type"] = _validated(kind["type"], f.name)
    return kind


def _validated(convert: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """``convert``, then the dataclass's validation of the value; a ``LandscapeError`` of either
    becomes an argparse error (which names the flag).
    """

    def checked(text: str) -> Any:
        try:
            value = convert(text)
            EvaluatorOptions(**{name: value})
        except LandscapeError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    checked.__name__ = name
    return checked


def _key_or_index(text: str) -> str | int:
    """An integer for text made of digits (an index), the text itself otherwise (a key)."""
    return int(text) if text.lstrip("-").isdigit() else text


def evaluator_options(args: argparse.Namespace) -> EvaluatorOptions:
    """The validated evaluator options of parsed command-line arguments.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of a command whose parser includes :func:`add_evaluator_arguments`
        and the ``--quiet`` flag.

    Returns
    -------
    EvaluatorOptions
        One field per flag, ``progress=False`` with ``--quiet``.

    Raises
    ------
    ConfigError
        From the dataclass's own validation (naming the option).
    """
    values = {f.name: getattr(args, f.name) for f in cli_fields()}
    return EvaluatorOptions(**values, progress=False if args.quiet else None)
