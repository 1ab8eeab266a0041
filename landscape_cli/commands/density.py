"""``landscape density``: the eigenvalue density of the Hessian (or GGN, Fisher) by stochastic Lanczos quadrature."""
from __future__ import annotations

import argparse
from typing import Any

from landscape_cli.commands import COMMANDS
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.commands.hessian import curvature_parent, density_figures, operator_options
from landscape_cli.inputs import Context
from landscape_cli.limits import MAX_ITERATIONS, MAX_RUNS, iteration_count, probe_count
from landscape_cli.output import emit
from landscape_cli.parsing import api_default, number, positive_float, seed_int


@COMMANDS.register("density")
def register(sub: Any) -> None:
    """Add ``density`` to the subcommands.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of ``landscape``.
    """
    from landscape import hessian_density

    p = add_analysis_command(sub, "density", func=run, parents=(curvature_parent(),), default_models=["global"],
                             nmodels=(1, None),
                             help="Hessian (or GGN, Fisher) eigenvalue density (stochastic Lanczos quadrature)")
    p.add_argument("--iterations", type=iteration_count, default=api_default(hessian_density, "iterations"),
                   help=f"Lanczos steps per probe, at most {MAX_ITERATIONS:,} (the basis holds them all: larger "
                        "bases than the available memory are refused)")
    p.add_argument("--runs", type=probe_count, default=api_default(hessian_density, "runs"),
                   help=f"Rademacher probes, at most {MAX_RUNS:,}")
    p.add_argument("--sigma", type=positive_float, default=api_default(hessian_density, "sigma"),
                   help="Gaussian width (default: 0.5%% of the node spread)")
    p.add_argument("--grid-size", type=number(int, ge=2), default=api_default(hessian_density, "grid_size"),
                   help="points of the density grid")
    p.add_argument("--seed", type=seed_int, default=api_default(hessian_density, "seed"), help="seed of the probes")


def run(args: argparse.Namespace) -> int:
    """Spectral density of each model's curvature (``--kind``; SLQ, Ghorbani et al. 2019).

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of ``landscape density``.

    Returns
    -------
    int
        0.
    """
    from landscape import hessian_density

    ctx = Context(args)
    densities = {label: hessian_density(model, ctx.evaluator, iterations=args.iterations, runs=args.runs,
                                        seed=args.seed, sigma=args.sigma, grid_size=args.grid_size,
                                        **operator_options(args))
                 for label, model in ctx.models.items()}
    numbers = {label: {"grid_range": [float(d.grid[0]), float(d.grid[-1])], "sigma": d.sigma,
                       "smallest_node": float(d.nodes.min()), "largest_node": float(d.nodes.max()),
                       "hvps": d.matvecs}
               for label, d in densities.items()}
    emit(ctx, numbers, {f"{label} density": d for label, d in densities.items()},
         lambda: density_figures(densities))
    return 0
