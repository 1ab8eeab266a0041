"""Top Hessian (or another kind's) eigenvalues along a linear path and on a plane grid (cached per point).

Buffers follow the evaluator's BatchNorm mode with the path's start (or the plane's origin) as
the reference model, exactly as the loss values of the same path or plane.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError
from ..results import PlaneResult
from ..results.curvature import CurvaturePlane, CurvatureProfile
from ..space.params import ModelLike
from ..space.subsets import recorded_subspace
from .at_point import KindOptions, operator_options, with_bn_mode
from .functions import Params, hessian_eigen, spec_of


def curvature_along_path(a: ModelLike, b: ModelLike, evaluator: PointEvaluator, *, alphas: int | np.ndarray = 21,
                         k: int = 1, tol: float = 1e-3, max_iter: int = 100, seed: int = 0,
                         method: str = "lanczos", params: Params = None, hvp: str = "auto",
                         kind: str = "hessian", kind_options: KindOptions = None) -> CurvatureProfile:
    """Top-``k`` Hessian (or ``kind``'s) eigenvalues at each point ``(1 - alpha) a + alpha b``.

    Parameters
    ----------
    a, b
        Model-likes, the path's ends.
    evaluator
        The evaluator.
    alphas
        Number of evenly spaced points (ends included) or the alphas themselves.
    k, tol, max_iter, seed, method, params, hvp, kind, kind_options
        As for :func:`~landscape.curvature.functions.hessian_eigen`.

    Returns
    -------
    CurvatureProfile

    Raises
    ------
    ConfigError
        An unknown kind, or an option it does not declare.
    """
    alphas = np.linspace(0.0, 1.0, alphas) if np.isscalar(alphas) else np.asarray(alphas, dtype=np.float64)
    va, vb = evaluator.vector(a), evaluator.vector(b)
    points = [(1.0 - float(t)) * va + float(t) * vb for t in alphas]
    options = dict(k=k, tol=tol, max_iter=max_iter, seed=seed, method=method, params=params)
    operator, resolved = operator_options(kind, kind_options, False, hvp=hvp)
    values, residuals, matvecs = _eigen_at(points, va, evaluator, kind=kind, kind_options=resolved, **options)
    return CurvatureProfile(alphas=alphas, eigenvalues=values, residuals=residuals, matvecs=matvecs,
                            spec=spec_of(evaluator, **options, **operator))


def curvature_plane(plane: PlaneResult, evaluator: PointEvaluator, *, stride: int = 1, k: int = 1, tol: float = 1e-3,
                    max_iter: int = 100, seed: int = 0, method: str = "lanczos",
                    params: Params = None, hvp: str = "auto", reference: ModelLike | None = None,
                    kind: str = "hessian", kind_options: KindOptions = None) -> CurvaturePlane:
    """Top-``k`` Hessian (or ``kind``'s) eigenvalues on the grid of a plane, every ``stride``-th point per axis.

    Parameters
    ----------
    plane
        A :class:`~landscape.results.base.PlaneResult` (grid point ``(x, y)`` is
        ``origin + x u + y v``).
    evaluator
        The evaluator.
    stride
        Keep every ``stride``-th grid coordinate on each axis.
    k, tol, max_iter, seed, method, params, hvp, kind, kind_options
        As for :func:`~landscape.curvature.functions.hessian_eigen`. On a plane over a
        parameter subset (``plane.spec["params"]``), ``params`` defaults to that subset: the
        Hessian block of the parameters the plane moves.
    reference : model-like, optional
        For a plane over a parameter subset: the model outside the subset (the plane's
        centre or origin model; required there).

    Returns
    -------
    CurvaturePlane

    Raises
    ------
    ConfigError
        ``stride < 1``, a subset plane without ``reference``, an unknown kind or an option it does not
        declare.
    """
    if stride < 1:
        raise ConfigError(f"stride must be >= 1, got {stride}")
    xs, ys = np.asarray(plane.x)[::stride], np.asarray(plane.y)[::stride]
    origin = torch.as_tensor(np.asarray(plane.origin, dtype=np.float64))
    u = torch.as_tensor(np.asarray(plane.u, dtype=np.float64))
    v = torch.as_tensor(np.asarray(plane.v, dtype=np.float64))
    points = [origin + float(x) * u + float(y) * v for y in ys for x in xs]
    subset = plane.spec.get("params")
    if subset is not None:
        if reference is None:
            raise ConfigError(f"this plane moves params={subset['params']!r} only and stores its points in that "
                              "subset; pass reference=<the plane's centre model> for the rest of the model")
        full = evaluator.vector(reference)
        sub = recorded_subspace(evaluator.space, subset, "this plane")
        points = [sub.embed(p, full) for p in points]
        origin = sub.embed(origin, full)
        params = subset["params"] if params is None else params
    options = dict(k=k, tol=tol, max_iter=max_iter, seed=seed, method=method, params=params)
    operator, resolved = operator_options(kind, kind_options, False, hvp=hvp)
    values, residuals, matvecs = _eigen_at(points, origin, evaluator, kind=kind, kind_options=resolved, **options)
    shape = (len(ys), len(xs))
    return CurvaturePlane(x=xs, y=ys, eigenvalues=values.reshape(*shape, k),
                          residuals=residuals.reshape(*shape, k), matvecs=matvecs.reshape(shape),
                          models=dict(plane.models), spec=spec_of(evaluator, stride=stride, **options, **operator))


def _eigen_at(points: list[torch.Tensor], reference: torch.Tensor, evaluator: PointEvaluator, **options: Any
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    values, residuals, matvecs = [], [], []
    for vec in points:
        res = hessian_eigen(with_bn_mode(vec, reference, evaluator), evaluator, point_ready=True, **options)
        values.append(res.values)
        residuals.append(res.residuals)
        matvecs.append(res.matvecs)
    return np.stack(values), np.stack(residuals), np.asarray(matvecs)
