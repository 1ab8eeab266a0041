"""``landscape check CLAIM``: check a paper claim on your models (exit 0: holds, 1: does not).

Claims: ``transitivity`` (FedGuCci Hyp. 3.1), ``group`` (FedGuCci Def. 3.6),
``shared-basin`` (IMA Sec. 4) and ``flatter`` (top Hessian eigenvalue of A below B's).
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Mapping

from landscape_cli import runs
from landscape_cli.commands import COMMANDS
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.commands.group import check_weights
from landscape_cli.commands.hessian import lanczos_parent
from landscape_cli.inputs import Context
from landscape_cli.limits import MAX_ITERATIONS, check_points, iteration_count
from landscape_cli.output import emit
from landscape_cli.parsing import (
    Formatter,
    Parser,
    api_default,
    count_at_least_2,
    finite_float,
    nonnegative_float,
    number,
    plane_margin,
    positive_int,
    seed_int,
)

METRICS = ("accuracy", "loss")


@COMMANDS.register("check")
def register(sub: Any) -> None:
    """Add ``check`` and its claims to the subcommands; defaults are those of ``landscape.claims``.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of ``landscape``.
    """
    from landscape import claims as api

    check = sub.add_parser("check", formatter_class=Formatter,
                           help="check a paper claim on your models (exit 0: holds, 1: does not)",
                           description="Check a claim; exit status 0 when it holds, 1 when it fails or is "
                                       "not applicable, 2 on errors.")
    claims = check.add_subparsers(dest="claim", metavar="CLAIM", required=True, parser_class=Parser)
    fn = api.transitivity
    p = add_analysis_command(claims, "transitivity", func=run, default_models=None, nmodels=(3, 3),
                             help="w1, w2 connected to an anchor => connected to each other (models: W1 W2 ANCHOR)")
    p.add_argument("--baseline", nargs=2, metavar=("V1", "V2"),
                   help="a baseline pair (checkpoints, or run selectors with --run) for the relative reduction")
    p.add_argument("--threshold", type=nonnegative_float, default=api_default(fn, "threshold"),
                   help="largest barrier counted as connected (accuracy: relative drop, Eq. 4; loss: Eq. 3)")
    p.add_argument("--min-reduction", type=finite_float, default=api_default(fn, "min_reduction"),
                   help="with --baseline: smallest relative barrier reduction that supports the claim")
    p.add_argument("--metric", default=api_default(fn, "metric"), choices=METRICS, help="barrier metric")
    p.add_argument("--alphas", type=count_at_least_2, default=api_default(fn, "alphas"), help="alphas per path")

    fn = api.group_connectivity
    p = add_analysis_command(claims, "group", func=run, default_models=["clients"], nmodels=(2, None),
                             help="the group barrier of the models is small")
    p.add_argument("--threshold", type=nonnegative_float, default=api_default(fn, "threshold"),
                   help="largest group barrier counted as connected")
    p.add_argument("--metric", default=api_default(fn, "metric"), choices=METRICS,
                   help="barrier metric (Eq. 10 / 9)")
    p.add_argument("--weights", nargs="+", type=nonnegative_float,
                   help="fusion weights, non-negative, not all zero (normalised); default uniform")
    p.add_argument("--by-size", action="store_true", help="also barriers of random subsets of every size K")
    p.add_argument("--draws", type=positive_int, default=api_default(fn, "draws"), help="subsets per size")
    p.add_argument("--seed", type=seed_int, default=api_default(fn, "seed"), help="seed of the subsets")

    fn = api.shared_basin
    p = add_analysis_command(claims, "shared-basin", func=run, default_models=["clients", "global"],
                             nmodels=(2, None),
                             help="clients and the global model lie in one basin (models: clients; global from the "
                                  "run or --global)")
    p.add_argument("--global", dest="global_model", metavar="FILE",
                   help="the global model's checkpoint (with --module)")
    p.add_argument("--plane-kind", default=api_default(fn, "plane_kind"), choices=("clients", "pca"),
                   help="plane through the first three clients, or the clients' top-2 PCA around the global")
    p.add_argument("--resolution", type=count_at_least_2, default=api_default(fn, "resolution"),
                   help="grid points per axis")
    p.add_argument("--margin", type=plane_margin, default=api_default(fn, "margin"),
                   help="grid margin around the models: the fraction of their bounding box added on each side")
    p.add_argument("--level", type=finite_float,
                   help="sublevel c of the basin (default: highest loss at the clients)")
    p.add_argument("--barrier-threshold", type=nonnegative_float, default=api_default(fn, "barrier_threshold"),
                   help="largest client-global barrier consistent with one basin")
    p.add_argument("--metric", default=api_default(fn, "metric"), choices=METRICS, help="barrier metric")
    p.add_argument("--alphas", type=count_at_least_2, default=api_default(fn, "alphas"),
                   help="alphas per client-global path")

    fn = api.flatter
    p = add_analysis_command(claims, "flatter", func=run, parents=(lanczos_parent(fn),), default_models=None,
                             nmodels=(2, 2), help="model A has a smaller top Hessian eigenvalue than model B "
                                                  "(models: A B)")
    p.add_argument("--margin", type=number(float, ge=0, lt=1), default=api_default(fn, "margin"),
                   help="A must be below (1 - margin) times B")
    p.add_argument("--density", action="store_true", help="also both spectral densities (and a figure of them)")
    p.add_argument("--density-iterations", type=iteration_count, default=api_default(fn, "density_iterations"),
                   help=f"Lanczos steps of the densities, at most {MAX_ITERATIONS:,}")


def run(args: argparse.Namespace) -> int:
    """Check the claim named by ``args.claim`` and print its verdict.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of ``landscape check CLAIM``.

    Returns
    -------
    int
        0 when the claim holds, 1 when it does not (or is not applicable).
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
