"""``landscape align``.

Permute a model's hidden units to match a reference (Git Re-Basin), write it, and compare the line
barriers to the reference before and after; or, with ``--check``, check that alignment is valid for a
model's architecture (:func:`landscape.alignment.check.check_alignment`).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from landscape.infra.errors import ConfigError
from landscape.infra.flags import add_option_flags
from landscape.infra.options import Options, option
from landscape.space.checkpoints import check_save_path
from landscape_cli.commands import COMMANDS
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.inputs import Context
from landscape_cli.output import emit

#: Alphas of the line to the reference before and after alignment.
ALIGN_ALPHAS = 11
#: Inputs of the data that ``--check`` compares the outputs on.
CHECK_SAMPLES = 64


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
        Where the aligned checkpoint goes (needed unless ``--check``).
    check_spec
        ``--check``: check the permutation spec of the one model instead of aligning.
    spec_json
        Where ``--check`` writes the spec and its findings as JSON.
    """

    save: str | None = option(None, metavar="FILE", parse=checkpoint_path,
                              help="where the aligned checkpoint goes (.safetensors, .pt or .pth; needed unless "
                                   "--check)")
    check_spec: bool = option(False, flag="--check",
                              help="check that alignment is valid for the architecture of one model MODEL: permute "
                                   "every traced group at random (--seed) and compare the outputs on the data; list "
                                   "the units that cannot be permuted and why; exit 1 if the outputs change")
    spec_json: str | None = option(None, metavar="FILE",
                                   help="with --check: write the groups (parameter names and axes) and the "
                                        "unpermutable units as JSON")


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

    p = add_analysis_command(sub, "align", func=run, default_models=None, nmodels=(1, 2),
                             help="permute the hidden units of MODEL to match REFERENCE (Git Re-Basin); "
                                  "models: MODEL REFERENCE, or MODEL with --check")
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
        0; with ``--check`` 0 when the permuted model's outputs are unchanged, 1 when they change.

    Raises
    ------
    ConfigError
        Without ``--save`` (unless ``--check``), or with the wrong number of models.
    """
    from landscape import interpolate
    from landscape_cli.connectivity_commands import align_file

    if args.spec_json and not args.check:
        raise ConfigError("--spec-json goes with --check")
    if not args.check and args.save is None:
        raise ConfigError("'align' needs --save FILE for the aligned checkpoint (or --check to check one model's "
                          "permutation spec)")
    ctx = Context(args)
    want = 1 if args.check else 2
    if len(ctx.models) != want:
        raise ConfigError(f"'align{' --check' if args.check else ''}' needs exactly {want} models, got "
                          f"{len(ctx.models)}: {list(ctx.models)}")
    if args.check:
        return check(ctx)
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


def check(ctx: Context) -> int:
    """``landscape align --check``: check the permutation spec of the one model on the data's inputs.

    Parameters
    ----------
    ctx : Context
        The command's inputs (one model).

    Returns
    -------
    int
        0 when the permuted model's outputs are unchanged to float rounding, 1 when they change or
        the model cannot be traced.
    """
    import sys

    from landscape.alignment.align import as_module
    from landscape.alignment.check import check_alignment
    from landscape.evaluation.batches import first_inputs

    args = ctx.args
    module = as_module(next(iter(ctx.models.values())), ctx.module)
    result = check_alignment(module, example_input=first_inputs(ctx.data, CHECK_SAMPLES), seed=args.seed)
    if args.spec_json:
        result.to_json(args.spec_json)
        print(f"wrote {args.spec_json}", file=sys.stderr)
    emit(ctx, {"model": next(iter(ctx.models)), **result.numbers()}, {})
    return 0 if result.passed else 1
