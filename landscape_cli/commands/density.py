"""``landscape density``: the eigenvalue density of the Hessian (or GGN, Fisher) by stochastic Lanczos quadrature."""
from __future__ import annotations

import argparse
from typing import Any

from landscape.infra.flags import add_option_flags, option_values
from landscape_cli.commands import COMMANDS
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.commands.hessian import curvature_parent, density_figures, operator_options
from landscape_cli.inputs import Context
from landscape_cli.output import DryRunOptions, emit, emit_estimates


@COMMANDS.register("density")
def register(sub: Any) -> None:
    """Add ``density`` to the subcommands.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of ``landscape``.
    """
    from landscape.curvature.options import DensityOptions

    p = add_analysis_command(sub, "density", func=run, parents=(curvature_parent(),), default_models=["global"],
                             nmodels=(1, None),
                             help="Hessian (or GGN, Fisher) eigenvalue density (stochastic Lanczos quadrature)")
    add_option_flags(p, DensityOptions)
    add_option_flags(p, DryRunOptions)


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
    from landscape.curvature.options import DensityOptions

    ctx = Context(args)
    densities = {label: hessian_density(model, ctx.evaluator, **option_values(DensityOptions, args),
                                        **operator_options(args), dry_run=args.dry_run)
                 for label, model in ctx.models.items()}
    if args.dry_run:
        return emit_estimates(ctx, densities)
    numbers = {label: {"grid_range": [float(d.grid[0]), float(d.grid[-1])], "sigma": d.sigma,
                       "smallest_node": float(d.nodes.min()), "largest_node": float(d.nodes.max()),
                       "hvps": d.matvecs}
               for label, d in densities.items()}
    emit(ctx, numbers, {f"{label} density": d for label, d in densities.items()},
         lambda: density_figures(densities))
    return 0
