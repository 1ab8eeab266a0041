"""``landscape check CLAIM``: check a paper claim on your models (exit 0: holds, 1: does not).

Claims: ``transitivity`` (FedGuCci Hyp. 3.1), ``group`` (FedGuCci Def. 3.6),
``shared-basin`` (IMA Sec. 4) and ``flatter`` (top Hessian eigenvalue of A below B's).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from landscape.infra.flags import add_option_flags
from landscape.infra.options import Options, option
from landscape_cli import runs
from landscape_cli.commands import COMMANDS
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.commands.group import check_weights
from landscape_cli.inputs import Context
from landscape_cli.limits import check_points
from landscape_cli.output import emit
from landscape_cli.parsing import Formatter, Parser

#: Alphas of each client-global path of ``check shared-basin`` (``landscape.claims.shared_basin``'s default).
SHARED_BASIN_ALPHAS = 11


@dataclass(frozen=True)
class TransitivityCommandOptions(Options):
    """The flags of ``landscape check transitivity`` beyond the claim's own options.

    Attributes
    ----------
    baseline
        A baseline pair (checkpoints, or run selectors with ``--run``).
    """

    baseline: tuple[str, str] | None = option(
        None, metavar=("V1", "V2"),
        help="a baseline pair (checkpoints, or run selectors with --run) for the relative reduction")


@dataclass(frozen=True)
class SharedBasinCommandOptions(Options):
    """The flags of ``landscape check shared-basin`` beyond the claim's own options.

    Attributes
    ----------
    global_model
        The global model's checkpoint (with ``--module``; a run knows its global model).
    """

    global_model: str | None = option(None, flag="--global", metavar="FILE",
                                      help="the global model's checkpoint (with --module)")


@COMMANDS.register("check")
def register(sub: Any) -> None:
    """Add ``check`` and its claims to the subcommands; defaults are those of ``landscape.claims``.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of ``landscape``.
    """
    from landscape.claims.options import (
        FlatterOptions,
        GroupConnectivityOptions,
        SharedBasinOptions,
        TransitivityOptions,
    )
    from landscape.curvature.options import EigenOptions
    from landscape.geometry.options import GroupOptions, PathOptions, PlaneOptions

    check = sub.add_parser("check", formatter_class=Formatter,
                           help="check a paper claim on your models (exit 0: reproduced, 1: not)",
                           description="Check a claim; exit status 0 when it is reproduced, 1 when it is not "
                                       "reproduced or not testable, 2 on errors.")
    claims = check.add_subparsers(dest="claim", metavar="CLAIM", required=True, parser_class=Parser)
    p = add_analysis_command(claims, "transitivity", func=run, default_models=None, nmodels=(3, 3),
                             help="w1, w2 connected to an anchor => connected to each other (models: W1 W2 ANCHOR)")
    add_option_flags(p, TransitivityCommandOptions)
    add_option_flags(p, TransitivityOptions)
    add_option_flags(p, PathOptions)

    p = add_analysis_command(claims, "group", func=run, default_models=["clients"], nmodels=(2, None),
                             help="the group barrier of the models is small")
    add_option_flags(p, GroupConnectivityOptions)
    add_option_flags(p, GroupOptions)

    p = add_analysis_command(claims, "shared-basin", func=run, default_models=["clients", "global"],
                             nmodels=(2, None),
                             help="clients and the global model lie in one basin (models: clients; global from the "
                                  "run or --global)")
    add_option_flags(p, SharedBasinCommandOptions)
    add_option_flags(p, SharedBasinOptions)
    add_option_flags(p, PlaneOptions, only=("resolution", "margin"))
    add_option_flags(p, PathOptions, defaults={"alphas": SHARED_BASIN_ALPHAS})

    p = add_analysis_command(claims, "flatter", func=run, default_models=None, nmodels=(2, 2),
                             help="model A has a smaller top Hessian eigenvalue than model B (models: A B)")
    add_option_flags(p, EigenOptions, skip=("method",))
    add_option_flags(p, FlatterOptions)


def run(args: argparse.Namespace) -> int:
    """Check the claim named by ``args.claim`` and print its verdict.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of ``landscape check CLAIM``.

    Returns
    -------
    int
        0 when the claim is reproduced, 1 when it is not (or is not testable).
    """
    from figures.verdicts import verdict_figure
    from landscape import claims

    if args.claim == "shared-basin":
        check_points(args.resolution ** 2, f"--resolution {args.resolution}",
                     f"a {args.resolution} x {args.resolution} grid", figures=not args.no_figures)
    check_weights(getattr(args, "weights", None))
    ctx = Context(args)
    models = list(ctx.models.values())
    if args.claim == "transitivity":
        baseline = None
        if args.baseline:
            if ctx.run is not None:
                baseline = tuple(runs.run_models(ctx.run, list(args.baseline), args.round).values())
            else:
                baseline = tuple(Path(p) for p in args.baseline)
        verdict = claims.transitivity(*models, ctx.evaluator, baseline=baseline, threshold=args.threshold,
                                      min_reduction=args.min_reduction, metric=args.metric, alphas=args.alphas)
    elif args.claim == "group":
        verdict = claims.group_connectivity(models, ctx.evaluator, threshold=args.threshold, metric=args.metric,
                                            weights=args.weights, by_size=args.by_size, draws=args.draws,
                                            seed=args.seed)
    elif args.claim == "shared-basin":
        clients, global_model = ctx.split_global()
        verdict = claims.shared_basin(clients, global_model, ctx.evaluator, plane_kind=args.plane_kind,
                                      resolution=args.resolution, margin=args.margin, level=args.level,
                                      barrier_threshold=args.barrier_threshold, metric=args.metric,
                                      alphas=args.alphas)
    else:
        verdict = claims.flatter(*models, ctx.evaluator, k=args.k, tol=args.tol, max_iter=args.max_iter,
                                 seed=args.seed, margin=args.margin, density=args.density,
                                 density_iterations=args.density_iterations)
    numbers = {"holds": verdict.holds, "status": verdict.status, "reason": verdict.reason, **verdict.numbers}
    drawn = not (args.claim == "group" and not args.by_size) and not (args.claim == "flatter" and not args.density)
    if not args.json:
        print(f"Claim: {verdict.claim}")
    emit(ctx, numbers, flat_results(verdict.results),
         (lambda: {f"check_{args.claim}.png": verdict_figure(verdict)}) if drawn else None)
    return 0 if verdict.holds else 1


def flat_results(results: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The result objects of a verdict's nested evidence, keyed by their path (``"paths/w1-w2"``).

    Parameters
    ----------
    results : Mapping[str, Any]
        A verdict's ``results`` (result objects and nested mappings of them).
    prefix : str
        Path of ``results`` within the evidence.

    Returns
    -------
    dict[str, Result]
    """
    from landscape.results.base import Result

    out: dict[str, Any] = {}
    for key, value in results.items():
        if isinstance(value, Result):
            out[prefix + key] = value
        elif isinstance(value, Mapping):
            out.update(flat_results(value, f"{prefix}{key}/"))
    return out
