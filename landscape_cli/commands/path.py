"""``landscape path``: loss and accuracy along the line between two models, and its barriers."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import numpy as np

from landscape import ConfigError
from landscape.infra.flags import add_option_flags
from landscape.infra.options import Options, option
from landscape_cli.commands import COMMANDS
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.inputs import Context
from landscape_cli.limits import check_points
from landscape_cli.output import DryRunOptions, emit, emit_estimates


@dataclass(frozen=True)
class PathCommandOptions(Options):
    """The flags of ``landscape path`` beyond the path's own options.

    Attributes
    ----------
    alpha_range
        The interval the alphas are spread over (0 and 1 are always added).
    """

    alpha_range: tuple[float, float] = option((0.0, 1.0), metavar=("LO", "HI"),
                                              help="alpha interval (0 and 1 are always added)")


@COMMANDS.register("path")
def register(sub: Any) -> None:
    """Add ``path`` to the subcommands.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of ``landscape``.
    """
    from landscape.geometry.options import PathOptions

    p = add_analysis_command(sub, "path", func=run, default_models=["clients"], keep_clients=2, nmodels=(2, 2),
                             help="loss/accuracy along the line between two models, barriers (FedGuCci Eq. 3/4)")
    add_option_flags(p, PathOptions)
    add_option_flags(p, PathCommandOptions)
    add_option_flags(p, DryRunOptions)


def run(args: argparse.Namespace) -> int:
    """Evaluate the path ``(1 - alpha) a + alpha b`` (FedGuCci Eq. 3/4 barriers) and its basin.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of ``landscape path``.

    Returns
    -------
    int
        0.
    """
    from landscape import basin, interpolate

    lo, hi = args.alpha_range
    if not hi > lo:
        raise ConfigError(f"--alpha-range needs LO < HI, got {lo} {hi}")
    check_points(args.alphas + 2, f"--alphas {args.alphas}", "a path", figures=not args.no_figures)
    ctx = Context(args)
    alphas = np.union1d(np.linspace(lo, hi, args.alphas), [0.0, 1.0])
    (la, a), (lb, b) = ctx.models.items()
    if args.dry_run:
        return emit_estimates(ctx, {"path": interpolate(a, b, ctx.evaluator, alphas=alphas, dry_run=True)})
    path = interpolate(a, b, ctx.evaluator, alphas=alphas)
    ends_finite = np.isfinite(path.loss[np.isclose(alphas, 0.0) | np.isclose(alphas, 1.0)]).all()
    found = basin(path, models={la: 0.0, lb: 1.0}) if ends_finite else None  # no sublevel without endpoint losses
    midpoint = np.isclose(alphas, 0.5).any()
    numbers = {"from": la, "to": lb, "loss_barrier": path.loss_barrier, "accuracy_barrier": path.accuracy_barrier,
               "loss_barrier_midpoint": path.loss_barrier_midpoint if midpoint else None,
               "accuracy_barrier_midpoint": path.accuracy_barrier_midpoint if midpoint else None,
               "common_basin": None, "bottom_alpha": None, "bottom_loss": None,
               "alphas": path.alphas, "loss": path.loss, "accuracy": path.accuracy}
    results: dict[str, Any] = {"path": path}
    if found is not None:
        numbers.update(common_basin=found.common, bottom_alpha=float(found.refined_bottom[0]),
                       bottom_loss=found.refined_loss)
        results["basin"] = found

    def draw() -> dict[str, Any]:
        from figures.paths import path_figure, path_plotly

        named = {f"{la} → {lb}": path}
        return {"path.png": path_figure(named, endpoint_labels=(la, lb)), "path.html": path_plotly(named)}

    emit(ctx, numbers, results, draw)
    return 0
