"""The keyword groups of the curvature functions as option sets: solver, trace, density, operator.

Each class declares once the keyword arguments of :func:`~landscape.curvature.functions.hessian_eigen`,
``hessian_trace`` and ``hessian_density`` that the command line offers, with the functions'
defaults, their ranges (iteration budgets bounded by :data:`~.budget.MAX_ITERATIONS`), help and
source. The ``landscape`` curvature commands generate their flags from them and ``docs/api.md``
lists them. Method and kind names are the registries' live names (:mod:`.registry`); each kind's
own options are declared by the kind (its class's ``Options``) and reach it through
``kind_options`` (``--kind-option KEY=VALUE``), checked against that declaration.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..infra.flags import key_value
from ..infra.options import Options, option, seed_option
from .budget import MAX_ITERATIONS, MAX_RUNS
from .gauss_newton import MAX_MC_SAMPLES
from .hessian import HVP_MODES
from .registry import EIGEN_SOLVERS, OPERATOR_KINDS, TRACE_ESTIMATORS

PYHESSIAN = "PyHessian (Yao et al. 2020)"


@dataclass(frozen=True)
class EigenOptions(Options):
    """The eigen-solver of the top eigenvalues and its budget.

    Attributes
    ----------
    k
        Number of top eigenvalues.
    tol
        Relative residual tolerance.
    max_iter
        Operator products at most per model.
    seed
        Seed of the start vectors (and of the Fisher's labels).
    method
        Registered eigen-solver.
    """

    configures = ("landscape.hessian_eigen", "landscape.claims.flatter")

    k: int = option(1, ge=1, source=PYHESSIAN, help="number of top eigenvalues")
    tol: float = option(1e-3, gt=0, source=PYHESSIAN,
                        help="relative residual tolerance: converged when ||Hx - theta x|| <= tol |theta|")
    max_iter: int = option(100, ge=1, le=MAX_ITERATIONS, source=PYHESSIAN,
                           help="operator products at most per model (Lanczos: restarts included; power: per "
                                "eigenvalue)")
    seed: int = seed_option("seed of the random start vectors (and of the Fisher's labels)")
    method: str = option("lanczos", choices=EIGEN_SOLVERS,
                         help="eigen-solver: lanczos (k largest algebraic) or power (deflated power iteration, "
                              "largest magnitude)")


@dataclass(frozen=True)
class TraceOptions(Options):
    """The stochastic trace estimator and its stopping rule.

    Attributes
    ----------
    method
        Registered trace estimator.
    tol
        Stop once the standard error is at most ``tol`` times the trace's magnitude.
    max_iter
        Operator products at most per model.
    min_samples
        Probes before the stopping test.
    seed
        Seed of the probes.
    """

    configures = ("landscape.hessian_trace",)

    method: str = option("hutch++", choices=TRACE_ESTIMATORS,
                         help="hutchinson (Rademacher probes) or hutch++ (low-rank part plus Hutchinson on the rest)")
    tol: float = option(5e-2, gt=0, help="stop at stderr <= tol |trace|")
    max_iter: int = option(100, ge=1, le=MAX_ITERATIONS,
                           help="operator products at most per model (Hutch++ holds max-iter / 3 vectors at once)")
    min_samples: int = option(10, ge=1, help="probes before the stopping test")
    seed: int = seed_option("seed of the probes")


@dataclass(frozen=True)
class DensityOptions(Options):
    """Stochastic Lanczos quadrature of the eigenvalue density and its Gaussian broadening.

    Attributes
    ----------
    iterations
        Lanczos steps per probe.
    runs
        Rademacher probes.
    sigma
        Gaussian width; None: 0.5% of the node spread.
    grid_size
        Points of the density grid.
    seed
        Seed of the probes.
    """

    configures = ("landscape.hessian_density",)

    iterations: int = option(100, ge=1, le=MAX_ITERATIONS, source=PYHESSIAN,
                             help="Lanczos steps per probe (the basis holds them all: bases larger than the "
                                  "available memory are refused)")
    runs: int = option(1, ge=1, le=MAX_RUNS, source=PYHESSIAN, help="Rademacher probes")
    sigma: float | None = option(None, gt=0, help="Gaussian width (default: 0.5% of the node spread)")
    grid_size: int = option(2001, ge=2, help="points of the density grid")
    seed: int = seed_option("seed of the probes")


@dataclass(frozen=True)
class OperatorOptions(Options):
    """Which curvature matrix, over which parameters, with which products.

    Attributes
    ----------
    kind
        Registered curvature operator: ``hessian``, ``ggn``, ``fisher``, ``empirical_fisher``, ``kfac``, ``ekfac``.
    kind_options
        The kind's own options (declared by the kind), ``KEY=VALUE`` pairs on the command line.
    mc_samples
        Short for ``kind_options={"mc_samples": ...}`` (the Fisher's labels per input).
    hvp
        Short for ``kind_options={"hvp": ...}`` (the Hessian's products).
    params
        ``fnmatch`` patterns of the parameters to differentiate; None: every trainable one.
    include_frozen
        Also differentiate parameters with ``requires_grad=False``.
    """

    configures = ("landscape.hessian_eigen", "landscape.hessian_trace", "landscape.hessian_density")

    kind: str = option("hessian", choices=OPERATOR_KINDS,
                       help="the curvature matrix: hessian, ggn (generalised Gauss-Newton), fisher (Monte-Carlo "
                            "Fisher, labels drawn from the model) or empirical_fisher (per-sample gradients at the "
                            "data's labels), kfac or ekfac (Kronecker-factored GGN of the Linear and Conv2d layers); "
                            "ggn and fisher need the cross_entropy or mse loss")
    kind_options: dict[str, Any] | None = option(
        None, flag="--kind-option", parse=key_value, repeat=True, metavar="KEY=VALUE",
        help="the kind's own options (on the command line KEY=VALUE, repeatable, VALUE as JSON or text): hvp "
             "(hessian), mc_samples (fisher), per_sample (empirical_fisher), fisher_type and mc_samples (kfac, "
             "ekfac); each kind's table in docs/api.md")
    mc_samples: int = option(1, ge=1, le=MAX_MC_SAMPLES,
                             help="short for --kind-option mc_samples=N: labels drawn per input for kind fisher "
                                  "(seeded by seed)")
    hvp: str = option("auto", choices=HVP_MODES,
                      help="short for --kind-option hvp=MODE: Hessian-vector products of kind hessian (retained: "
                           "one autograd graph per batch reused; faster on CPU, more memory)")
    params: list[str] | None = option(None, metavar="PATTERN",
                                      help="restrict the curvature to parameters whose names match these patterns")
    include_frozen: bool = option(False, help="include parameters with requires_grad=False (left out by default)")
