"""``landscape align``.

Permute a model's hidden units to match a reference (Git Re-Basin), write it, and compare the line
barriers to the reference before and after.
"""
from __future__ import annotations

import argparse
from typing import Any

from landscape.space.checkpoints import check_save_path
from landscape_cli.commands import COMMANDS
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.inputs import Context
from landscape_cli.output import emit
from landscape_cli.parsing import api_default, checked, count_at_least_2, seed_int

#: ``--save``: a file name ending in .safetensors, .pt or .pth, checked by
#: :func:`landscape.space.checkpoints.check_save_path`.
checkpoint_path = checked(check_save_path)


@COMMANDS.register("align")
def register(sub: Any) -> None:
    """Add ``align`` to the subcommands.

    Options of ``landscape.connectivity.align_file``, defaults from ``landscape.connectivity.match``.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of ``landscape``.
    """
    from landscape.alignment.matchers import MATCHERS
    from landscape.connectivity import match

    p = add_analysis_command(sub, "align", func=run, default_models=None, nmodels=(2, 2),
                             help="permute the hidden units of MODEL to match REFERENCE (Git Re-Basin); "
                                  "models: MODEL REFERENCE")
    p.add_argument("--save", metavar="FILE", required=True, type=checkpoint_path,
                   help="where the aligned checkpoint goes (.safetensors, .pt or .pth)")
    p.add_argument("--method", default=api_default(match, "method"), choices=MATCHERS.names(),
                   help="weight matching (Git Re-Basin Alg. 1) or activation matching (Sec. 3.1, on --data)")
    p.add_argument("--seed", type=seed_int, default=api_default(match, "seed"),
                   help="order of the weight-matching sweeps")
    p.add_argument("--no-strict", dest="strict", action="store_false",
                   help="leave the units of operations that cannot be permuted in place instead of refusing")
    p.add_argument("--alphas", type=count_at_least_2, default=11,
                   help="alphas of the line to the reference before and after alignment")


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
