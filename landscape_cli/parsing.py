"""argparse pieces shared by every command: one-line errors, help formatting, checked values.

A value converter given as ``type=`` raises :class:`argparse.ArgumentTypeError`; argparse
then prints ``landscape: error: argument --span: must be > 0, got '0'`` on one line, so
every message names the offending option without repeating it here.
"""
from __future__ import annotations

import argparse
import inspect
import math
import operator
import sys
from typing import Any, Callable

from landscape import ConfigError
from landscape.geometry.planes import check_margin
from landscape.infra.devices import resolve_device

#: Largest seed accepted: torch.Generator.manual_seed takes values in [0, 2**63).
MAX_SEED = 2**63 - 1
_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``landscape: error: ...`` and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """Print ``message`` on one line of stderr and exit with status 2.

        Parameters
        ----------
        message : str
            argparse's description of the problem (it names the option).
        """
        text = " ".join(message.split())
        print(f"landscape: error: {text} (see '{self.prog} --help')", file=sys.stderr)
        raise SystemExit(2)


class Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows defaults, except None, False and those the help text already names."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if (action.default is None or action.default is False or action.default is argparse.SUPPRESS
                or "default" in (action.help or "")):
            return action.help
        return super()._get_help_string(action)


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
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        if not all(_OPS[op](value, bound) for op, bound in bounds):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value

    convert.__name__ = f"{kind.__name__}_in_range"
    return convert


def _show(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


#: Common converters.
positive_int = number(int, ge=1)
count_at_least_2 = number(int, ge=2)
finite_float = number(float)
nonnegative_float = number(float, ge=0)
positive_float = number(float, gt=0)
seed_int = number(int, ge=0, le=MAX_SEED)


def checked(check: Callable[[Any], object], parse: Callable[[str], Any] = str) -> Callable[[str], Any]:
    """A ``type=`` converter that parses the text and checks the value as the API checks it.

    Parameters
    ----------
    check : Callable
        The API's check of the value; raises :class:`~landscape.ConfigError` for a bad one.
    parse : Callable[[str], Any]
        Turns the text into the value (``float`` for a number; the text itself by default).

    Returns
    -------
    Callable[[str], Any]
        Returns the parsed value; raises ``argparse.ArgumentTypeError`` with the message of
        ``check``'s ``ConfigError``, or ``must be a number, got '...'`` when ``parse`` raises
        ``ValueError``.
    """
    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        try:
            check(value)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    convert.__name__ = getattr(check, "__name__", "checked")
    return convert


#: ``--margin`` of a plane: a number checked by :func:`landscape.geometry.planes.check_margin`.
plane_margin = checked(check_margin, float)
#: ``--device``: ``auto`` or a device of this machine, checked by :func:`landscape.infra.devices.resolve_device`
#: (the text is kept: the evaluator resolves it again).
device_name = checked(resolve_device)


def api_default(function: Callable[..., Any], name: str) -> Any:
    """The default of a keyword argument of an API function (the flags take the API's defaults).

    Parameters
    ----------
    function : Callable
        E.g. ``landscape.hessian_trace``.
    name : str
        The keyword argument.

    Returns
    -------
    Any
    """
    return inspect.signature(function).parameters[name].default
