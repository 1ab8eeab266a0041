"""2-D planes in parameter space.

* :func:`plane` through three models (Garipov et al. 2018; FedGuCci Fig. 3, IMA Fig. 1):
  origin ``a``, ``u = (b - a)/|b - a|``, ``v`` the unit part of ``c - a`` orthogonal to ``u``;
  norms and inner products over parameters. Buffers move with the same barycentric
  coefficients (``bn="interpolate"``).
* :func:`random_plane` around one model with Gaussian directions, filter-normalised as in
  Li et al. (2018), optionally with biases and norm-layer parameters zeroed and the second
  direction orthogonalised; its span a number or ``"auto"`` (:mod:`landscape.geometry.span`).
* :func:`pca_plane` spanned by the top two principal directions of a trajectory of
  checkpoints around its last point (Li et al. 2018, Sec. 7).

Each takes ``params=`` (:mod:`landscape.space.subsets`): only the selected parameters move, the
directions have the subset's length, and the rest stays at the origin model.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from ..evaluation.dry_run import estimate_points
from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError
from ..infra.estimate import JobEstimate
from ..results import PlaneResult
from ..space.params import ModelLike, ParameterSpace
from ..space.subsets import ParamsLike, Subspace, restrict_models
from .grids import evaluate_grid, grid_axis
from .options import NORMALIZATIONS, check_margin
from .span import AUTO, auto_span, check_span


def plane(a: ModelLike, b: ModelLike, c: ModelLike, evaluator: PointEvaluator, *, resolution: int = 21,
          margin: float = 0.2, labels: Sequence[str] = ("a", "b", "c"),
          extra: Mapping[str, ModelLike] | None = None, params: ParamsLike = None,
          dry_run: bool = False) -> PlaneResult | JobEstimate:
    """Loss and accuracy on the plane through three models.

    The grid covers the bounding box of the three models' coordinates (and of ``extra``
    models to be placed in the plane) widened by ``margin`` times its width (height) on each
    side; grid point ``(x, y)`` is ``a + x u + y v`` in parameter-norm units (the plane of
    Garipov et al. 2018, as in FedGuCci Fig. 3 and IMA Fig. 1).

    Parameters
    ----------
    a, b, c
        The three models (``nn.Module``, state_dict, checkpoint path or flat vector): ``a`` is
        the origin, ``b`` lies on the x axis, ``c`` in the upper half-plane.
    evaluator
        Evaluates the loss and accuracy of each grid point.
    resolution
        Number of grid points per axis (at least 2).
    margin
        Widening of the bounding box on each side, as a fraction of its width (height), in
        ``[0, MAX_MARGIN]``.
    labels
        Names of ``a``, ``b`` and ``c`` in the result's ``models``.
    extra
        Further models (name -> model-like) to project onto the plane and place on the figure.
    params
        Parameter subset that moves (``None``: every entry; ``"trainable"``; or ``fnmatch``
        patterns, :mod:`landscape.space.subsets`); the rest stays at ``a``, and ``b``, ``c`` must equal ``a`` there.
    dry_run
        Compute nothing: return what the plane will cost (:mod:`landscape.evaluation.dry_run`).

    Returns
    -------
    PlaneResult or JobEstimate
        ``(resolution, resolution)`` loss and accuracy (row = y, column = x), the origin, the
        unit directions ``u``, ``v`` and each model's coordinates; with ``dry_run=True`` the
        :class:`~landscape.infra.estimate.JobEstimate` (forward passes, memory, cached points, time).

    Raises
    ------
    ConfigError
        If ``a`` and ``b`` are identical, the three models are collinear (up to float32
        rounding), ``resolution < 2``, ``margin`` is outside ``[0, MAX_MARGIN]``, or ``b`` or
        ``c`` differs from ``a`` outside ``params``.
    """
    if dry_run:
        return estimate_points("plane", evaluator, lambda ev: plane(a, b, c, ev, resolution=resolution, margin=margin,
                                                                    labels=labels, extra=extra, params=params))
    check_margin(margin)
    base = evaluator.vector(a)
    sub, (va, vb, vc) = restrict_models(evaluator.space, params, [base, evaluator.vector(b), evaluator.vector(c)],
                                        labels)
    space = sub or evaluator.space
    db, dc = vb - va, vc - va
    nb = float(space.norm(db))
    if nb == 0.0:
        raise ConfigError("models a and b are identical: they do not span a plane")
    u = db / nb
    proj = float(space.dot(dc, u))
    w = dc - proj * u
    nw = float(space.norm(w))
    if nw <= 1e-6 * float(space.norm(dc)):  # below float32 resolution: v would be rounding noise
        raise ConfigError("the three models are collinear (c - a is parallel to b - a up to float32 "
                          "rounding): they do not span a plane; pick a third model off the a-b line")
    v = w / nw
    coords = {labels[0]: (0.0, 0.0), labels[1]: (nb, 0.0), labels[2]: (proj, nw)}
    for label, model in (extra or {}).items():
        vec = evaluator.vector(model)
        d = (vec if sub is None else sub.restrict(vec)) - va
        coords[label] = (float(space.dot(d, u)), float(space.dot(d, v)))
    xs_, ys_ = np.array([p[0] for p in coords.values()]), np.array([p[1] for p in coords.values()])
    wx, wy = xs_.max() - xs_.min(), ys_.max() - ys_.min()
    xs = grid_axis(xs_.min() - margin * wx, xs_.max() + margin * wx, resolution)
    ys = grid_axis(ys_.min() - margin * wy, ys_.max() + margin * wy, resolution)
    return evaluate_grid(evaluator, base, u, v, xs, ys, coords,
                         {"kind": "plane", "resolution": resolution, "margin": margin}, sub)


def random_direction(space: ParameterSpace | Subspace, center: torch.Tensor, generator: torch.Generator, *,
                     normalization: str = "filter", ignore_bias_and_norm: bool = True) -> torch.Tensor:
    """Gaussian direction scaled per filter (or per tensor) to the norm of ``center``'s weights.

    A standard normal draw for every parameter entry, scaled by :func:`normalize_direction`.

    Parameters
    ----------
    space
        Layout of the flat vectors (a :class:`~landscape.space.subsets.Subspace` for a
        direction of a parameter subset's length).
    center
        Flat vector whose weight norms scale the direction.
    generator
        Source of the Gaussian draws (seed it for a reproducible direction).
    normalization
        ``"filter"`` (per output filter, Li et al. 2018), ``"layer"`` (per tensor) or
        ``"none"`` (raw Gaussian).
    ignore_bias_and_norm
        Give one-dimensional tensors (biases, norm-layer parameters) a zero direction (0-d
        parameters keep theirs).

    Returns
    -------
    torch.Tensor
        The direction, float64 of length ``space.size`` (zero on buffers).

    Raises
    ------
    ConfigError
        If ``normalization`` is not one of :data:`NORMALIZATIONS`.
    """
    if normalization not in NORMALIZATIONS:
        raise ConfigError(f"normalization must be one of {NORMALIZATIONS}")
    direction = torch.zeros(space.size, dtype=torch.float64)
    for e in space.entries:
        if e.kind == "parameter":
            direction[e.offset:e.offset + e.numel] = torch.randn(e.numel, generator=generator, dtype=torch.float64)
    return normalize_direction(space, direction, center, normalization=normalization,
                               ignore_bias_and_norm=ignore_bias_and_norm)


def normalize_direction(space: ParameterSpace | Subspace, direction: torch.Tensor, center: torch.Tensor, *,
                        normalization: str = "filter", ignore_bias_and_norm: bool = True) -> torch.Tensor:
    """``direction`` scaled per filter (or per tensor) to the norm of ``center``'s weights.

    Filter normalisation (Li et al. 2018, Eq. 1): each output filter ``d_j`` of a weight with
    two or more dimensions becomes ``d_j / |d_j| * |w_j|``. One-dimensional tensors
    (biases, norm-layer scales) are zeroed when ``ignore_bias_and_norm``, otherwise scaled as
    a whole. A 0-d parameter (a scalar gain or temperature) is its own filter: its direction is
    ``sign(d) |w|`` (``"filter"`` and ``"layer"``), and it is not zeroed by
    ``ignore_bias_and_norm``, being neither a bias nor a norm layer's vector. Buffers get no
    direction (they stay at ``center``).

    Parameters
    ----------
    space
        Layout of the flat vectors.
    direction
        Flat vector to scale (not modified).
    center
        Flat vector whose weight norms scale the direction.
    normalization
        ``"filter"``, ``"layer"`` or ``"none"`` (unchanged on parameters).
    ignore_bias_and_norm
        Give one-dimensional tensors a zero direction.

    Returns
    -------
    torch.Tensor
        The scaled direction, float64 of length ``space.size`` (zero on buffers).
    """
    out = torch.zeros(space.size, dtype=torch.float64)
    for e in space.entries:
        if e.kind != "parameter" or (len(e.shape) == 1 and ignore_bias_and_norm):
            continue
        sl = slice(e.offset, e.offset + e.numel)
        d, w = direction[sl].double(), center[sl].double()
        if normalization == "filter" and len(e.shape) >= 2:
            d2, w2 = d.reshape(e.shape[0], -1), w.reshape(e.shape[0], -1)
            d = (d2 / d2.norm(dim=1, keepdim=True).clamp_min(1e-12) * w2.norm(dim=1, keepdim=True)).reshape(-1)
        elif normalization != "none":  # a whole tensor: a layer, a vector, or a 0-d parameter (its own filter)
            d = d / d.norm().clamp_min(1e-12) * w.norm()
        out[sl] = d
    return out


def random_plane(center: ModelLike, evaluator: PointEvaluator, *, resolution: int = 21, span: float | str = 1.0,
                 normalization: str = "filter", seed: int = 0, ignore_bias_and_norm: bool = True,
                 orthogonalize: bool = False, extra: Mapping[str, ModelLike] | None = None,
                 params: ParamsLike = None, dry_run: bool = False) -> PlaneResult | JobEstimate:
    """Loss and accuracy on ``center + x d1 + y d2``, x and y in [-span, span] (Li et al. 2018).

    Coordinates are in units of the (filter-normalised) directions, not of parameter norm.
    ``d1`` and ``d2`` are drawn by :func:`random_direction` from one generator seeded with
    ``seed``.

    Parameters
    ----------
    center
        The model at the origin (``nn.Module``, state_dict, checkpoint path or flat vector).
    evaluator
        Evaluates the loss and accuracy of each grid point.
    resolution
        Number of grid points per axis (at least 2).
    span
        Half-width of the square grid, in direction units, or ``"auto"``: chosen from the loss's
        growth along ``+-d1`` and ``+-d2`` by the rule of :mod:`landscape.geometry.span` (the
        distance where the loss along the steepest axis reaches ten times the centre's, at
        least one loss unit above it; between 1/64 and 4).
    normalization
        ``"filter"``, ``"layer"`` or ``"none"`` (see :func:`random_direction`).
    seed
        Seed of the two directions.
    ignore_bias_and_norm
        Zero the directions of one-dimensional tensors (Li et al. 2018).
    orthogonalize
        Make ``d2`` orthogonal to ``d1`` (over parameters), keeping its norm.
    extra
        Further models (name -> model-like) to project onto the plane.
    params
        Parameter subset that moves (``None``: every entry; ``"trainable"``; or ``fnmatch``
        patterns, :mod:`landscape.space.subsets`); the rest stays at ``center``; the
        directions (filter-normalised per selected tensor) have the subset's length.
    dry_run
        Compute nothing: return what the plane will cost (a number ``span`` only).

    Returns
    -------
    PlaneResult or JobEstimate
        ``(resolution, resolution)`` loss and accuracy (row = y, column = x), the origin and the
        two directions; ``spec["span"]`` is the span used and, for ``"auto"``,
        ``spec["span_rule"]`` the rule's probes. With ``dry_run=True`` the
        :class:`~landscape.infra.estimate.JobEstimate`.

    Raises
    ------
    ConfigError
        If the first direction is zero (a model with no multi-dimensional weights and
        ``ignore_bias_and_norm=True``), ``normalization`` is unknown, ``resolution < 2``,
        ``span`` is neither a positive number nor ``"auto"``, or the centre's loss is not finite
        with ``span="auto"``, or ``dry_run`` with ``span="auto"`` (its probes depend on the losses).

    Examples
    --------
    A 3 x 3 grid of span 1 has coordinates -1, 0, 1; the centre is its middle point.

    >>> import torch, landscape
    >>> model = torch.nn.Linear(2, 2)
    >>> ev = landscape.Evaluator(model, (torch.eye(2), torch.tensor([0, 1])), progress=False)
    >>> plane = landscape.random_plane(model, ev, resolution=3, span=1.0, seed=0)
    >>> plane.x, plane.y, plane.loss.shape, plane.coordinates(model)
    (array([-1.,  0.,  1.]), array([-1.,  0.,  1.]), (3, 3), (0.0, 0.0))
    >>> bool(abs(plane.loss[1, 1] - ev.evaluate([model]).loss[0]) < 1e-6)
    True
    """
    half_width = check_span(span)
    if dry_run:
        if half_width == AUTO:
            raise ConfigError("dry_run cannot count the probes of span='auto' (they depend on the losses); "
                              "give span a number")
        return estimate_points("random_plane", evaluator, lambda ev: random_plane(
            center, ev, resolution=resolution, span=span, normalization=normalization, seed=seed,
            ignore_bias_and_norm=ignore_bias_and_norm, orthogonalize=orthogonalize, extra=extra, params=params))
    base = evaluator.vector(center)
    sub, (vc,) = restrict_models(evaluator.space, params, [base], ["center"])
    space = sub or evaluator.space
    gen = torch.Generator().manual_seed(seed)
    d1 = random_direction(space, vc, gen, normalization=normalization, ignore_bias_and_norm=ignore_bias_and_norm)
    d2 = random_direction(space, vc, gen, normalization=normalization, ignore_bias_and_norm=ignore_bias_and_norm)
    if float(space.norm(d1)) == 0.0:
        raise ConfigError("the random direction is zero: the model has no multi-dimensional weights; "
                          "pass ignore_bias_and_norm=False")
    if orthogonalize:
        norm2 = space.norm(d2)
        d2 = d2 - space.dot(d2, d1) / space.dot(d1, d1) * d1
        d2 = d2 * (norm2 / space.norm(d2))
    rule = {}
    if half_width == AUTO:
        grid_axis(-1.0, 1.0, resolution)  # refuse a bad resolution before evaluating the probes
        half_width, found = auto_span(evaluator, base, d1, d2, None if sub is None else sub.index)
        rule = {"span_rule": found}
    xs = grid_axis(-half_width, half_width, resolution)
    models = {"center": (0.0, 0.0)}
    result = evaluate_grid(evaluator, base, d1, d2, xs, xs.copy(), models,
                           {"kind": "random_plane", "resolution": resolution, "span": half_width,
                            "normalization": normalization, "seed": seed,
                            "ignore_bias_and_norm": ignore_bias_and_norm, "orthogonalize": orthogonalize,
                            **rule}, sub)
    return result.with_models(**dict(extra or {}))


def pca_plane(trajectory: Sequence[ModelLike], evaluator: PointEvaluator, *, resolution: int = 21,
              margin: float = 0.2, params: ParamsLike = None, dry_run: bool = False) -> PlaneResult | JobEstimate:
    """Plane of the top two principal directions of ``trajectory - trajectory[-1]`` (parameters only).

    The grid covers the projected trajectory, widened by ``margin``; the trajectory's points
    are placed in the plane as ``step 0``, ``step 1``, ... (Li et al. 2018, Sec. 7). The
    directions are unit vectors over parameters (buffers stay at the last checkpoint); the spec
    records the fraction of variance each explains.

    Parameters
    ----------
    trajectory
        At least three checkpoints (model-likes) in training order; the last is the origin.
    evaluator
        Evaluates the loss and accuracy of each grid point.
    resolution
        Number of grid points per axis (at least 2).
    margin
        Widening of the trajectory's bounding box on each side, as a fraction of its width, in
        ``[0, MAX_MARGIN]``.
    params
        Parameter subset that moves (``None``: every entry; ``"trainable"``; or ``fnmatch``
        patterns, :mod:`landscape.space.subsets`); the rest stays at the last checkpoint, and
        the others must equal it there.
    dry_run
        Compute nothing: return what the plane will cost.

    Returns
    -------
    PlaneResult or JobEstimate
        ``(resolution, resolution)`` loss and accuracy, the two principal directions and each
        checkpoint's coordinates; with ``dry_run=True`` the :class:`~landscape.infra.estimate.JobEstimate`.

    Raises
    ------
    ConfigError
        If the trajectory has fewer than three checkpoints or spans fewer than two dimensions,
        ``resolution < 2``, ``margin`` is outside ``[0, MAX_MARGIN]``, or a checkpoint differs
        from the last outside ``params``.
    """
    if dry_run:
        return estimate_points("pca_plane", evaluator, lambda ev: pca_plane(trajectory, ev, resolution=resolution,
                                                                            margin=margin, params=params))
    check_margin(margin)
    full = [evaluator.vector(m) for m in trajectory]
    if len(full) < 3:
        raise ConfigError("PCA directions need a trajectory of at least three checkpoints")
    base = full[-1]
    sub, local = restrict_models(evaluator.space, params, full[::-1],
                                 [f"step {i}" for i in reversed(range(len(full)))])
    del full
    space = sub or evaluator.space
    vecs = torch.stack(local[::-1])
    center = vecs[-1]
    mask = space.param_mask
    diffs = (vecs - center)[:, mask]
    gram = diffs @ diffs.T
    evals, evecs = torch.linalg.eigh(gram)
    order = torch.argsort(evals, descending=True)[:2]
    if (evals[order] <= 1e-18).any():
        raise ConfigError("the trajectory spans fewer than two dimensions")
    dirs = torch.zeros(2, space.size, dtype=torch.float64)
    dirs[:, mask] = (evecs[:, order].T @ diffs) / evals[order].sqrt()[:, None]
    coords = {f"step {i}": (float(space.dot(vecs[i] - center, dirs[0])), float(space.dot(vecs[i] - center, dirs[1])))
              for i in range(len(vecs))}
    xs_, ys_ = np.array([p[0] for p in coords.values()]), np.array([p[1] for p in coords.values()])
    wx, wy = xs_.max() - xs_.min(), ys_.max() - ys_.min()
    xs = grid_axis(xs_.min() - margin * wx, xs_.max() + margin * wx, resolution)
    ys = grid_axis(ys_.min() - margin * wy, ys_.max() + margin * wy, resolution)
    explained = (evals[order] / evals.clamp_min(0).sum()).tolist()
    return evaluate_grid(evaluator, base, dirs[0], dirs[1], xs, ys, coords,
                         {"kind": "pca_plane", "resolution": resolution, "margin": margin,
                          "explained_variance": explained}, sub)
