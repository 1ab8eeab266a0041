"""``landscape decompose``: bias/variance/covariance decomposition of the averaged model's loss (IMA Thm. 1)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import numpy as np

from landscape import ConfigError
from landscape.infra.flags import add_option_flags
from landscape.infra.options import Options, option
from landscape_cli import datafiles, runs
from landscape_cli.commands import COMMANDS
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.commands.group import check_weights
from landscape_cli.inputs import Context, check_labels
from landscape_cli.output import emit

TERMS = ("bias", "train_bias", "heter_bias", "cross", "variance", "covariance", "wens_loss", "fma_loss", "gap")


@dataclass(frozen=True)
class DecomposeCommandOptions(Options):
    """The flags of ``landscape decompose`` beyond the decomposition's own options.

    Attributes
    ----------
    client_data
        One data file per checkpoint (with ``--module``; a run knows its clients' data).
    """

    client_data: list[str] | None = option(None, metavar="FILE",
                                           help="one data file per checkpoint (with --module; a run knows its clients' "
                                                "data), in the --data file format")


@COMMANDS.register("decompose")
def register(sub: Any) -> None:
    """Add ``decompose`` to the subcommands.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of ``landscape``.
    """
    from landscape.decomposition.options import DecomposeOptions

    p = add_analysis_command(sub, "decompose", func=run, default_models=["clients"], nmodels=(2, None),
                             help="bias/variance/covariance decomposition of the averaged model's loss (IMA Thm. 1)")
    add_option_flags(p, DecomposeCommandOptions)
    add_option_flags(p, DecomposeOptions)


def run(args: argparse.Namespace) -> int:
    """The terms of IMA Theorem 1 for the client models and their data.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of ``landscape decompose``.

    Returns
    -------
    int
        0.
    """
    from landscape import decompose

    check_weights(args.weights)
    ctx = Context(args)
    if args.weights is not None and len(args.weights) != len(ctx.models):
        raise ConfigError(f"--weights: {len(args.weights)} weights for {len(ctx.models)} models")
    if ctx.run is not None:
        if args.client_data:
            raise ConfigError("--client-data goes with --module; a run knows its clients' data")
        by_client = runs.run_client_data(ctx.run)
        ids = [int(label.split()[1]) for label in ctx.models if label.startswith("client")]
        if len(ids) != len(ctx.models):
            raise ConfigError("decompose takes client models only (--models clients or client:K ...)")
        client_data = [by_client[k] for k in ids]
    else:
        if not args.client_data or len(args.client_data) != len(ctx.models):
            raise ConfigError(f"--client-data needs one data file per checkpoint ({len(ctx.models)})")
        client_data = [datafiles.load_tensor_file(p) for p in args.client_data]
        for path, (_, targets) in zip(args.client_data, client_data):
            check_labels(targets, args.loss, f"--client-data {path}")
    dec = decompose(list(ctx.models.values()), client_data, ctx.evaluator, weights=args.weights)
    numbers: dict[str, Any] = {name: getattr(dec, name) for name in TERMS}
    numbers["locality"] = dict(zip(ctx.models, np.atleast_1d(dec.locality)))
    emit(ctx, numbers, {"decomposition": dec})
    return 0
