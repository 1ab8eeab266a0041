"""Curvature spectra of an evaluator's loss at a point: top eigenvalues, trace and density.

The Hessian is that of the loss averaged over *all* of the evaluator's data (sum of per-sample
losses divided by the sample count) with respect to the trainable parameters (those with
``requires_grad``; ``params`` name patterns narrow the choice, ``include_frozen=True`` widens
it); buffers are fixed and BatchNorm runs in eval mode with the running statistics the
evaluator's BatchNorm mode gives the point (``recompute`` re-estimates them first). Every
random choice is seeded. With a cache, each result is stored under a key made of the point's
weights, the evaluator's fingerprint and every option.

Methods are looked up in :mod:`.registry` (PyHessian, Yao et al. 2020, computes the same three
quantities): top-k by thick-restart Lanczos (``"lanczos"``, default) or deflated power
iteration (``"power"``); trace by Hutch++ (``"hutch++"``, default) or Hutchinson
(``"hutchinson"``); density by stochastic Lanczos quadrature with Gaussian broadening.
``kind`` picks the curvature matrix (:func:`.at_point.curvature_operator`): the Hessian (default),
the generalised Gauss-Newton matrix ``"ggn"``, the Monte-Carlo ``"fisher"`` (labels drawn with
``seed``) or the ``"empirical_fisher"``; ``kind_options`` its own options, checked against the
kind's declaration (``hvp=`` and ``mc_samples=`` are short for the Hessian's and the Fisher's).
The kind and its options are recorded in the result's spec (:func:`.at_point.operator_options`) and enter
the cache key, so a result of one kind is never read back as another's.
"""
from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any, Callable, Sequence

import torch

from ..cache.store import make_key
from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError
from ..infra.estimate import JobEstimate
from ..results.base import Result
from ..results.curvature import Eigenvalues, HessianEigen, SpectralDensity, TraceEstimate
from ..space.params import ModelLike, vector_digest
from . import lanczos, power, trace  # noqa: F401  (register the built-in methods)
from .at_point import KindOptions, curvature_operator, flat_point, operator_options
from .budget import MAX_ITERATIONS, MAX_RUNS, check_count
from .density import broadened_density, slq
from .estimate import ProductPlan, density_plan, eigen_plan, trace_plan
from .operators import CurvatureOperator
from .registry import EIGEN_SOLVERS, TRACE_ESTIMATORS
from .second_order import ATTENTION_KERNEL

ALGORITHM_VERSION = "curvature-2"
#: ``params=``: parameter-name patterns (``fnmatch``), one pattern, or None for every trainable parameter.
Params = Sequence[str] | str | None


def hessian_eigen(model: ModelLike | torch.Tensor, evaluator: PointEvaluator, *, k: int = 1, tol: float = 1e-3,
                  max_iter: int = 100, seed: int = 0, method: str = "lanczos", params: Params = None,
                  return_eigenvectors: bool = False, hvp: str = "auto", include_frozen: bool = False,
                  point_ready: bool = False, kind: str = "hessian", mc_samples: int = 1,
                  kind_options: KindOptions = None, dry_run: bool = False) -> HessianEigen | JobEstimate:
    """The ``k`` largest Hessian (or GGN, Fisher) eigenvalues with residuals and the number of products used.

    Parameters
    ----------
    model
        A model-like or a flat vector of the evaluator's space.
    evaluator
        The :class:`~landscape.Evaluator` whose loss is differentiated.
    k
        Number of eigenvalues.
    tol
        Converged when each residual ``||Hx - theta x|| <= tol |theta|``.
    max_iter
        Budget of Hessian-vector products (Lanczos: restarts included; power: per eigenvalue), at
        most :data:`~.budget.MAX_ITERATIONS`.
    seed
        Seed of the start vectors (and of the Fisher's labels).
    method
        ``"lanczos"`` (k largest *algebraic*) or ``"power"`` (largest *magnitude*, as PyHessian),
        or any registered solver.
    params
        ``fnmatch`` patterns of the parameters to differentiate (default: all trainable ones).
    return_eigenvectors
        Also return eigenvectors (rows, over the selected parameters).
    hvp
        Short for ``kind_options={"hvp": hvp}``: how Hessian-vector products are computed
        (``auto``, ``forward-over-reverse``, ``reverse-over-reverse``, ``retained``).
    include_frozen
        Also differentiate parameters with ``requires_grad=False``.
    point_ready
        The flat vector already carries the buffers of the evaluator's BatchNorm mode (used by
        paths and planes, which apply the mode with their own reference).
    kind
        The curvature matrix: ``"hessian"``, ``"ggn"``, ``"empirical_fisher"`` or ``"fisher"``
        (see :func:`~landscape.curvature.at_point.curvature_operator`), or any registered kind.
    mc_samples
        Short for ``kind_options={"mc_samples": mc_samples}``: labels drawn per input for
        ``kind="fisher"``.
    kind_options
        The kind's own options (``{"per_sample": "vmap"}`` for ``"empirical_fisher"``), checked
        against its declaration; recorded in the spec when they differ from the defaults.
    dry_run
        Compute nothing: return what the eigenvalues will cost (products, memory, cache, time;
        :mod:`.estimate`).

    Returns
    -------
    HessianEigen or JobEstimate
        A warning is issued when the solver did not converge (``converged`` is False);
        ``spec["operator"]`` is the kind. With ``dry_run=True`` the
        :class:`~landscape.infra.estimate.JobEstimate` (``max_iter`` products for Lanczos,
        ``k x max_iter`` for power iteration: upper bounds).

    Raises
    ------
    ConfigError
        ``max_iter`` outside ``[1, MAX_ITERATIONS]``, a Lanczos basis (which grows with ``k``)
        larger than the memory available on the evaluator's device, an unknown ``kind``, an
        option it does not declare (one line naming the kind and its options) or a bad value.
    """
    check_count(max_iter, "max_iter", MAX_ITERATIONS)
    EIGEN_SOLVERS.get(method)
    operator, resolved = operator_options(kind, kind_options, include_frozen, hvp=hvp, mc_samples=mc_samples)
    options = dict(k=k, tol=tol, max_iter=max_iter, seed=seed, method=method, params=params,
                   vectors=return_eigenvectors, **operator)
    compute = functools.partial(eigen_result, k=k, tol=tol, max_iter=max_iter, seed=seed, method=method,
                                return_vectors=return_eigenvectors)
    plan = eigen_plan(method, k, max_iter) if dry_run else None
    result = computed_at_point("hessian_eigen", model, evaluator, options, compute, kind_options=resolved,
                               point_ready=point_ready, plan=plan)
    if dry_run:
        return result
    if not result.converged:
        warnings.warn(f"hessian_eigen: {method} did not reach tol={tol} within max_iter={max_iter} products "
                      f"(residuals {result.residuals.tolist()}); raise max_iter or tol", stacklevel=2)
    return result


def eigen_result(op: Any, *, k: int, tol: float, max_iter: int, seed: int, method: str,
                 return_vectors: bool = False) -> HessianEigen:
    """The ``k`` largest eigenvalues of ``op`` by the registered solver ``method``.

    Parameters
    ----------
    op
        The curvature operator (any object the solvers accept: ``matvec``, ``dim``, ``matvecs``).
    k, tol, max_iter, seed, method
        As for :func:`hessian_eigen`.
    return_vectors
        Also keep the eigenvectors (float64, CPU).

    Returns
    -------
    HessianEigen
        Values, residuals, products used, convergence, the method and the operator's dimension.
    """
    res = EIGEN_SOLVERS.get(method)(op, k, tol=tol, max_iter=max_iter, generator=_generator(seed),
                                    return_vectors=return_vectors)
    vectors = res.vectors.double().cpu().numpy() if res.vectors is not None else None
    return HessianEigen(values=res.values, residuals=res.residuals, matvecs=op.matvecs, converged=res.converged,
                        method=method, dim=op.dim, vectors=vectors, restarts=res.restarts)


def hessian_eigenvalues(model: ModelLike | torch.Tensor, evaluator: PointEvaluator, *, k: int = 1, tol: float = 1e-3,
                        max_iter: int = 100, seed: int = 0, method: str = "lanczos", params: Params = None,
                        return_eigenvectors: bool = False, hvp: str = "auto", include_frozen: bool = False,
                        kind: str = "hessian", mc_samples: int = 1,
                        kind_options: KindOptions = None,
                        dry_run: bool = False) -> Eigenvalues | tuple[Eigenvalues, Any] | JobEstimate:
    """The ``k`` largest Hessian eigenvalues, descending, as an array.

    Same computation and parameters as :func:`hessian_eigen`; the returned
    :class:`~landscape.results.curvature.Eigenvalues` is an ``np.ndarray`` that also carries
    ``converged``, ``residuals`` and ``matvecs``.

    Parameters
    ----------
    model, evaluator, k, tol, max_iter, seed, method, params, return_eigenvectors, hvp, include_frozen
        As for :func:`hessian_eigen`.
    kind, mc_samples, kind_options, dry_run
        As for :func:`hessian_eigen`.

    Returns
    -------
    Eigenvalues or tuple or JobEstimate
        The eigenvalues, or ``(values, vectors)`` with ``return_eigenvectors=True``; with
        ``dry_run=True`` the :class:`~landscape.infra.estimate.JobEstimate`.

    Examples
    --------
    Least squares on a linear model, ``L(w) = (1/N) sum_n (w . x_n - y_n)^2``, is a quadratic
    whose Hessian ``H = (2/N) sum_n x_n x_n^T`` does not depend on ``w`` or ``y``. With
    ``x_1 = (1, 0)`` and ``x_2 = (0, 2)``, ``H = diag(1, 4)``; Lanczos finds both eigenvalues.

    >>> import torch, landscape
    >>> model = torch.nn.Linear(2, 1, bias=False)
    >>> data = (torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[0.0], [1.0]]))
    >>> ev = landscape.Evaluator(model, data, loss="mse", dtype=torch.float64, progress=False)
    >>> landscape.hessian_eigenvalues(model, ev, k=2).round(6)
    array([4., 1.])
    """
    res = hessian_eigen(model, evaluator, k=k, tol=tol, max_iter=max_iter, seed=seed, method=method,
                        params=params, return_eigenvectors=return_eigenvectors, hvp=hvp,
                        include_frozen=include_frozen, kind=kind, mc_samples=mc_samples, kind_options=kind_options,
                        dry_run=dry_run)
    if isinstance(res, JobEstimate):
        return res
    return (Eigenvalues(res), res.vectors) if return_eigenvectors else Eigenvalues(res)


def hessian_trace(model: ModelLike | torch.Tensor, evaluator: PointEvaluator, *, tol: float = 5e-2, max_iter: int = 100,
                  seed: int = 0, method: str = "hutch++", params: Params = None, min_samples: int = 10,
                  hvp: str = "auto", include_frozen: bool = False, kind: str = "hessian",
                  mc_samples: int = 1, kind_options: KindOptions = None,
                  dry_run: bool = False) -> TraceEstimate | JobEstimate:
    """``tr H`` by a stochastic estimator, stopping at ``stderr <= tol |value|`` or ``max_iter`` products.

    Parameters
    ----------
    model, evaluator, params, hvp, include_frozen, kind, mc_samples, kind_options
        As for :func:`hessian_eigen`.
    tol
        Relative standard error to reach (default 5%). Measured with the default 100 Hutch++
        products: 3.5-4.5% on MNIST-1D's MLP at initialisation and 3% on a trained digits MLP
        (converged); 13-15% on MNIST-1D's CNN and 29-30% on the digits MLP at initialisation,
        whose traces are small and noisy (not converged: a warning says so).
    max_iter
        Budget of products, at most :data:`~.budget.MAX_ITERATIONS` (Hutch++ holds a sketch of
        ``max_iter // 3`` vectors).
    seed
        Seed of the probes.
    method
        ``"hutch++"`` (Meyer et al. 2021) or ``"hutchinson"`` (Hutchinson 1989), or any
        registered estimator.
    min_samples
        Least number of samples before the stopping rule applies.
    dry_run
        Compute nothing: return what the trace will cost (``max_iter`` products, an upper bound).

    Returns
    -------
    TraceEstimate or JobEstimate
        A warning is issued when the tolerance was not reached; with ``dry_run=True`` the
        :class:`~landscape.infra.estimate.JobEstimate`.

    Raises
    ------
    ConfigError
        ``max_iter`` outside ``[1, MAX_ITERATIONS]``, a Hutch++ sketch larger than the memory
        available on the evaluator's device, or a bad kind or kind option (as for :func:`hessian_eigen`).

    Examples
    --------
    Hutchinson's estimator averages ``z^T H z`` over random sign vectors ``z``, whose mean is
    ``tr H``. The least-squares problem of :func:`hessian_eigenvalues` has ``H = diag(1, 4)``:
    there every probe gives ``z_1^2 + 4 z_2^2 = 5`` exactly, so the estimate is the trace with a
    standard error of zero; Hutch++ (Meyer et al. 2021) sketches the top of the spectrum first
    and, for two parameters, computes the trace exactly too.

    >>> import torch, landscape
    >>> model = torch.nn.Linear(2, 1, bias=False)
    >>> data = (torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[0.0], [1.0]]))
    >>> ev = landscape.Evaluator(model, data, loss="mse", dtype=torch.float64, progress=False)
    >>> estimate = landscape.hessian_trace(model, ev, method="hutchinson")
    >>> round(estimate.value, 6), round(estimate.stderr, 6)
    (5.0, 0.0)
    >>> round(landscape.hessian_trace(model, ev).value, 6)
    5.0
    """
    check_count(max_iter, "max_iter", MAX_ITERATIONS)
    estimator = TRACE_ESTIMATORS.get(method)
    operator, resolved = operator_options(kind, kind_options, include_frozen, hvp=hvp, mc_samples=mc_samples)
    options = dict(tol=tol, max_iter=max_iter, seed=seed, method=method, params=params,
                   min_samples=min_samples, **operator)

    def compute(op: CurvatureOperator) -> TraceEstimate:
        return estimator(op, tol=tol, max_iter=max_iter, generator=_generator(seed), min_samples=min_samples)

    plan = trace_plan(method, max_iter) if dry_run else None
    result = computed_at_point("hessian_trace", model, evaluator, options, compute, kind_options=resolved, plan=plan)
    if dry_run:
        return result
    if not result.converged:
        warnings.warn(f"hessian_trace: relative standard error {result.relative_stderr:.2g} did not reach "
                      f"tol={tol} within max_iter={max_iter} products; raise max_iter or tol", stacklevel=2)
    return result


def hessian_density(model: ModelLike | torch.Tensor, evaluator: PointEvaluator, *, iterations: int = 100, runs: int = 1,
                    seed: int = 0, sigma: float | None = None, grid_size: int = 2001,
                    params: Params = None, hvp: str = "auto", include_frozen: bool = False, kind: str = "hessian",
                    mc_samples: int = 1, kind_options: KindOptions = None,
                    dry_run: bool = False) -> SpectralDensity | JobEstimate:
    """Eigenvalue density of the Hessian by stochastic Lanczos quadrature (Ghorbani et al. 2019).

    Parameters
    ----------
    model, evaluator, params, hvp, include_frozen, kind, mc_samples, kind_options
        As for :func:`hessian_eigen`.
    iterations
        Lanczos steps per probe (capped at the number of parameters), at most
        :data:`~.budget.MAX_ITERATIONS`; the basis holds that many vectors at once.
    runs
        Rademacher probes, at most :data:`~.budget.MAX_RUNS`.
    seed
        Seed of the probes.
    sigma
        Gaussian broadening (default 0.5% of the spread of the nodes).
    grid_size
        Least number of grid points.
    dry_run
        Compute nothing: return what the density will cost (``min(iterations, dim) x runs``
        products, exactly).

    Returns
    -------
    SpectralDensity or JobEstimate
        Integrates to one; with ``dry_run=True`` the :class:`~landscape.infra.estimate.JobEstimate`.

    Raises
    ------
    ConfigError
        ``iterations`` or ``runs`` outside their limits, a Lanczos basis larger than the memory
        available on the evaluator's device (the message gives the estimate and the limit), a
        non-positive ``sigma``, or a bad kind or kind option (as for :func:`hessian_eigen`).
    """
    check_count(iterations, "iterations", MAX_ITERATIONS)
    check_count(runs, "runs", MAX_RUNS)
    if sigma is not None and not sigma > 0:
        raise ConfigError(f"sigma must be positive, got {sigma}")
    operator, resolved = operator_options(kind, kind_options, include_frozen, hvp=hvp, mc_samples=mc_samples)
    options = dict(iterations=iterations, runs=runs, seed=seed, sigma=sigma, grid_size=grid_size,
                   params=params, **operator)

    def compute(op: CurvatureOperator) -> SpectralDensity:
        nodes, weights = slq(op, iterations, runs, generator=_generator(seed))
        grid, density, width = broadened_density(nodes, weights, sigma=sigma, grid_size=grid_size)
        return SpectralDensity(grid=grid, density=density, nodes=nodes, weights=weights, sigma=width,
                               dim=op.dim, matvecs=op.matvecs)

    plan = density_plan(iterations, runs) if dry_run else None
    return computed_at_point("hessian_density", model, evaluator, options, compute, kind_options=resolved, plan=plan)


# ------------------------------------------------------------------- plumbing
def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def spec_of(evaluator: PointEvaluator, **options: Any) -> dict[str, Any]:
    """The spec recorded with a curvature result: evaluator fingerprint, version and options.

    Parameters
    ----------
    evaluator : PointEvaluator
        Its ``fingerprint()`` (model, data, loss, BatchNorm mode) enters the spec.
    **options : Any
        Every option of the computation (``k``, ``tol``, ``method``, ...).

    Returns
    -------
    dict[str, Any]
        ``{"evaluator": ..., "version": ALGORITHM_VERSION, **options}``.
    """
    return {"evaluator": evaluator.fingerprint(), "version": ALGORITHM_VERSION, **options}


def computed_at_point(kind: str, model: ModelLike | torch.Tensor, evaluator: PointEvaluator, options: dict[str, Any],
                      compute: Callable[[CurvatureOperator], Result], *, kind_options: KindOptions = None,
                      point_ready: bool = False, plan: ProductPlan | None = None) -> Any:
    """The result for (kind, point, options), or with ``plan`` its dry run.

    From the evaluator's cache, or computed on the curvature operator at the point (BatchNorm mode
    applied) and stored, its spec naming the attention kernel the products ran with
    (``attention_kernel``, a fixed choice left out of the key).

    The key is the given point's digest: the evaluator's fingerprint in it already fixes what the
    BatchNorm mode does to the point, so a cache hit never re-estimates BatchNorm statistics.

    Parameters
    ----------
    kind : str
        The function's name (``"hessian_eigen"``, ``"sharpness"``, ...), recorded as ``spec["kind"]``.
    model : model-like or torch.Tensor
        The point: a model-like or a flat vector of the evaluator's space.
    evaluator : PointEvaluator
        Whose loss is differentiated, and whose cache (if any) stores the result.
    options : dict[str, Any]
        Every option of the computation (entering the key); ``params``, ``include_frozen`` and, when
        present, ``operator`` (the kind; default ``"hessian"``) and ``seed`` also configure the
        operator (:func:`~landscape.curvature.at_point.curvature_operator`).
    compute : callable
        ``CurvatureOperator -> Result``, called on a cache miss.
    kind_options : Mapping[str, Any], optional
        The kind's options (as :func:`~.at_point.operator_options` returns them), for the operator.
    point_ready : bool
        The flat vector already carries the buffers of the evaluator's BatchNorm mode.
    plan : ProductPlan, optional
        Compute nothing: look the key up, time one product and return the
        :class:`~landscape.infra.estimate.JobEstimate` (:mod:`.estimate`).

    Returns
    -------
    Result or JobEstimate
        The cached or computed result, its spec set (or the dry run's estimate).
    """
    point = flat_point(model, evaluator)
    spec = {"kind": kind, "point": vector_digest(point), **spec_of(evaluator, **options)}
    cache = getattr(evaluator, "cache", None)
    key = make_key(spec)
    found = cache.load_result(key) if cache is not None else None
    if found is not None and plan is None:
        return found
    op = curvature_operator(point, evaluator, kind=options.get("operator", "hessian"), kind_options=kind_options,
                            params=options["params"], include_frozen=options["include_frozen"],
                            seed=options.get("seed", 0), point_ready=point_ready)
    if plan is not None:
        return plan.estimate(kind, op, evaluator, found is not None, key)
    result = dataclasses.replace(compute(op), spec={**spec, "attention_kernel": ATTENTION_KERNEL})
    if cache is not None:
        cache.save_result(key, result)
    return result
