"""``fl-run`` (and ``landscape train``): start or resume an FL run from the command line.

Every flag is generated from the typed options: :class:`fl.config.RunConfig` gives the run
flags, each algorithm's ``Options`` dataclass its own group (help, choices, default, range
and source from the field metadata). ``--option KEY=VALUE`` (JSON values) reaches the same
settings. Example::

    fl-run --algorithm fedprox --rounds 20 --mu 0.01 --out runs/prox

Errors print one line and exit with status 2; rerunning an interrupted command resumes it.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from typing import Any, Literal, Sequence, Union

from landscape import LandscapeError
from landscape.infra.commandline import internal_error, parse_json
from landscape.infra.options import describe_range, field_default

from . import resolve
from .algorithms import registry
from .config import RunConfig


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (``prog: error: ...``), exit 2."""

    def error(self, message: str) -> typing.NoReturn:
        """Print ``prog: error: message`` and exit with status 2.

        Parameters
        ----------
        message : str
            The error.
        """
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_option(text: str) -> tuple[str, Any]:
    """Parse ``KEY=VALUE`` (VALUE as JSON when it parses, else the string).

    Parameters
    ----------
    text : str
        The argument.

    Returns
    -------
    tuple[str, Any]
        Key and value.
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


def add_run_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the flags of ``fl.run`` to ``parser``, generated from the option dataclasses.

    Only flags given on the command line reach the namespace (defaults are suppressed), so
    :func:`run_from_args` knows which settings were explicit and a recipe's settings are
    overridden only by those.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The parser (``fl-run``'s, or ``landscape train``'s).

    Returns
    -------
    argparse.ArgumentParser
        The same parser.
    """
    algorithms = registry()
    run = parser.add_argument_group("run settings (fl.config.RunConfig)")
    for name, field in RunConfig.fields().items():
        choices = list(algorithms) if name == "algorithm" else None
        _add_field(run, name, RunConfig.types()[name], field, choices=choices)
    run.add_argument("--recipe", default=argparse.SUPPRESS, choices=list(resolve.RECIPES) or None,
                     help="a paper's settings (fl.RECIPES); explicit flags override them")
    run.add_argument("--out", default=argparse.SUPPRESS, help="run folder (default ./runs/<name>-<digest>)")
    run.add_argument("--option", "-o", action="append", type=parse_option, default=argparse.SUPPRESS,
                     metavar="KEY=VALUE", help="any setting or algorithm option as KEY=JSON, repeatable")
    run.add_argument("--no-progress", action="store_true", default=argparse.SUPPRESS, help="hide the progress bar")
    seen = set(RunConfig.fields())
    for alg_name, cls in algorithms.items():
        new = {n: f for n, f in cls.Options.fields().items() if n not in seen}
        if not new:
            continue
        group = parser.add_argument_group(f"{alg_name} options")
        users = {n: [a for a, c in algorithms.items() if n in c.Options.fields()] for n in new}
        types_ = cls.Options.types()
        for name, field in new.items():
            _add_field(group, name, types_[name], field, owners=users[name])
        seen |= set(new)
    return parser


def run_from_args(args: argparse.Namespace) -> Any:
    """Start or resume the run described by parsed :func:`add_run_arguments` flags.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments (only the flags given are present).

    Returns
    -------
    fl.Run
        The stored run.
    """
    from .api import run

    given = vars(args)
    settings: dict[str, Any] = dict(given.get("option") or [])
    settings.update({k: v for k, v in given.items() if k in _setting_names()})
    if given.get("no_progress"):
        settings["progress"] = False
    return run(recipe=given.get("recipe"), out=given.get("out"), **settings)


def build_parser() -> argparse.ArgumentParser:
    """The ``fl-run`` parser.

    Returns
    -------
    argparse.ArgumentParser
        A parser with the generated run flags plus ``--list-algorithms`` and ``--list-recipes``.
    """
    parser = OneLineParser(prog="fl-run", description=(
        "Train a federated-learning run and store its checkpoints and metrics "
        "(rerun the same command to resume an interrupted run)."))
    parser.add_argument("--list-algorithms", action="store_true", help="print the algorithms and their options")
    parser.add_argument("--list-recipes", action="store_true", help="print the recipes and their papers")
    return add_run_arguments(parser)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``fl-run``.

    Parameters
    ----------
    argv : Sequence[str], optional
        Arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        0 on success, 2 on an error (one line on stderr, also for an unexpected exception), 130 when
        interrupted.
    """
    try:
        args = build_parser().parse_args(argv)
        if args.list_algorithms:
            for name, cls in registry().items():
                opts = ", ".join(f"{k}={v!r}" for k, v in cls.Options.defaults().items()) or "no options"
                print(f"{name}: {opts}")
            return 0
        if args.list_recipes:
            for name, recipe in resolve.RECIPES.items():
                print(f"{name}: {recipe.paper}")
            return 0
        result = run_from_args(args)
        last = result.metrics[-1]
        print(f"{result.path}: round {last['round']}, test accuracy {last['test_accuracy']:.4f}, "
              f"test loss {last['test_loss']:.4f}")
        if len(result.metrics) >= 2:
            print(f"{result.path}: {result.convergence()}")
        return 0
    except (LandscapeError, OSError, ValueError) as exc:
        print(f"fl-run: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fl-run: interrupted; rerun the same command to resume from the last complete round",
              file=sys.stderr)
        return 130
    except Exception as exc:  # last resort: one line instead of a traceback
        print(f"fl-run: error: {internal_error(exc)}", file=sys.stderr)
        return 2


def _setting_names() -> set[str]:
    """RunConfig fields and every algorithm's option names."""
    names = set(RunConfig.fields())
    for cls in registry().values():
        names |= set(cls.Options.fields())
    return names


def _add_field(group: Any, name: str, tp: Any, field: dataclasses.Field, *, choices: list[str] | None = None,
               owners: list[str] | None = None) -> None:
    """One generated flag: ``--name-with-dashes`` with type, choices and help from the field."""
    meta = field.metadata
    default = field_default(field)
    notes = [f"default {default!r}"] if default is not None else []
    if describe_range(meta):
        notes.append(describe_range(meta))
    if meta.get("source"):
        notes.append(meta["source"])
    if owners and len(owners) > 1:
        notes.append("for " + ", ".join(owners))
    kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS,
                              "help": f"{meta['help']} ({'; '.join(notes)})" if notes else meta["help"]}
    base = _without_none(tp)
    origin, args = typing.get_origin(base), typing.get_args(base)
    if base is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    elif origin is Literal and all(isinstance(a, str) for a in args):
        kwargs["choices"] = list(args)
    elif base in (int, float, str):
        kwargs["type"] = base
        kwargs["choices"] = choices
    else:
        kwargs["type"] = json_value
        kwargs["metavar"] = "JSON"
    group.add_argument("--" + name.replace("_", "-"), **kwargs)


def _without_none(tp: Any) -> Any:
    """``X`` for ``X | None``; any other annotation unchanged."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        arms = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(arms) == 1:
            return arms[0]
    return tp


if __name__ == "__main__":
    sys.exit(main())
