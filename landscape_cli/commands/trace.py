"""``landscape trace``: the trace of the Hessian (or GGN, Fisher) by Hutchinson or Hutch++, with its standard error."""
from __future__ import annotations

import argparse
from typing import Any

from landscape_cli.commands import COMMANDS
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.commands.hessian import curvature_parent, operator_options
from landscape_cli.inputs import Context
from landscape_cli.limits import MAX_ITERATIONS, iteration_count
from landscape_cli.output import emit
from landscape_cli.parsing import api_default, positive_float, positive_int, seed_int


@COMMANDS.register("trace")
def register(sub: Any) -> None:
    """Add ``trace`` to the subcommands.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of ``landscape``.
    """
    from landscape import hessian_trace
    from landscape.curvature.registry import TRACE_ESTIMATORS

    p = add_analysis_command(sub, "trace", func=run, parents=(curvature_parent(),), default_models=["global"],
                             nmodels=(1, None),
                             help="Hessian (or GGN, Fisher) trace (Hutchinson or Hutch++) with its standard error")
    p.add_argument("--method", default=api_default(hessian_trace, "method"), choices=TRACE_ESTIMATORS.names(),
                   help="hutchinson (Rademacher probes) or hutch++ (low-rank part plus Hutchinson on the rest)")
    p.add_argument("--tol", type=positive_float, default=api_default(hessian_trace, "tol"),
                   help="stop at stderr <= tol |trace|")
    p.add_argument("--max-iter", type=iteration_count, default=api_default(hessian_trace, "max_iter"),
                   help=f"operator products at most per model (up to {MAX_ITERATIONS:,}; Hutch++ holds "
                        "max-iter / 3 vectors at once)")
    p.add_argument("--min-samples", type=positive_int, default=api_default(hessian_trace, "min_samples"),
                   help="probes before the stopping test")
    p.add_argument("--seed", type=seed_int, default=api_default(hessian_trace, "seed"), help="seed of the probes")


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

    ctx = Context(args)
    numbers: dict[str, Any] = {}
    results: dict[str, Any] = {}
    for label, model in ctx.models.items():
        tr = hessian_trace(model, ctx.evaluator, tol=args.tol, max_iter=args.max_iter, seed=args.seed,
                           method=args.method, min_samples=args.min_samples, **operator_options(args))
        numbers[label] = {"trace": tr.value, "stderr": tr.stderr, "method": tr.method, "converged": tr.converged,
                          "hvps": tr.matvecs}
        results[f"{label} trace"] = tr
    emit(ctx, numbers, results)
    return 0
