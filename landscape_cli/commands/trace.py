"""``landscape trace``: the trace of the Hessian (or GGN, Fisher) by Hutchinson or Hutch++, with its standard error."""
from __future__ import annotations

import argparse
from typing import Any

from landscape.infra.flags import add_option_flags, option_values
from landscape_cli.commands import COMMANDS
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.commands.hessian import curvature_parent, operator_options
from landscape_cli.inputs import Context
from landscape_cli.output import DryRunOptions, emit, emit_estimates


@COMMANDS.register("trace")
def register(sub: Any) -> None:
    """Add ``trace`` to the subcommands.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of ``landscape``.
    """
    from landscape.curvature.options import TraceOptions

    p = add_analysis_command(sub, "trace", func=run, parents=(curvature_parent(),), default_models=["global"],
                             nmodels=(1, None),
                             help="Hessian (or GGN, Fisher) trace (Hutchinson or Hutch++) with its standard error")
    add_option_flags(p, TraceOptions)
    add_option_flags(p, DryRunOptions)


def run(args: argparse.Namespace) -> int:
    """``tr C`` of each model's curvature ``C`` (``--kind``; Hutchinson 1989; Hutch++, Meyer et al. 2021).

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of ``landscape trace``.

    Returns
    -------
    int
        0.
    """
    from landscape import hessian_trace
    from landscape.curvature.options import TraceOptions

    ctx = Context(args)
    if args.dry_run:
        return emit_estimates(ctx, {label: hessian_trace(model, ctx.evaluator, **option_values(TraceOptions, args),
                                                         **operator_options(args), dry_run=True)
                                    for label, model in ctx.models.items()})
    numbers: dict[str, Any] = {}
    results: dict[str, Any] = {}
    for label, model in ctx.models.items():
        tr = hessian_trace(model, ctx.evaluator, **option_values(TraceOptions, args), **operator_options(args))
        numbers[label] = {"trace": tr.value, "stderr": tr.stderr, "method": tr.method, "converged": tr.converged,
                          "hvps": tr.matvecs}
        results[f"{label} trace"] = tr
    emit(ctx, numbers, results)
    return 0
