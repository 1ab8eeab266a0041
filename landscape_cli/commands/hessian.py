"""``landscape hessian``.

Top Hessian (or GGN, Fisher) eigenvalues (Lanczos or power iteration), optionally trace and density.

Also the flag groups shared by the curvature commands (``trace``, ``density``) and by
``check flatter``: :func:`lanczos_parent` and :func:`curvature_parent`.
"""
from __future__ import annotations

import argparse
from typing import Any, Callable

from landscape_cli.commands import COMMANDS
from landscape_cli.commands.base import add_analysis_command
from landscape_cli.inputs import Context
from landscape_cli.limits import MAX_ITERATIONS, iteration_count
from landscape_cli.output import emit
from landscape_cli.parsing import api_default, number, positive_float, positive_int, seed_int


def lanczos_parent(function: Callable[..., Any]) -> argparse.ArgumentParser:
    """The solver flags of an eigenvalue computation: ``--k``, ``--tol``, ``--max-iter``, ``--seed``.

    Parameters
    ----------
    function : Callable
        The API function the flags feed (``landscape.hessian_eigen``, ``claims.flatter``);
        its defaults are the flags' defaults.

    Returns
    -------
    argparse.ArgumentParser
        A parent parser without help of its own.
    """
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--k", type=positive_int, default=api_default(function, "k"), help="number of top eigenvalues")
    parent.add_argument("--tol", type=positive_float, default=api_default(function, "tol"),
                        help="relative residual tolerance")
    parent.add_argument("--max-iter", type=iteration_count, default=api_default(function, "max_iter"),
                        help=f"Hessian-vector products at most per model (up to {MAX_ITERATIONS:,})")
    parent.add_argument("--seed", type=seed_int, default=api_default(function, "seed"),
                        help="seed of the random start vectors")
    return parent


def curvature_parent() -> argparse.ArgumentParser:
    """The flags of the curvature operator.

    ``--kind``, ``--mc-samples``, ``--hvp``, ``--params`` and ``--include-frozen``.

    Returns
    -------
    argparse.ArgumentParser
        A parent parser without help of its own.
    """
    from landscape import hessian_eigen
    from landscape.curvature.gauss_newton import MAX_MC_SAMPLES
    from landscape.curvature.operators import HVP_MODES
    from landscape.curvature.registry import OPERATOR_KINDS

    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("curvature operator")
    group.add_argument("--kind", default=api_default(hessian_eigen, "kind"), choices=OPERATOR_KINDS.names(),
                       help="the curvature matrix: hessian, ggn (generalised Gauss-Newton), fisher (Monte-Carlo "
                            "Fisher, labels drawn from the model) or empirical_fisher (per-sample gradients at "
                            "the data's labels); ggn and fisher need the cross_entropy or mse loss")
    group.add_argument("--mc-samples", type=number(int, ge=1, le=MAX_MC_SAMPLES),
                       default=api_default(hessian_eigen, "mc_samples"),
                       help="labels drawn per input for --kind fisher (seeded by --seed)")
    group.add_argument("--hvp", default=api_default(hessian_eigen, "hvp"), choices=HVP_MODES,
                       help="Hessian-vector products (--kind hessian): forward-over-reverse, reverse-over-reverse, "
                            "retained (one autograd graph reused; faster on CPU, more memory) or auto")
    group.add_argument("--params", nargs="+", metavar="PATTERN",
                       help="restrict the curvature to parameters whose names match these patterns")
    group.add_argument("--include-frozen", action="store_true",
                       help="include parameters with requires_grad=False (left out by default)")
    return parent


@COMMANDS.register("hessian")
def register(sub: Any) -> None:
    """Add ``hessian`` to the subcommands.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommands of ``landscape``.
    """
    from landscape import hessian_density, hessian_eigen
    from landscape.curvature.registry import EIGEN_SOLVERS

    p = add_analysis_command(sub, "hessian", func=run, parents=(lanczos_parent(hessian_eigen), curvature_parent()),
                             default_models=["global"], nmodels=(1, None),
                             help="top Hessian (or GGN, Fisher) eigenvalues, optional trace and spectral density")
    p.add_argument("--method", default=api_default(hessian_eigen, "method"), choices=EIGEN_SOLVERS.names(),
                   help="eigen-solver: lanczos (k largest algebraic) or power (deflated power iteration, "
                        "largest magnitude)")
    p.add_argument("--trace", action="store_true", help="also the trace (Hutchinson; 'landscape trace' for more)")
    p.add_argument("--density", action="store_true", help="also the spectral density (SLQ; 'landscape density')")
    p.add_argument("--iterations", type=iteration_count, default=api_default(hessian_density, "iterations"),
                   help=f"Lanczos steps of the density, at most {MAX_ITERATIONS:,}")


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

    ctx = Context(args)
    numbers: dict[str, Any] = {}
    results: dict[str, Any] = {}
    densities = {}
    operator = operator_options(args)
    for label, model in ctx.models.items():
        eig = hessian_eigen(model, ctx.evaluator, k=args.k, tol=args.tol, max_iter=args.max_iter, seed=args.seed,
                            method=args.method, **operator)
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


def operator_options(args: argparse.Namespace) -> dict[str, Any]:
    """The curvature operator's keyword arguments of the API functions, from the flags of :func:`curvature_parent`.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of a curvature command.

    Returns
    -------
    dict[str, Any]
        ``kind``, ``mc_samples``, ``params``, ``hvp`` and ``include_frozen``.
    """
    return {"kind": args.kind, "mc_samples": args.mc_samples, "params": args.params, "hvp": args.hvp,
            "include_frozen": args.include_frozen}


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
