"""``landscape plane``: a 2-D plane through three models (or random / PCA directions) and its basins."""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from landscape import ConfigError
from landscape.geometry.span import AUTO, check_span
from landscape_cli.commands import COMMANDS
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.inputs import Context
from landscape_cli.limits import check_points
from landscape_cli.output import emit
from landscape_cli.parsing import api_default, checked, count_at_least_2, finite_float, plane_margin, seed_int

KINDS = ("through", "random", "pca")


def _span_text(text: str) -> float | str:
    """The text as a number, or as it is when it is none (``check_span`` then names the choices)."""
    try:
        return float(text)
    except ValueError:
        return text


@COMMANDS.register("plane")
def register(sub: Any) -> None:
    """Add ``plane`` to the subcommands.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of ``landscape``.
    """
    from landscape import plane, random_plane
    from landscape.geometry.planes import MAX_MARGIN, NORMALIZATIONS

    p = add_analysis_command(sub, "plane", func=run, default_models=["clients", "global"], keep_clients=3,
                             nmodels=(1, None),
                             help="a 2-D plane through three models (or random / PCA directions) and its basins")
    p.add_argument("--kind", default="through", choices=KINDS,
                   help="through the first three models (others placed in it); random around the first; "
                        "PCA of all models around the last")
    p.add_argument("--resolution", type=count_at_least_2, default=api_default(plane, "resolution"),
                   help="grid points per axis")
    p.add_argument("--margin", type=plane_margin, default=api_default(plane, "margin"),
                   help="grid margin (through / pca): the fraction of the models' bounding box added on each side, "
                        f"in [0, {MAX_MARGIN:g}]")
    p.add_argument("--span", type=checked(check_span, parse=_span_text), default=api_default(random_plane, "span"),
                   help=f"grid half-width (random): a positive number, or {AUTO!r} to choose it from the loss's growth "
                        "along the directions")
    p.add_argument("--normalization", default=api_default(random_plane, "normalization"), choices=NORMALIZATIONS,
                   help="random")
    p.add_argument("--seed", type=seed_int, default=api_default(random_plane, "seed"), help="random directions")
    p.add_argument("--level", type=finite_float,
                   help="sublevel of the basin analysis (default: highest loss at the models)")


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
                     labels=tuple(labels[:3]), extra=dict(zip(labels[3:], models[3:])))
    elif args.kind == "random":
        grid = random_plane(models[0], ctx.evaluator, resolution=args.resolution, span=args.span,
                            normalization=args.normalization, seed=args.seed,
                            extra=dict(zip(labels[1:], models[1:])))
        grid = relabel(grid, {"center": labels[0]})
    else:
        grid = pca_plane(models, ctx.evaluator, resolution=args.resolution, margin=args.margin)
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
