"""Hessian spectra of an evaluator's loss: top eigenvalues, trace, density, and their maps.

The Hessian is that of the loss averaged over *all* of the evaluator's data (sum of
per-sample losses divided by the sample count) with respect to the trainable parameters
(or those matching ``params`` name patterns); buffers are fixed and BatchNorm is in eval
mode (:mod:`landscape.hvp`). Every random choice is seeded. When the evaluator has a
cache, each result (and each point of a path or plane) is stored under a key made of the
point's weights, the evaluator's fingerprint and every option, so repeated or interrupted
runs only compute what is missing.

Methods (PyHessian, Yao et al. 2020, computes the same three quantities):
top-k by Lanczos with full re-orthogonalisation (default) or deflated power iteration;
trace by Hutchinson or Hutch++; density by stochastic Lanczos quadrature (Ghorbani et al.
2019) with Gaussian broadening. ``hvp`` picks how products are computed
(:data:`landscape.hvp.HVP_MODES`; ``"retained"`` is about 2x faster per product on CPU
but keeps the graphs of all batches in memory).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..cache.store import make_key
from ..results.curvature import (CurvaturePlane, CurvatureProfile, HessianEigen, SpectralDensity,
                                TraceEstimate)
from ..infra.errors import ConfigError
from .operators import HessianOperator
from .lanczos import lanczos_top, power_iteration, slq
from ..space.params import ModelLike, vector_digest
from ..results.base import PlaneResult, Result
from .trace import TRACE_METHODS, hutchinson, hutchpp

ALGORITHM_VERSION = "curvature-1"
EIGEN_METHODS = ("lanczos", "power")
Params = Sequence[str] | str | None


# --------------------------------------------------------------------------- top-k
def hessian_eigen(model: ModelLike | torch.Tensor, evaluator: Any, *, k: int = 1, tol: float = 1e-3,
                  max_iter: int = 100, seed: int = 0, method: str = "lanczos", params: Params = None,
                  return_eigenvectors: bool = False, hvp: str = "auto") -> HessianEigen:
    """The ``k`` largest Hessian eigenvalues with residuals and the number of HVPs used.

    ``method="lanczos"``: the k largest *algebraic* eigenvalues; ``max_iter`` caps the Krylov
    dimension (= HVPs); converged when each residual ``||Hx - theta x|| <= tol |theta|``.
    ``method="power"``: deflated power iteration as in PyHessian (largest *magnitude*;
    ``max_iter`` HVPs per eigenvalue; same residual test).
    """
    if method not in EIGEN_METHODS:
        raise ConfigError(f"method must be one of {EIGEN_METHODS}, got {method!r}")
    point = _point(model, evaluator)
    options = dict(k=k, tol=tol, max_iter=max_iter, seed=seed, method=method, params=params,
                   vectors=return_eigenvectors, hvp=hvp)

    def compute() -> HessianEigen:
        op = HessianOperator(evaluator, point, params=params, mode=hvp)
        solver = lanczos_top if method == "lanczos" else power_iteration
        res = solver(op.matvec, op.dim, k, tol=tol, max_iter=max_iter, generator=_generator(seed),
                     device=op.device, dtype=op.dtype, return_vectors=return_eigenvectors)
        vectors = res.vectors.double().cpu().numpy() if res.vectors is not None else None
        return HessianEigen(values=res.values, residuals=res.residuals, matvecs=op.matvecs,
                            converged=res.converged, method=method, dim=op.dim, vectors=vectors)

    return _cached(evaluator, "hessian_eigen", point, options, compute)


def hessian_eigenvalues(model: ModelLike | torch.Tensor, evaluator: Any, *, k: int = 1, tol: float = 1e-3,
                        max_iter: int = 100, seed: int = 0, method: str = "lanczos", params: Params = None,
                        return_eigenvectors: bool = False, hvp: str = "auto"):
    """The ``k`` largest Hessian eigenvalues, descending (``np.ndarray``).

    With ``return_eigenvectors=True`` returns ``(values, vectors)`` with eigenvectors as rows
    over the selected parameters. See :func:`hessian_eigen` for methods, tolerances and the
    HVP count.
    """
    res = hessian_eigen(model, evaluator, k=k, tol=tol, max_iter=max_iter, seed=seed, method=method,
                        params=params, return_eigenvectors=return_eigenvectors, hvp=hvp)
    return (res.values, res.vectors) if return_eigenvectors else res.values


# --------------------------------------------------------------------------- trace
def hessian_trace(model: ModelLike | torch.Tensor, evaluator: Any, *, tol: float = 1e-3, max_iter: int = 100,
                  seed: int = 0, method: str = "hutchinson", params: Params = None,
                  min_samples: int = 10, hvp: str = "auto") -> TraceEstimate:
    """``tr H`` by Hutchinson or Hutch++, stopping at ``stderr <= tol |value|`` or ``max_iter`` HVPs."""
    if method not in TRACE_METHODS:
        raise ConfigError(f"method must be one of {TRACE_METHODS}, got {method!r}")
    point = _point(model, evaluator)
    options = dict(tol=tol, max_iter=max_iter, seed=seed, method=method, params=params,
                   min_samples=min_samples, hvp=hvp)

    def compute() -> TraceEstimate:
        op = HessianOperator(evaluator, point, params=params, mode=hvp)
        estimator = hutchinson if method == "hutchinson" else hutchpp
        return estimator(op.matvec, op.dim, tol=tol, max_iter=max_iter, generator=_generator(seed),
                         device=op.device, dtype=op.dtype, min_samples=min_samples)

    return _cached(evaluator, "hessian_trace", point, options, compute)


# ------------------------------------------------------------------------- density
def hessian_density(model: ModelLike | torch.Tensor, evaluator: Any, *, iterations: int = 100, runs: int = 1,
                    seed: int = 0, sigma: float | None = None, grid_size: int = 2001,
                    params: Params = None, hvp: str = "auto") -> SpectralDensity:
    """Eigenvalue density of the Hessian by stochastic Lanczos quadrature.

    ``runs`` Rademacher probes, ``iterations`` Lanczos steps each (capped at the number of
    parameters). The density is a mixture of Gaussians of width ``sigma`` (default 0.5% of
    the spread of the nodes) at the nodes, on a grid reaching 6 sigma beyond the extreme
    nodes with at least 4 points per sigma, so it integrates to one.
    """
    if sigma is not None and not sigma > 0:
        raise ConfigError(f"sigma must be positive, got {sigma}")
    point = _point(model, evaluator)
    options = dict(iterations=iterations, runs=runs, seed=seed, sigma=sigma, grid_size=grid_size,
                   params=params, hvp=hvp)

    def compute() -> SpectralDensity:
        op = HessianOperator(evaluator, point, params=params, mode=hvp)
        nodes, weights = slq(op.matvec, op.dim, iterations, runs, generator=_generator(seed),
                             device=op.device, dtype=op.dtype)
        grid, density, width = broadened_density(nodes, weights, sigma=sigma, grid_size=grid_size)
        return SpectralDensity(grid=grid, density=density, nodes=nodes, weights=weights, sigma=width,
                               dim=op.dim, matvecs=op.matvecs)

    return _cached(evaluator, "hessian_density", point, options, compute)


def broadened_density(nodes: np.ndarray, weights: np.ndarray, *, sigma: float | None = None,
                      grid_size: int = 2001, max_grid: int = 200_001
                      ) -> tuple[np.ndarray, np.ndarray, float]:
    """``(grid, density, sigma)``: ``mean_r sum_j w_rj N(t; node_rj, sigma^2)`` on a grid."""
    lo, hi = float(nodes.min()), float(nodes.max())
    spread = hi - lo
    if sigma is None:
        sigma = 0.005 * spread if spread > 0 else 0.01 * max(abs(hi), 1e-12)
    pad = 6.0 * sigma
    needed = int(math.ceil((spread + 2 * pad) / (sigma / 4.0))) + 1
    size = max(grid_size, needed)
    if size > max_grid:
        raise ConfigError(f"sigma={sigma:.3g} is too small for the spectrum's spread {spread:.3g}: the grid "
                          f"would need {size} points; pass a larger sigma")
    grid = np.linspace(lo - pad, hi + pad, size)
    density = np.zeros_like(grid)
    norm = 1.0 / (sigma * math.sqrt(2 * math.pi) * nodes.shape[0])
    for node, weight in zip(nodes.reshape(-1), weights.reshape(-1)):
        if weight > 0:
            density += weight * norm * np.exp(-0.5 * ((grid - node) / sigma) ** 2)
    return grid, density, float(sigma)


# ------------------------------------------------------------- paths and planes
def curvature_along_path(a: ModelLike, b: ModelLike, evaluator: Any, *, alphas: int | np.ndarray = 21,
                         k: int = 1, tol: float = 1e-3, max_iter: int = 100, seed: int = 0,
                         method: str = "lanczos", params: Params = None,
                         hvp: str = "auto") -> CurvatureProfile:
    """Top-``k`` Hessian eigenvalues at each point ``(1 - alpha) a + alpha b`` (cached per point).

    Buffers follow the evaluator's BatchNorm mode with ``a`` as the reference model.
    """
    alphas = np.linspace(0.0, 1.0, alphas) if np.isscalar(alphas) else np.asarray(alphas, dtype=np.float64)
    va, vb = evaluator.vector(a), evaluator.vector(b)
    points = [(1.0 - float(t)) * va + float(t) * vb for t in alphas]
    options = dict(k=k, tol=tol, max_iter=max_iter, seed=seed, method=method, params=params, hvp=hvp)
    values, residuals, matvecs = _eigen_at(points, va, evaluator, **options)
    return CurvatureProfile(alphas=alphas, eigenvalues=values, residuals=residuals, matvecs=matvecs,
                            spec=_spec(evaluator, **options))


def curvature_plane(plane: PlaneResult, evaluator: Any, *, stride: int = 1, k: int = 1, tol: float = 1e-3,
                    max_iter: int = 100, seed: int = 0, method: str = "lanczos",
                    params: Params = None, hvp: str = "auto") -> CurvaturePlane:
    """Top-``k`` Hessian eigenvalues on the grid of a plane (``landscape.plane`` /
    ``random_plane`` result), every ``stride``-th point per axis (cached per point).

    Grid point ``(x, y)`` is ``origin + x u + y v``; buffers follow the evaluator's
    BatchNorm mode with the plane's origin as the reference model.
    """
    if stride < 1:
        raise ConfigError(f"stride must be >= 1, got {stride}")
    xs, ys = np.asarray(plane.x)[::stride], np.asarray(plane.y)[::stride]
    origin = torch.as_tensor(np.asarray(plane.origin, dtype=np.float64))
    u = torch.as_tensor(np.asarray(plane.u, dtype=np.float64))
    v = torch.as_tensor(np.asarray(plane.v, dtype=np.float64))
    points = [origin + float(x) * u + float(y) * v for y in ys for x in xs]
    options = dict(k=k, tol=tol, max_iter=max_iter, seed=seed, method=method, params=params, hvp=hvp)
    values, residuals, matvecs = _eigen_at(points, origin, evaluator, **options)
    shape = (len(ys), len(xs))
    return CurvaturePlane(x=xs, y=ys, eigenvalues=values.reshape(*shape, k),
                          residuals=residuals.reshape(*shape, k), matvecs=matvecs.reshape(shape),
                          models=dict(plane.models),
                          spec=_spec(evaluator, stride=stride, **options))


def _eigen_at(points: list[torch.Tensor], reference: torch.Tensor, evaluator: Any, **options: Any
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    values, residuals, matvecs = [], [], []
    for vec in _with_bn_mode(points, reference, evaluator):
        res = hessian_eigen(vec, evaluator, **options)
        values.append(res.values)
        residuals.append(res.residuals)
        matvecs.append(res.matvecs)
    return np.stack(values), np.stack(residuals), np.asarray(matvecs)


def _with_bn_mode(points: list[torch.Tensor], reference: torch.Tensor, evaluator: Any):
    """Yield each point with its buffers set as the evaluator's BatchNorm mode prescribes."""
    if evaluator.bn == "interpolate" or not evaluator.space.has_buffers:
        yield from points
        return
    ref = reference.to(evaluator.device, evaluator.dtype)
    for vec in points:
        fixed = evaluator.apply_bn_mode(vec.to(evaluator.device, evaluator.dtype).unsqueeze(0), ref)
        yield fixed[0].detach().to("cpu", torch.float64)


# ------------------------------------------------------------------- plumbing
def _point(model: ModelLike | torch.Tensor, evaluator: Any) -> torch.Tensor:
    """Flat float64 CPU vector of a model-like (a flat tensor is used as is)."""
    if isinstance(model, torch.Tensor):
        if model.shape != (evaluator.space.size,):
            raise ConfigError(f"a flat vector must have shape ({evaluator.space.size},), got {tuple(model.shape)}")
        return model.detach().to("cpu", torch.float64)
    return evaluator.vector(model)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def _spec(evaluator: Any, **options: Any) -> dict[str, Any]:
    return {"evaluator": evaluator.fingerprint(), "version": ALGORITHM_VERSION, **options}


def _cached(evaluator: Any, kind: str, point: torch.Tensor, options: dict[str, Any],
            compute: Callable[[], Result]) -> Any:
    """Load the result for (kind, point, options) from the evaluator's cache, or compute and store it."""
    spec = {"kind": kind, "point": vector_digest(point), **_spec(evaluator, **options)}
    cache = getattr(evaluator, "cache", None)
    key = make_key(spec)
    if cache is not None:
        found = cache.load_result(key)
        if found is not None:
            return found
    result = dataclasses.replace(compute(), spec=spec)
    if cache is not None:
        cache.save_result(key, result)
    return result
