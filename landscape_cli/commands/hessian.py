"""``landscape hessian``.

Top Hessian (or GGN, Fisher) eigenvalues (Lanczos or power iteration), optionally trace and density.

Also what the curvature commands (``trace``, ``density``) share: the ``curvature operator``
flags (:func:`curvature_parent`) and the operator's keyword arguments (:func:`operator_options`).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from landscape.infra.flags import add_option_flags, option_values
from landscape.infra.options import Options, option
from landscape_cli.commands import COMMANDS
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.inputs import Context
from landscape_cli.output import DryRunOptions, emit, emit_estimates


@dataclass(frozen=True)
class HessianCommandOptions(Options):
    """The flags of ``landscape hessian`` beyond the eigen-solver's and the operator's options.

    Attributes
    ----------
    trace
        Also the trace (with the eigen-solver's ``tol``, ``max_iter`` and ``seed``).
    density
        Also the spectral density (with the density's ``iterations``).
    """

    trace: bool = option(False, help="also the trace (Hutchinson; 'landscape trace' for more)")
    density: bool = option(False, help="also the spectral density (SLQ; 'landscape density')")


def curvature_parent() -> argparse.ArgumentParser:
    """The ``curvature operator`` flags (:class:`landscape.curvature.options.OperatorOptions`).

    Returns
    -------
    argparse.ArgumentParser
        A parent parser without help of its own.
    """
    from landscape.curvature.options import OperatorOptions

    parent = argparse.ArgumentParser(add_help=False)
    add_option_flags(parent.add_argument_group("curvature operator"), OperatorOptions)
    return parent


@COMMANDS.register("hessian")
def register(sub: Any) -> None:
    """Add ``hessian`` to the subcommands.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of ``landscape``.
    """
    from landscape.curvature.options import DensityOptions, EigenOptions

    p = add_analysis_command(sub, "hessian", func=run, parents=(curvature_parent(),), default_models=["global"],
                             nmodels=(1, None),
                             help="top Hessian (or GGN, Fisher) eigenvalues, optional trace and spectral density")
    add_option_flags(p, EigenOptions)
    add_option_flags(p, HessianCommandOptions)
    add_option_flags(p, DensityOptions, only=("iterations",))
    add_option_flags(p, DryRunOptions)


def run(args: argparse.Namespace) -> int:
    """Top-k eigenvalues of each model's curvature (``--kind``), with trace and density on request.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of ``landscape hessian``.

    Returns
    -------
    int
        0.
    """
    from landscape import hessian_density, hessian_eigen, hessian_trace
    from landscape.curvature.options import EigenOptions

    ctx = Context(args)
    numbers: dict[str, Any] = {}
    results: dict[str, Any] = {}
    densities = {}
    operator = operator_options(args)
    if args.dry_run:
        return emit_estimates(ctx, {f"{label} {part}": estimate for label, model in ctx.models.items()
                                    for part, estimate in estimate_model(model, ctx.evaluator, args).items()})
    for label, model in ctx.models.items():
        eig = hessian_eigen(model, ctx.evaluator, **option_values(EigenOptions, args), **operator)
        entry: dict[str, Any] = {"eigenvalues": eig.values, "converged": eig.converged, "hvps": eig.matvecs}
        results[f"{label} eigen"] = eig
        if args.trace:
            tr = hessian_trace(model, ctx.evaluator, tol=args.tol, max_iter=args.max_iter, seed=args.seed, **operator)
            entry.update(trace=tr.value, trace_stderr=tr.stderr)
            results[f"{label} trace"] = tr
        if args.density:
            densities[label] = hessian_density(model, ctx.evaluator, iterations=args.iterations, seed=args.seed,
                                               **operator)
            results[f"{label} density"] = densities[label]
        numbers[label] = entry
    emit(ctx, numbers, results, (lambda: density_figures(densities)) if densities else None)
    return 0


def estimate_model(model: Any, evaluator: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The dry runs of ``landscape hessian`` at one model: eigenvalues, and the trace and density asked for.

    Parameters
    ----------
    model : model-like
        The point.
    evaluator : landscape.Evaluator
        The command's evaluator.
    args : argparse.Namespace
        Parsed arguments of ``landscape hessian``.

    Returns
    -------
    dict[str, JobEstimate]
        ``"eigen"``, ``"trace"``, ``"density"`` -> estimate.
    """
    from landscape import hessian_density, hessian_eigen, hessian_trace
    from landscape.curvature.options import EigenOptions

    operator = operator_options(args)
    found = {"eigen": hessian_eigen(model, evaluator, **option_values(EigenOptions, args), **operator, dry_run=True)}
    if args.trace:
        found["trace"] = hessian_trace(model, evaluator, tol=args.tol, max_iter=args.max_iter, seed=args.seed,
                                       **operator, dry_run=True)
    if args.density:
        found["density"] = hessian_density(model, evaluator, iterations=args.iterations, seed=args.seed, **operator,
                                           dry_run=True)
    return found


def operator_options(args: argparse.Namespace) -> dict[str, Any]:
    """The curvature operator's keyword arguments of the API functions, from the flags of :func:`curvature_parent`.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of a curvature command.

    Returns
    -------
    dict[str, Any]
        ``kind``, ``kind_options`` (the ``--kind-option KEY=VALUE`` pairs as a dict; a key given
        twice keeps its last value), ``mc_samples``, ``hvp``, ``params`` and ``include_frozen``.
    """
    from landscape.curvature.options import OperatorOptions

    values = option_values(OperatorOptions, args)
    values["kind_options"] = dict(values["kind_options"] or ())
    return values


def density_figures(densities: dict[str, Any]) -> dict[str, Any]:
    """The PNG and HTML figures of spectral densities.

    Parameters
    ----------
    densities : dict[str, SpectralDensity]
        Model label -> density.

    Returns
    -------
    dict[str, Any]
        File name -> figure.
    """
    from figures.curvature import spectral_density_figure, spectral_density_plotly

    return {"hessian_density.png": spectral_density_figure(densities),
            "hessian_density.html": spectral_density_plotly(densities)}
