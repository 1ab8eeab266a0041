"""``landscape plane``: a 2-D plane through three models (or random / PCA directions) and its basins."""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from landscape import ConfigError
from landscape.infra.flags import add_option_flags
from landscape.infra.options import Options, option
from landscape_cli.commands import COMMANDS
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.inputs import Context
from landscape_cli.limits import check_points
from landscape_cli.output import DryRunOptions, emit, emit_estimates

KINDS = ("through", "random", "pca")


@dataclasses.dataclass(frozen=True)
class PlaneCommandOptions(Options):
    """The flags of ``landscape plane`` beyond the plane's and the basin's own options.

    Attributes
    ----------
    kind
        Which plane: through three models, random around one, or PCA of all.
    """

    kind: str = option("through", choices=KINDS,
                       help="through the first three models (others placed in it); random around the first; "
                            "PCA of all models around the last")


@COMMANDS.register("plane")
def register(sub: Any) -> None:
    """Add ``plane`` to the subcommands.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of ``landscape``.
    """
    from landscape.geometry.options import BasinOptions, PlaneOptions

    p = add_analysis_command(sub, "plane", func=run, default_models=["clients", "global"], keep_clients=3,
                             nmodels=(1, None),
                             help="a 2-D plane through three models (or random / PCA directions) and its basins")
    for options in (PlaneCommandOptions, PlaneOptions, BasinOptions, DryRunOptions):
        add_option_flags(p, options)


def run(args: argparse.Namespace) -> int:
    """Evaluate the plane (Garipov et al. 2018; FedGuCci Fig. 3) and its sublevel basin.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of ``landscape plane``.

    Returns
    -------
    int
        0.
    """
    from landscape import basin, pca_plane, plane, random_plane

    check_points(args.resolution ** 2, f"--resolution {args.resolution}",
                 f"a {args.resolution} x {args.resolution} grid", figures=not args.no_figures)
    ctx = Context(args)
    labels = list(ctx.models)
    models = list(ctx.models.values())
    if args.kind == "through":
        if len(models) < 3:
            raise ConfigError(f"a plane through models needs three of them, got {len(models)}")
        grid = plane(*models[:3], ctx.evaluator, resolution=args.resolution, margin=args.margin,
                     labels=tuple(labels[:3]), extra=dict(zip(labels[3:], models[3:])), dry_run=args.dry_run)
    elif args.kind == "random":
        grid = random_plane(models[0], ctx.evaluator, resolution=args.resolution, span=args.span,
                            normalization=args.normalization, seed=args.seed,
                            extra=dict(zip(labels[1:], models[1:])), dry_run=args.dry_run)
    else:
        grid = pca_plane(models, ctx.evaluator, resolution=args.resolution, margin=args.margin, dry_run=args.dry_run)
    if args.dry_run:
        return emit_estimates(ctx, {"plane": grid})
    if args.kind == "random":
        grid = relabel(grid, {"center": labels[0]})
    elif args.kind == "pca":
        grid = relabel(grid, {f"step {i}": label for i, label in enumerate(labels)})
    placed = {k: v for k, v in grid.models.items() if inside(grid, v)}
    found = basin(grid, models=list(placed), level=args.level)
    numbers = {"kind": args.kind, "resolution": args.resolution,
               "x_range": [float(grid.x[0]), float(grid.x[-1])], "y_range": [float(grid.y[0]), float(grid.y[-1])],
               "min_loss": float(np.nanmin(grid.loss)), "max_accuracy": float(np.nanmax(grid.accuracy)),
               "models": {k: [float(c) for c in v] for k, v in grid.models.items()},
               **({"span": float(grid.spec["span"])} if args.kind == "random" else {}),
               "diagnostics": grid.diagnostics.notes,
               "basin": {"level": found.level, "common": found.common, "components": found.num_components,
                         "bottom": found.refined_bottom, "bottom_loss": found.refined_loss,
                         "distance_to_bottom": dict(zip(found.names, found.distance))}}

    def draw() -> dict[str, Any]:
        from figures.planes import plane_figure, plane_plotly

        return {"plane_loss.png": plane_figure(grid, metric="loss"),
                "plane_accuracy.png": plane_figure(grid, metric="accuracy"),
                "plane.html": plane_plotly(grid, metric="loss")}

    emit(ctx, numbers, {"plane": grid, "basin": found}, draw)
    return 0


def relabel(grid: Any, names: Mapping[str, str]) -> Any:
    """A copy of a plane result whose placed models are renamed.

    Parameters
    ----------
    grid : PlaneResult
        The plane.
    names : Mapping[str, str]
        Old label -> new label (others unchanged).

    Returns
    -------
    PlaneResult
    """
    return dataclasses.replace(grid, models={names.get(k, k): v for k, v in grid.models.items()})


def inside(grid: Any, xy: Sequence[float]) -> bool:
    """Whether plane coordinates ``(x, y)`` lie within the grid's rectangle.

    Parameters
    ----------
    grid : PlaneResult
        The plane.
    xy : Sequence[float]
        Coordinates of a model in the plane.

    Returns
    -------
    bool
    """
    return bool(grid.x.min() <= xy[0] <= grid.x.max() and grid.y.min() <= xy[1] <= grid.y.max())
