"""``landscape curve``.

Train a Bezier curve or polygonal chain between two models (Garipov et al. 2018) and compare its
barriers with the straight line's.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from landscape import ConfigError
from landscape.infra.flags import add_option_flags, option_values
from landscape.infra.options import Options, option
from landscape_cli import datafiles, runs
from landscape_cli.commands import COMMANDS
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.inputs import Context, check_labels
from landscape_cli.output import DryRunOptions, emit, emit_estimates


@dataclass(frozen=True)
class CurveCommandOptions(Options):
    """The flags of ``landscape curve`` beyond the curve's own options.

    Attributes
    ----------
    train_data
        The data the bends are trained on.
    """

    train_data: str | None = option(None, metavar="DATA",
                                    help="data the bends are trained on (default: the run's client data, or the train "
                                         "split of the --data dataset); same formats as --data")


@COMMANDS.register("curve")
def register(sub: Any) -> None:
    """Add ``curve`` to the subcommands (options of :class:`landscape.connectivity.options.CurveOptions`).

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of ``landscape``.
    """
    from landscape.connectivity.options import CurveOptions

    p = add_analysis_command(sub, "curve", func=run, default_models=["clients"], keep_clients=2, nmodels=(2, 2),
                             help="train a Bezier curve / polygonal chain between two models and compare its "
                                  "barriers with the line's (Garipov et al. 2018)")
    add_option_flags(p, CurveCommandOptions)
    add_option_flags(p, CurveOptions)
    add_option_flags(p, DryRunOptions)


def training_data(ctx: Context, args: argparse.Namespace) -> Any:
    """The data the curve is trained on.

    Parameters
    ----------
    ctx : Context
        The command's inputs.
    args : argparse.Namespace
        Parsed arguments (``--train-data``, ``--data``, ``--data-root``, ``--loss``).

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]

    Raises
    ------
    ConfigError
        With ``--module`` and a data file but no ``--train-data``.
    """
    if args.train_data:
        data = datafiles.load_data(args.train_data, split="train", root=args.data_root, flatten=args.flatten)
        check_labels(data[1], args.loss, f"--train-data {args.train_data}")
        return data
    if ctx.run is not None:
        return runs.run_data(ctx.run, "train")
    if datafiles.is_file_spec(args.data):
        raise ConfigError("--train-data is needed when --data is a file (the curve is trained on other data "
                          "than it is measured on)")
    return datafiles.load_data(args.data, split="train", root=args.data_root, flatten=args.flatten)


def run(args: argparse.Namespace) -> int:
    """Train the curve between the two models and report curve and line barriers.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of ``landscape curve``.

    Returns
    -------
    int
        0.
    """
    from landscape.cache.store import make_key
    from landscape.connectivity.options import CurveOptions
    from landscape_cli.connectivity_commands import curve_summary

    ctx = Context(args)
    (la, a), (lb, b) = ctx.models.items()
    training = option_values(CurveOptions, args)
    training.pop("kind")
    if args.dry_run:
        from landscape import curve

        return emit_estimates(ctx, {"curve": curve(a, b, ctx.evaluator, kind=args.kind,
                                                   train_data=training_data(ctx, args), **training, dry_run=True)})
    cache = ctx.evaluator.cache
    key = make_key({"command": "curve", "models": [la, lb], "kind": args.kind, "training": training,
                    "train_data": args.train_data or args.data or args.run, "evaluator": ctx.evaluator.fingerprint()})
    summary = curve_summary(a, b, ctx.evaluator, train_data=training_data(ctx, args), kind=args.kind,
                            cache=None if cache is None else cache.path, key=key, **training)
    emit(ctx, {"from": la, "to": lb, **summary}, {})
    return 0
