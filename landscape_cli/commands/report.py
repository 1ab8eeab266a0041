"""``landscape report``: an HTML report of an FL run (curves, paths, group barrier, shared basin)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from landscape import ConfigError
from landscape.infra.flags import add_option_flags
from landscape_cli.commands import COMMANDS
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.inputs import Context
from landscape_cli.limits import check_points
from landscape_cli.output import emit

#: Grid points per axis of the report's plane, and alphas of its paths (a quick overview).
REPORT_RESOLUTION = 15
REPORT_ALPHAS = 11


@COMMANDS.register("report")
def register(sub: Any) -> None:
    """Add ``report`` to the subcommands.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of ``landscape``.
    """
    from landscape.geometry.options import PathOptions, PlaneOptions

    p = add_analysis_command(sub, "report", func=run, default_models=None, nmodels=(0, None),
                             help="an HTML report (report/index.html) of an FL run: curves, paths, plane, basins, "
                                  "claims")
    add_option_flags(p, PlaneOptions, only=("resolution",), defaults={"resolution": REPORT_RESOLUTION})
    add_option_flags(p, PathOptions, defaults={"alphas": REPORT_ALPHAS})


def run(args: argparse.Namespace) -> int:
    """Write ``<out>/index.html`` (default ``<run>/report/``) for an FL run.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of ``landscape report``.

    Returns
    -------
    int
        0.
    """
    from figures.fl_curves import fl_curves_figure
    from figures.paths import path_figure
    from figures.planes import plane_figure
    from figures.report import Report
    from figures.tracking import tracking_figure
    from landscape import claims, group_barrier, interpolate

    if not args.run:
        raise ConfigError("report needs --run DIR (an FL run directory)")
    check_points(args.resolution ** 2, f"--resolution {args.resolution}",
                 f"a {args.resolution} x {args.resolution} grid", figures=True)
    if args.out == "landscape_out":
        args.out = str(Path(args.run) / "report")
    args.models = args.models or ["clients", "global"]
    ctx = Context(args)
    cfg = ctx.run.config
    clients = {k: v for k, v in ctx.models.items() if k.startswith("client")}
    global_label = next((k for k in ctx.models if k.startswith("global")), None)
    rep = Report(f"{cfg.get('algorithm')} on {cfg.get('dataset')}",
                 subtitle=f"run {ctx.run.path}, round {ctx.run.rounds[args.round]}; evaluation data: {args.split}")
    rep.section("Configuration").add_table([{"option": k, "value": json.dumps(v) if not isinstance(v, str) else v}
                                             for k, v in cfg.items()])
    numbers: dict[str, Any] = {}
    rep.section("Training").add_image(fl_curves_figure({cfg.get("algorithm", "run"): ctx.run.metrics}))
    if cfg.get("track"):  # measured during training (fl.Track)
        table = ctx.run.track()
        rep.section("Landscape during training", f"Measured at rounds {', '.join(map(str, table['round']))} on "
                    f"{len(table.samples)} fixed training samples (fl.Track, docs/tracking.md).")
        rep.add_image(tracking_figure(table))
        numbers["track"] = {c: [None if not np.isfinite(v) else float(v) for v in table[c]] for c in table.columns}
    names = list(clients)
    if len(names) >= 2:
        paths = {f"{names[0]} → {names[1]}": interpolate(clients[names[0]], clients[names[1]], ctx.evaluator,
                                                           alphas=args.alphas)}
        if global_label:
            paths[f"{names[0]} → {global_label}"] = interpolate(clients[names[0]], ctx.models[global_label],
                                                                ctx.evaluator, alphas=args.alphas)
        rep.section("Linear interpolation", "Loss and accuracy along straight lines (FedGuCci Eq. 3/4).")
        rep.add_image(path_figure(paths, endpoint_labels=None))
        rep.add_table([{"path": k, "loss barrier": p.loss_barrier, "accuracy barrier": p.accuracy_barrier}
                       for k, p in paths.items()])
        numbers["paths"] = {k: {"loss_barrier": p.loss_barrier, "accuracy_barrier": p.accuracy_barrier}
                            for k, p in paths.items()}
        group = group_barrier(list(clients.values()), ctx.evaluator)
        rep.section("Group barrier", f"{len(clients)} client models around their centroid (FedGuCci Def. 3.6).")
        rep.add_table([{"loss barrier": group.loss_barrier, "accuracy barrier": group.accuracy_barrier,
                        "fused accuracy": group.fused_accuracy,
                        "mean client accuracy": float(np.mean(group.member_accuracy))}])
        numbers["group"] = {"loss_barrier": group.loss_barrier, "accuracy_barrier": group.accuracy_barrier}
    if len(names) >= 3 and global_label:
        verdict = claims.shared_basin(clients, ctx.models[global_label], ctx.evaluator,
                                      resolution=args.resolution, alphas=args.alphas)
        rep.section("Shared basin", verdict.claim + ". " + verdict.reason + ".")
        rep.add_image(plane_figure(verdict.results["plane"], metric="loss"))
        rep.add_html(verdict._repr_html_())
        numbers["shared_basin"] = {"holds": verdict.holds, **verdict.numbers}
    target = rep.write(ctx.out / "index.html")
    emit(ctx, numbers, {})
    print(f"report: {target}", file=sys.stderr)
    return 0
