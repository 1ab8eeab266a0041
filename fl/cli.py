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
import sys
import typing
from dataclasses import dataclass
from typing import Any, Sequence

from landscape.infra.commandline import internal_error
from landscape.infra.errors import LandscapeError
from landscape.infra.estimate import JobEstimate
from landscape.infra.flags import add_option_flags, key_value
from landscape.infra.options import Options, option

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


@dataclass(frozen=True)
class RunCommandOptions(Options):
    """The flags of ``fl-run`` (and ``landscape train``) beyond the run settings.

    Attributes
    ----------
    recipe
        A paper's settings; explicit flags override them.
    out
        The run folder.
    no_progress
        Hide the progress bar.
    list_algorithms, list_recipes
        Print the algorithms (with their options) or the recipes instead of running.
    dry_run
        Print what the run will cost (local steps, evaluations, memory, stored rounds, time) instead of running.
    option
        Settings or algorithm options as ``KEY=JSON`` pairs.
    """

    recipe: str | None = option(None, help="a paper's settings (fl.RECIPES); explicit flags override them",
                                choices=lambda: list(resolve.RECIPES))
    out: str | None = option(None, help="run folder (default ./runs/<name>-<digest>)")
    no_progress: bool = option(False, help="hide the progress bar")
    list_algorithms: bool = option(False, help="print the algorithms and their options")
    list_recipes: bool = option(False, help="print the recipes and their papers")
    dry_run: bool = option(False, help="print what the run will cost (steps, memory, stored rounds, time); "
                                       "train and write nothing")
    # last: from here on, ``option`` in this class body is the field
    option: list[Any] | None = option(None, help="any setting or algorithm option as KEY=JSON, repeatable",
                                      flag=("--option", "-o"), parse=key_value, repeat=True, metavar="KEY=VALUE")


def add_run_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the flags of ``fl.run`` to ``parser``, generated from the option dataclasses.

    Run settings and algorithm options given on the command line are the only ones that reach
    the namespace (their defaults are suppressed), so :func:`run_from_args` knows which
    settings were explicit and a recipe's settings are overridden only by those.

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
    add_option_flags(run, RunConfig, suppress=True, validate=False, choices={"algorithm": list(algorithms)})
    add_option_flags(run, RunCommandOptions)
    seen = set(RunConfig.fields())
    for alg_name, cls in algorithms.items():
        new = [n for n in cls.Options.fields() if n not in seen]
        if not new:
            continue
        group = parser.add_argument_group(f"{alg_name} options")
        users = {n: [a for a, c in algorithms.items() if n in c.Options.fields()] for n in new}
        add_option_flags(group, cls.Options, only=new, suppress=True, validate=False,
                         notes={n: "for " + ", ".join(users[n]) for n in new if len(users[n]) > 1})
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
    fl.Run or JobEstimate
        The stored run, or with ``--dry-run`` its estimate.
    """
    from .api import run

    given = vars(args)
    settings: dict[str, Any] = dict(given.get("option") or [])
    settings.update({k: v for k, v in given.items() if k in _setting_names()})
    if given.get("no_progress"):
        settings["progress"] = False
    return run(recipe=given.get("recipe"), out=given.get("out"), dry_run=bool(given.get("dry_run")), **settings)


def print_outcome(result: Any, *, convergence: bool = True) -> None:
    """Print a finished run's last round (and its convergence), or a dry run's estimate.

    Parameters
    ----------
    result : fl.Run or JobEstimate
        What :func:`run_from_args` returned.
    convergence : bool
        Also print the run's convergence summary (``fl-run``).
    """
    if isinstance(result, JobEstimate):
        print(result)
        return
    last = result.metrics[-1]
    print(f"{result.path}: round {last['round']}, test accuracy {last['test_accuracy']:.4f}, "
          f"test loss {last['test_loss']:.4f}")
    if convergence and len(result.metrics) >= 2:
        print(f"{result.path}: {result.convergence()}")


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
        print_outcome(run_from_args(args))
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


if __name__ == "__main__":
    sys.exit(main())
