"""``landscape merge``: merge models (soups, task arithmetic, TIES, DARE, SLERP), check the merge on the landscape."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from landscape import ConfigError
from landscape.infra.flags import add_option_flags
from landscape.infra.options import Options, option
from landscape_cli import datafiles, runs
from landscape_cli.commands import COMMANDS
from landscape_cli.commands.align import checkpoint_path
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.evaluator_flags import evaluator_options
from landscape_cli.inputs import Context
from landscape_cli.output import emit

#: Label of the merged model in the numbers and on the plane.
MERGED = "merge"


@dataclass(frozen=True)
class MergeCommandOptions(Options):
    """The flags of ``landscape merge`` beyond the merge's own options.

    Attributes
    ----------
    base
        The base model of the task-vector methods.
    weights
        One number per model.
    params
        Merge only these parameters.
    held_out
        Held-out data of the greedy soup.
    save
        Where the merged checkpoint goes.
    plane
        Also the loss plane with the merge marked.
    """

    base: str | None = option(None, metavar="MODEL",
                              help="base model of task_arithmetic, ties and dare: a checkpoint file, or with --run "
                                   "a run selector such as global@0")
    weights: list[float] | None = option(None, help="one number per model: a weighted mean's weights, or the per-task "
                                                    "coefficients of task_arithmetic, ties and dare")
    params: list[str] | None = option(None, metavar="PATTERN",
                                      help="merge only these parameters: 'trainable' (e.g. LoRA adapters) or fnmatch "
                                           "patterns of parameter names; the rest is the base's (or first model's)")
    held_out: str | None = option(None, metavar="DATA",
                                  help="held-out data greedy_soup chooses on: a data file or dataset name (its "
                                       "training split), or with --run a split of the run (train, client:K); "
                                       "default: the evaluation data")
    save: str | None = option(None, metavar="FILE", parse=checkpoint_path,
                              help="write the merged checkpoint (.safetensors, .pt or .pth)")
    plane: bool = option(False, help="also the loss plane through the base (or the first model) and the next two "
                                     "models (or the merge), with the merge marked")


@COMMANDS.register("merge")
def register(sub: Any) -> None:
    """Add ``merge`` to the subcommands, with each merge method's options as a group of flags.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of ``landscape``.
    """
    from landscape.geometry.options import PlaneOptions
    from landscape.merging.options import MergeOptions
    from landscape.merging.registry import METHODS

    p = add_analysis_command(sub, "merge", func=run, default_models=["clients"], nmodels=(1, None),
                             help="merge models (mean, greedy_soup, task_arithmetic, ties, dare, slerp) and measure "
                                  "the merge: loss, barriers to each model, curvature")
    add_option_flags(p, MergeOptions)
    add_option_flags(p, MergeCommandOptions)
    add_option_flags(p, PlaneOptions, only=("resolution", "margin"))
    methods = METHODS.entries()
    seen: set[str] = set()
    for name, method in methods.items():
        new = [n for n, f in method.options.fields().items() if n not in seen and f.metadata.get("cli", True)]
        if new:
            users = {n: [m for m, found in methods.items() if n in found.options.fields()] for n in new}
            add_option_flags(p.add_argument_group(f"{name} options"), method.options, only=new, suppress=True,
                             notes={n: "for " + ", ".join(users[n]) for n in new if len(users[n]) > 1})
            seen |= set(new)


def method_options(args: argparse.Namespace) -> dict[str, Any]:
    """The method options given on the command line (their flags are suppressed when absent).

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of ``landscape merge``.

    Returns
    -------
    dict[str, Any]
        Option name -> value, for the command-line options of any method that were given (a
        method refuses those that are not its own).
    """
    from landscape.merging.registry import METHODS

    names = {n for method in METHODS.entries().values() for n, f in method.options.fields().items()
             if f.metadata.get("cli", True)}
    return {k: v for k, v in vars(args).items() if k in names}


def _base(ctx: Context, text: str | None) -> Any:
    """The ``--base`` model: a run selector with ``--run``, else a checkpoint file."""
    if text is None:
        return None
    if ctx.run is not None:
        return next(iter(runs.run_models(ctx.run, [text], ctx.args.round).values()))
    return text


def _held_out(ctx: Context, text: str | None) -> Any:
    """The greedy soup's held-out evaluator (None: the evaluation data, said on stderr)."""
    from landscape import Evaluator

    if text is None:
        if ctx.args.method == "greedy_soup":
            print("landscape: note: greedy_soup chooses on the evaluation data (no --held-out): its numbers are "
                  "then optimistic", file=sys.stderr)
        return None
    run_split = ctx.run is not None and (text in ("test", "train") or text.startswith("client:"))
    data = runs.run_data(ctx.run, text) if run_split else datafiles.load_data(text, split="train",
                                                                               root=ctx.args.data_root)
    return Evaluator(ctx.module, data, options=evaluator_options(ctx.args))


def run(args: argparse.Namespace) -> int:
    """Merge the models, measure the merge, write the numbers, figures and (``--save``) the checkpoint.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of ``landscape merge``.

    Returns
    -------
    int
        0.
    """
    from landscape import merge, plane, save_state_dict

    ctx = Context(args)
    labels, models = list(ctx.models), list(ctx.models.values())
    base = _base(ctx, args.base)
    options = method_options(args)
    if args.method == "greedy_soup":
        options["held_out"] = _held_out(ctx, args.held_out)
    elif args.held_out is not None:
        raise ConfigError("--held-out is the greedy soup's: use it with --method greedy_soup")
    params = args.params[0] if args.params == ["trainable"] else args.params
    result = merge(models, args.method, base=base, weights=args.weights, evaluator=ctx.evaluator, params=params,
                   labels=labels, align=args.align, curvature=args.curvature, rho=args.rho, alphas=args.alphas,
                   tol=args.tol, **options)
    numbers: dict[str, Any] = {"method": args.method, "members": result.members, "loss": result.loss,
                               "accuracy": result.accuracy, "base_loss": result.base_loss,
                               "base_accuracy": result.base_accuracy}
    for key in ("endpoint_loss", "endpoint_accuracy", "loss_barrier", "accuracy_barrier", "endpoint_sharpness",
                "endpoint_lambda_max"):
        if getattr(result, key) is not None:
            numbers[key] = dict(zip(labels, map(float, getattr(result, key))))
    if args.curvature:
        numbers.update(sharpness=result.sharpness, lambda_max=result.lambda_max)
    if result.unaligned:
        numbers["unaligned"] = result.unaligned
    if args.save:
        numbers["saved"] = str(save_state_dict(result.state_dict(), args.save))
    results: dict[str, Any] = {"merge": result}
    if args.plane:
        results["plane"] = _plane(plane, ctx, base, models, labels, result, params, args)

    def draw() -> dict[str, Any]:
        from figures.merging import merge_figure, merge_plane_figure, merge_plane_plotly, merge_plotly

        figs = {"merge.png": merge_figure({args.method: result}), "merge.html": merge_plotly({args.method: result})}
        if "plane" in results:
            where = "base" if base is not None else None
            figs["merge_plane.png"] = merge_plane_figure(results["plane"], [MERGED], base=where)
            figs["merge_plane.html"] = merge_plane_plotly(results["plane"], [MERGED], base=where)
        return figs

    emit(ctx, numbers, results, draw)
    return 0


def _plane(plane: Any, ctx: Context, base: Any, models: list, labels: list[str], result: Any, params: Any,
           args: argparse.Namespace) -> Any:
    """The plane through the base (or the first model) and the next two models, or the merge when only one is left."""
    points = ([base] if base is not None else []) + models
    names = (["base"] if base is not None else []) + labels
    state = result.state_dict()
    if len(points) < 3:
        points, names = points + [state], names + [MERGED]
    extra = dict(zip(names[3:], points[3:]))
    if MERGED not in names[:3]:
        extra[MERGED] = state
    try:
        return plane(*points[:3], ctx.evaluator, resolution=args.resolution, margin=args.margin,
                     labels=tuple(names[:3]), extra=extra, params=params)
    except ConfigError as exc:
        if "collinear" not in str(exc):
            raise
        raise ConfigError("--plane: the merge lies on the line between the two models (a mean of two), so they "
                          "span no plane; give --base or a third model") from None
