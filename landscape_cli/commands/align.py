"""``landscape align``.

Permute a model's hidden units to match a reference (Git Re-Basin), write it, and compare the line
barriers to the reference before and after.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from landscape.infra.flags import add_option_flags
from landscape.infra.options import Options, option
from landscape.space.checkpoints import check_save_path
from landscape_cli.commands import COMMANDS
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.inputs import Context
from landscape_cli.output import emit

#: Alphas of the line to the reference before and after alignment.
ALIGN_ALPHAS = 11


def checkpoint_path(text: str) -> str:
    """``--save``: the file name as typed, once :func:`landscape.space.checkpoints.check_save_path` accepts it.

    Parameters
    ----------
    text : str
        A file name ending in .safetensors, .pt or .pth.

    Returns
    -------
    str
        ``text``.
    """
    check_save_path(text)
    return text


@dataclass(frozen=True)
class AlignCommandOptions(Options):
    """The flags of ``landscape align`` beyond the alignment's own options.

    Attributes
    ----------
    save
        Where the aligned checkpoint goes.
    """

    save: str | None = option(None, metavar="FILE", required=True, parse=checkpoint_path,
                              help="where the aligned checkpoint goes (.safetensors, .pt or .pth)")


@COMMANDS.register("align")
def register(sub: Any) -> None:
    """Add ``align`` to the subcommands.

    Options of ``landscape.connectivity.align_file`` (:class:`landscape.alignment.options.AlignOptions`), and
    the alphas of the lines to the reference before and after.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of ``landscape``.
    """
    from landscape.alignment.options import AlignOptions
    from landscape.geometry.options import PathOptions

    p = add_analysis_command(sub, "align", func=run, default_models=None, nmodels=(2, 2),
                             help="permute the hidden units of MODEL to match REFERENCE (Git Re-Basin); "
                                  "models: MODEL REFERENCE")
    add_option_flags(p, AlignCommandOptions)
    add_option_flags(p, AlignOptions)
    add_option_flags(p, PathOptions, defaults={"alphas": ALIGN_ALPHAS})


def run(args: argparse.Namespace) -> int:
    """Align the first model to the second, write it, and measure both lines to the reference.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of ``landscape align``.

    Returns
    -------
    int
        0.
    """
    from landscape import interpolate
    from landscape_cli.connectivity_commands import align_file

    ctx = Context(args)
    (label, model), (ref_label, reference) = ctx.models.items()
    summary = align_file(model, reference, args.save, template=ctx.module, data=ctx.data, method=args.method,
                         seed=args.seed, strict=args.strict)
    before = interpolate(reference, model, ctx.evaluator, alphas=args.alphas)
    after = interpolate(reference, summary["out"], ctx.evaluator, alphas=args.alphas)
    numbers = {"model": label, "reference": ref_label, **summary,
               "loss_barrier_before": before.loss_barrier, "loss_barrier_after": after.loss_barrier,
               "accuracy_barrier_before": before.accuracy_barrier, "accuracy_barrier_after": after.accuracy_barrier}

    def draw() -> dict[str, Any]:
        from figures.paths import path_figure

        return {"align.png": path_figure({f"{ref_label} → {label}": before,
                                          f"{ref_label} → {label} (aligned)": after}, endpoint_labels=None)}

    emit(ctx, numbers, {"before": before, "after": after}, draw)
    return 0
