"""The loss along the top Hessian eigenvectors: a 1-D slice and a 2-D plane.

:func:`eigen_line` evaluates ``w + t d`` with ``d`` the top eigenvector of the Hessian at ``w``,
beside the second-order Taylor model ``L(w) + t g.d + t^2 d^T H d / 2``; :func:`eigen_plane`
evaluates ``w + x d_1 + y d_2`` on the top two eigenvectors. Both take a
:class:`~landscape.results.curvature.HessianEigen` computed with ``return_eigenvectors=True``
(``eigen=``), or compute one through :func:`~.functions.hessian_eigen` (cached with the
evaluator's cache).

Directions: an eigenvector is a unit vector over the differentiated parameters (zero on the
others and on buffers). Its sign is fixed so that its largest-magnitude entry is positive (the
solver's sign is arbitrary). ``normalization="filter"`` rescales each filter of it to the norm
of the weight's filter (Li et al. 2018, Eq. 1; one-dimensional tensors as a whole), as random
directions are; the result is then *no longer an eigenvector*: its curvature ``d^T H d`` mixes
the whole spectrum. The default ``"none"`` keeps the eigenvector, so coordinates are in
parameter-norm units and the curvature along the line is the eigenvalue.
"""
from __future__ import annotations

import math
from numbers import Real
from typing import Any

import numpy as np
import torch

from ..cache.store import make_key
from ..evaluation.protocol import PointEvaluator
from ..geometry.planes import NORMALIZATIONS, evaluate_grid, grid_axis, normalize_direction
from ..infra.errors import ConfigError
from ..results import PlaneResult
from ..results.curvature import HessianEigen
from ..results.curvature_views import EigenLine
from ..space.params import ModelLike, vector_digest
from ..space.points import PointSet
from .at_point import flat_point, with_bn_mode
from .functions import Params, hessian_eigen
from .hessian import HessianOperator


def eigen_line(model: ModelLike | torch.Tensor, evaluator: PointEvaluator, *, eigen: HessianEigen | None = None,
               normalization: str = "none", span: float = 1.0, resolution: int = 41, params: Params = None,
               **solver: Any) -> EigenLine:
    """Loss and accuracy along the top Hessian eigenvector, with the quadratic model's prediction.

    The slice is ``w + t d`` for ``t`` in ``[-span, span]``; ``d`` is the eigenvector of the
    largest (algebraic) eigenvalue ``lambda`` of the Hessian of the evaluator's loss at ``w``.
    ``predicted`` is ``L(w) + t g.d + t^2 d^T H d / 2`` (one gradient and one Hessian-vector
    product); for the unit eigenvector ``d^T H d = lambda``, and at a minimum ``g = 0``, so it
    is ``L(w) + t^2 lambda / 2``: the measured loss near ``t = 0`` checks the eigenvalue.

    Parameters
    ----------
    model
        The model ``w`` (model-like or flat vector of the evaluator's space).
    evaluator
        The :class:`~landscape.Evaluator` whose loss is differentiated and evaluated.
    eigen
        A :class:`~landscape.results.curvature.HessianEigen` of this model and evaluator with
        eigenvectors (default: computed with ``k=1``).
    normalization
        ``"none"`` (default: the unit eigenvector) or ``"filter"`` / ``"layer"`` (Li et al.
        2018; the direction is then no longer an eigenvector, and ``curvature`` differs from
        ``eigenvalue``).
    span
        Half-width of the slice, in units of ``d`` (parameter norm for the unit eigenvector).
    resolution
        Number of evenly spaced coordinates (odd puts ``t = 0`` on the grid).
    params
        Parameter-name patterns to differentiate (default all trainable; with ``eigen``, those
        it was computed for).
    **solver
        Further options of :func:`~landscape.curvature.functions.hessian_eigen` (``tol``,
        ``max_iter``, ``seed``, ``method``, ``hvp``, ``include_frozen``); with ``eigen``, its own
        ``hvp`` and ``include_frozen`` are used and the rest is not needed.

    Returns
    -------
    EigenLine
        ``t``, ``loss``, ``accuracy``, ``predicted``, the direction and ``eigenvalue``, ``slope``,
        ``curvature``; ``spec["kind"] == "eigen_line"``.

    Raises
    ------
    ConfigError
        An unknown normalisation, ``span`` not a positive finite number, ``resolution < 2``, or an
        ``eigen`` without eigenvectors or computed for another point, evaluator or parameters.
    """
    if resolution < 2:
        raise ConfigError(f"resolution must be at least 2, got {resolution}")
    point, eig, options, mask, dirs = _directions(model, evaluator, eigen, 1, normalization, span, params, solver)
    ready = with_bn_mode(point, point, evaluator)
    op = HessianOperator(evaluator, ready, params=options["params"], hvp=options["hvp"],
                         include_frozen=options["include_frozen"])
    d = dirs[0][mask].to(op.device, op.dtype)
    slope = float(torch.dot(op.gradient().double(), d.double()))
    curvature = float(torch.dot(op.matvec(d).double(), d.double()))
    base = op.loss()
    ts = np.linspace(-float(span), float(span), int(resolution))
    evaluator.warn_interpolated_batchnorm()
    loss, acc = evaluator.evaluate_points(PointSet(point, dirs[:1], torch.from_numpy(ts).reshape(-1, 1)),
                                          reference=point, label="eigen line")
    space = evaluator.space
    return EigenLine(t=ts, loss=loss, accuracy=acc, predicted=base + slope * ts + 0.5 * curvature * ts ** 2,
                     origin=point.numpy(), direction=dirs[0].numpy(), param_mask=space.param_mask.numpy(),
                     eigenvalue=float(eig.values[0]), slope=slope, curvature=curvature, base_loss=base,
                     spec=_spec("eigen_line", evaluator, eig, options, normalization=normalization, span=span,
                                resolution=resolution))


def eigen_plane(model: ModelLike | torch.Tensor, evaluator: PointEvaluator, *, eigen: HessianEigen | None = None,
                normalization: str = "none", span: float = 1.0, resolution: int = 21, params: Params = None,
                **solver: Any) -> PlaneResult:
    """Loss and accuracy on the plane of the top two Hessian eigenvectors.

    Grid point ``(x, y)`` is ``w + x d_1 + y d_2``, ``x, y`` in ``[-span, span]``, with ``d_1``
    and ``d_2`` the eigenvectors of the two largest (algebraic) eigenvalues at ``w``: orthonormal
    over the differentiated parameters, so coordinates are in parameter-norm units (unless
    filter-normalised, which makes them neither orthogonal nor eigenvectors).

    Parameters
    ----------
    model, evaluator, eigen, normalization, span, params, **solver
        As for :func:`eigen_line` (``eigen`` needs at least two eigenpairs; default computed with
        ``k=2``).
    resolution
        Number of grid points per axis (at least 2).

    Returns
    -------
    PlaneResult
        ``(resolution, resolution)`` loss and accuracy; ``u``, ``v`` the two directions;
        ``models == {"center": [0, 0]}``; ``spec["kind"] == "eigen_plane"`` with the eigenvalues.

    Raises
    ------
    ConfigError
        As for :func:`eigen_line`, or an ``eigen`` with fewer than two eigenpairs.
    """
    point, eig, options, _, dirs = _directions(model, evaluator, eigen, 2, normalization, span, params, solver)
    xs = grid_axis(-float(span), float(span), resolution)
    return evaluate_grid(evaluator, point, dirs[0], dirs[1], xs, xs.copy(), {"center": (0.0, 0.0)},
                         _spec("eigen_plane", evaluator, eig, options, normalization=normalization, span=span,
                               resolution=resolution))


def _directions(model: ModelLike | torch.Tensor, evaluator: PointEvaluator, eigen: HessianEigen | None, count: int,
                normalization: str, span: float, params: Params, solver: dict[str, Any]
                ) -> tuple[torch.Tensor, HessianEigen, dict[str, Any], torch.Tensor, torch.Tensor]:
    """The point, its eigenpairs, their options, the differentiated mask and ``count`` directions.

    The options are those the eigenpairs were computed with; the mask is that of the differentiated
    parameters; the ``count`` flat directions are rows.
    """
    if normalization not in NORMALIZATIONS:
        raise ConfigError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    if not (isinstance(span, Real) and not isinstance(span, bool) and math.isfinite(span) and span > 0):
        raise ConfigError(f"span must be a positive finite number (half-width in units of the direction), got {span!r}")
    point = flat_point(model, evaluator)
    if eigen is None:
        eigen = hessian_eigen(point, evaluator, k=count, params=params, return_eigenvectors=True, **solver)
    options = {"params": params, "hvp": solver.get("hvp", "auto"),
               "include_frozen": solver.get("include_frozen", False)}
    options.update({k: eigen.spec[k] for k in options if k in eigen.spec})
    _check_eigen(eigen, point, evaluator, count, params, options)
    space = evaluator.space
    mask = space.select(options["params"], include_frozen=options["include_frozen"])
    vectors = torch.as_tensor(np.asarray(eigen.vectors[:count], dtype=np.float64))
    if vectors.shape[1] != int(mask.sum()):
        raise ConfigError(f"eigen's eigenvectors have {vectors.shape[1]} entries, but the selected parameters number "
                          f"{int(mask.sum())}: pass the HessianEigen of this model and parameter selection")
    peak = vectors.gather(1, vectors.abs().argmax(1, keepdim=True))
    dirs = torch.zeros(count, space.size, dtype=torch.float64)
    dirs[:, mask] = vectors * torch.sign(peak)
    if normalization != "none":
        dirs = torch.stack([normalize_direction(space, d, point, normalization=normalization,
                                                ignore_bias_and_norm=False) for d in dirs])
    return point, eigen, options, mask, dirs


def _check_eigen(eigen: HessianEigen, point: torch.Tensor, evaluator: PointEvaluator, count: int, params: Params,
                 options: dict[str, Any]) -> None:
    if eigen.vectors is None:
        raise ConfigError("eigen has no eigenvectors: compute it with return_eigenvectors=True")
    if eigen.spec.get("operator", "hessian") != "hessian":
        raise ConfigError(f"eigen holds eigenvectors of the {eigen.spec['operator']!r} operator; the views follow "
                          "the Hessian's: compute it with kind='hessian'")
    if len(eigen.values) < count:
        raise ConfigError(f"eigen holds {len(eigen.values)} eigenpair(s) but {count} are needed: compute it with "
                          f"k={count}")
    if "point" in eigen.spec and eigen.spec["point"] != vector_digest(point):
        raise ConfigError("eigen was computed at another model than the one given: pass that model, or eigen=None")
    if ("evaluator" in eigen.spec
            and make_key({"e": eigen.spec["evaluator"]}) != make_key({"e": evaluator.fingerprint()})):
        raise ConfigError("eigen was computed with another evaluator (data, loss, BatchNorm mode or dtype): "
                          "pass that evaluator, or eigen=None")
    if params is not None and make_key({"p": params}) != make_key({"p": options["params"]}):
        raise ConfigError(f"eigen was computed for params={options['params']!r}, not {params!r}: leave params out "
                          "to use eigen's")


def _spec(kind: str, evaluator: PointEvaluator, eigen: HessianEigen, options: dict[str, Any], **view: Any
          ) -> dict[str, Any]:
    solved = {k: v for k, v in eigen.spec.items() if k != "evaluator"}
    return {"kind": kind, "directions": "hessian", **view, **options,
            "eigenvalues": [float(v) for v in eigen.values], "eigen": solved, "evaluator": evaluator.fingerprint()}
