"""What a command leaves behind.

The numbers on stdout (a table or JSON), ``<out>/<command>.json``, the figures and the result
objects in the HDF5 cache.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from landscape.infra.errors import NonFiniteLossWarning
from landscape.infra.estimate import JobEstimate, combined
from landscape.infra.files import write_json
from landscape.infra.flags import add_option_flags
from landscape.infra.options import Options, option
from landscape_cli.inputs import Context


@dataclass(frozen=True)
class OutputOptions(Options):
    """The ``output`` flags: where figures, JSON and the cache go, and what is printed.

    Attributes
    ----------
    out
        Folder for figures and JSON.
    cache
        HDF5 cache folder (default ``<out>/landscape_cache``).
    no_cache
        Neither read nor write a cache.
    json
        Print the numbers as JSON instead of a table.
    no_figures
        Skip the figures.
    quiet
        No progress bars.
    """

    out: str = option("landscape_out", metavar="DIR", help="folder for figures and JSON")
    cache: str | None = option(None, metavar="DIR",
                               help="HDF5 cache folder, one sealed file per result (default <out>/landscape_cache)")
    no_cache: bool = option(False, help="do not read or write a cache")
    json: bool = option(False, help="print the numbers as JSON instead of a table")
    no_figures: bool = option(False, help="skip the figures")
    quiet: bool = option(False, help="no progress bars")


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``output`` group (``--out``, ``--cache``, ``--json``, ...) to ``parser``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        A parent parser shared by the analysis commands.
    """
    add_option_flags(parser.add_argument_group("output"), OutputOptions)


@dataclass(frozen=True)
class DryRunOptions(Options):
    """The ``--dry-run`` flag of the commands that start long jobs.

    Attributes
    ----------
    dry_run
        Print what the command will cost instead of running it.
    """

    dry_run: bool = option(False, help="print what the command will cost (forward passes or Hessian-vector "
                                       "products, memory, cached results, time); compute and write nothing")


def emit_estimates(ctx: Context, estimates: Mapping[str, JobEstimate]) -> int:
    """Print a dry run's estimates (a text block each, or JSON with ``--json``); write nothing.

    Parameters
    ----------
    ctx : Context
        The command's resolved inputs.
    estimates : Mapping[str, JobEstimate]
        Label (a model, a part of the command) -> estimate.

    Returns
    -------
    int
        0.
    """
    total = combined(f"landscape {ctx.command}", list(estimates.values()))
    if ctx.args.json:
        print(json.dumps({"command": ctx.command, "models": list(ctx.models), "dry_run": True,
                          "estimates": {k: e.to_dict() for k, e in estimates.items()}, "total": total.to_dict()},
                         indent=2))
        return 0
    for label, estimate in estimates.items():
        print(f"[{label}] {estimate}")
    if len(estimates) > 1:
        print(f"total: {total!r}")
    return 0


@contextlib.contextmanager
def warning_lines() -> Iterator[None]:
    """Show each distinct non-finite-loss warning once, as one line ``landscape: warning: ...`` on stderr.

    Other warnings are shown as Python shows them.

    Yields
    ------
    None
    """
    seen: set[str] = set()
    show = warnings.showwarning

    def one_line(message: Any, category: type, filename: str, lineno: int, file: Any = None,
                 line: str | None = None) -> None:
        if not issubclass(category, NonFiniteLossWarning):
            show(message, category, filename, lineno, file, line)
            return
        text = " ".join(str(message).split())
        if text not in seen:
            seen.add(text)
            print(f"landscape: warning: {text}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.simplefilter("always", NonFiniteLossWarning)
        warnings.showwarning = one_line
        yield


def plain(value: Any) -> Any:
    """A JSON-ready copy of ``value``.

    Parameters
    ----------
    value : Any
        Nested mappings, sequences, numpy arrays and scalars, paths.

    Returns
    -------
    Any
        Arrays become lists, numpy scalars Python numbers, NaN and infinities ``None``,
        paths strings.
    """
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [plain(v) for v in (value.tolist() if isinstance(value, np.ndarray) else value)]
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(float(value)) else None
    if isinstance(value, Path):
        return str(value)
    return value


def table(numbers: Mapping[str, Any], indent: str = "") -> list[str]:
    """The numbers as aligned ``key  value`` lines, nested mappings indented.

    Parameters
    ----------
    numbers : Mapping[str, Any]
        Name -> number, list or nested mapping.
    indent : str
        Prefix of every line (grows by two spaces per nesting level).

    Returns
    -------
    list[str]
        The lines; floats with 6 significant digits, lists cut after 8 items.
    """
    lines = []
    width = max((len(str(k)) for k in numbers), default=0)
    for key, value in numbers.items():
        if isinstance(value, Mapping):
            lines.append(f"{indent}{key}:")
            lines += table(value, indent + "  ")
        else:
            lines.append(f"{indent}{str(key).ljust(width)}  {_cell(value)}")
    return lines


def _cell(value: Any) -> str:
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value)
        shown = ", ".join(_cell(v) for v in items[:8])
        return f"[{shown}{', ...' if len(items) > 8 else ''}]"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.6g}"
    return str(value)


def emit(ctx: Context, numbers: Mapping[str, Any], results: Mapping[str, Any],
         draw: Callable[[], Mapping[str, Any]] | None = None) -> Path:
    """Write ``<out>/<command>.json``, the figures and the cached results; print the numbers.

    Parameters
    ----------
    ctx : Context
        The command's resolved inputs (arguments, models, evaluator, output folder).
    numbers : Mapping[str, Any]
        What the command measured; printed as a table (or JSON with ``--json``) and stored.
    results : Mapping[str, Any]
        Label -> result object, saved in the evaluator's cache when there is one.
    draw : Callable[[], Mapping[str, Any]], optional
        Returns file name -> figure; skipped with ``--no-figures``.

    Returns
    -------
    Path
        The JSON file written.
    """
    args = ctx.args
    name = ctx.command.replace(" ", "_")
    record = {"command": ctx.command, "models": list(ctx.models), "numbers": plain(numbers)}
    written = [write_json(ctx.out / f"{name}.json", record)]
    if ctx.evaluator.cache is not None:
        from landscape.cache.store import make_key

        for label, result in results.items():
            ctx.evaluator.cache.save_result(make_key({"command": name, "label": label, "models": list(ctx.models),
                                                      "spec": plain(dict(result.spec))}), result)
    if draw is not None and not args.no_figures:
        from figures.html import save

        for filename, fig in draw().items():
            written.append(save(fig, ctx.out / filename))
            if hasattr(fig, "clf"):
                import matplotlib.pyplot as plt

                plt.close(fig)
    print(json.dumps(record, indent=2) if args.json else "\n".join(table(numbers)))
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return written[0]
