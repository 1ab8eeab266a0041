"""``landscape group``: the group barrier of K models around their centroid (FedGuCci Def. 3.6)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from landscape import ConfigError
from landscape.infra.flags import add_option_flags
from landscape.infra.options import Options, option
from landscape_cli.commands import COMMANDS
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.inputs import Context
from landscape_cli.output import DryRunOptions, emit, emit_estimates

#: Alphas of each pairwise path of ``--matrix`` (``landscape.barrier_matrix``'s default).
MATRIX_ALPHAS = 11


@dataclass(frozen=True)
class GroupCommandOptions(Options):
    """The flags of ``landscape group`` beyond the group's own options.

    Attributes
    ----------
    matrix
        Also the pairwise barrier matrix (its paths take ``--alphas``).
    """

    matrix: bool = option(False, help="also the pairwise barrier matrix (its paths: --alphas)")


@COMMANDS.register("group")
def register(sub: Any) -> None:
    """Add ``group`` to the subcommands.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of ``landscape``.
    """
    from landscape.claims.options import GroupConnectivityOptions
    from landscape.geometry.options import GroupOptions, PathOptions

    p = add_analysis_command(sub, "group", func=run, default_models=["clients"], nmodels=(2, None),
                             help="group barrier of K models around their centroid (FedGuCci Def. 3.6)")
    add_option_flags(p, GroupOptions)
    add_option_flags(p, GroupConnectivityOptions, only=("by_size",))
    add_option_flags(p, GroupCommandOptions)
    add_option_flags(p, PathOptions, defaults={"alphas": MATRIX_ALPHAS})
    add_option_flags(p, DryRunOptions)


def check_weights(weights: Sequence[float] | None, flag: str = "--weights") -> None:
    """Refuse weights that sum to zero (each is already finite and non-negative).

    Parameters
    ----------
    weights : Sequence[float] or None
        The parsed weights.
    flag : str
        The flag, for the message.

    Raises
    ------
    ConfigError
        When every weight is zero (the normalised weights would be undefined).
    """
    if weights is not None and sum(weights) <= 0:
        raise ConfigError(f"{flag} must not all be zero (they are normalised to sum to one)")


def run(args: argparse.Namespace) -> int:
    """Group barrier (FedGuCci Def. 3.6), optionally by subset size and the pairwise matrix.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of ``landscape group``.

    Returns
    -------
    int
        0.
    """
    from landscape import barrier_matrix, group_barrier, group_barrier_by_size

    check_weights(args.weights)
    ctx = Context(args)
    models = list(ctx.models.values())
    if args.weights is not None and len(args.weights) != len(models):
        raise ConfigError(f"--weights: {len(args.weights)} weights for {len(models)} models")
    if args.dry_run:
        return emit_estimates(ctx, estimate_group(models, ctx.evaluator, args))
    group = group_barrier(models, ctx.evaluator, weights=args.weights)
    numbers: dict[str, Any] = {"size": len(models), "loss_barrier": group.loss_barrier,
                               "accuracy_barrier": group.accuracy_barrier, "fused_loss": group.fused_loss,
                               "fused_accuracy": group.fused_accuracy,
                               "member_loss": dict(zip(ctx.models, group.member_loss)),
                               "member_accuracy": dict(zip(ctx.models, group.member_accuracy))}
    results: dict[str, Any] = {"group": group}
    if args.by_size:
        sizes = group_barrier_by_size(models, ctx.evaluator, draws=args.draws, seed=args.seed)
        for metric in ("accuracy", "loss"):
            numbers[f"{metric}_barrier_by_size"] = {
                int(k): float(np.mean(r)) for k, r in zip(sizes.sizes, getattr(sizes, f"{metric}_barrier"))}
        results["by_size"] = sizes
    if args.matrix:
        matrix = barrier_matrix(models, ctx.evaluator, alphas=args.alphas, labels=list(ctx.models))
        numbers["pairwise_loss_barrier"] = matrix.loss_barrier
        numbers["pairwise_accuracy_barrier"] = matrix.accuracy_barrier
        results["matrix"] = matrix

    def draw() -> dict[str, Any]:
        from figures.groups import barrier_matrix_figure, group_size_figure

        figs = {}
        if "by_size" in results:
            s = results["by_size"]
            figs["group_by_size.png"] = group_size_figure(
                {"models": {int(k): list(map(float, r)) for k, r in zip(s.sizes, s.accuracy_barrier)}})
        if "matrix" in results:
            figs["barrier_matrix.png"] = barrier_matrix_figure(results["matrix"])
        return figs

    emit(ctx, numbers, results, draw)
    return 0


def estimate_group(models: Sequence[Any], evaluator: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The dry runs of ``landscape group``: the barrier, and with ``--by-size`` / ``--matrix`` those too.

    Parameters
    ----------
    models : Sequence
        The group's models.
    evaluator : landscape.Evaluator
        The command's evaluator.
    args : argparse.Namespace
        Parsed arguments of ``landscape group``.

    Returns
    -------
    dict[str, JobEstimate]
        Part -> estimate.
    """
    from landscape import barrier_matrix, group_barrier, group_barrier_by_size
    from landscape.evaluation.dry_run import estimate_points

    found = {"group": group_barrier(models, evaluator, weights=args.weights, dry_run=True)}
    if args.by_size:
        found["by_size"] = estimate_points("group_barrier_by_size", evaluator, lambda ev: group_barrier_by_size(
            models, ev, draws=args.draws, seed=args.seed))
    if args.matrix:
        found["matrix"] = estimate_points("barrier_matrix", evaluator,
                                          lambda ev: barrier_matrix(models, ev, alphas=args.alphas))
    return found
