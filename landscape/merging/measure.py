"""A merge checked on the loss landscape: its loss, the barriers to the models it merges, its curvature.

Everything here is an existing measurement applied to the merged point: the evaluator's loss and
accuracy, :func:`landscape.interpolate` from the merge to each endpoint (FedGuCci Eq. 3/4 barriers;
adaptive alphas by default), and :func:`landscape.sharpness` (L2 worst-case sharpness, whose
``lambda_max`` is the top Hessian eigenvalue by Lanczos).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from ..curvature.sharpness import sharpness
from ..evaluation.evaluator import Evaluator
from ..geometry.paths import AlphasLike, interpolate
from ..space.params import ModelLike
from ..space.subsets import TRAINABLE, ParamsLike


def curvature_params(params: ParamsLike) -> tuple[Any, bool]:
    """``params`` and ``include_frozen`` of :func:`landscape.sharpness` for a merge's ``params``.

    Parameters
    ----------
    params
        The merge's parameter subset (None, ``"trainable"`` or patterns).

    Returns
    -------
    tuple
        Patterns (None: every trainable parameter) and whether frozen parameters they match count.
    """
    if params is None or params == TRAINABLE:
        return None, False
    return ([params] if isinstance(params, str) else list(params)), True


def measure(state: Mapping[str, torch.Tensor], models: Sequence[ModelLike], base: ModelLike | None,
            evaluator: Evaluator, *, params: ParamsLike, alphas: AlphasLike, tol: float | None,
            curvature: bool, rho: float) -> dict[str, Any]:
    """The :class:`~landscape.results.merging.MergeResult` fields measured with ``evaluator``.

    Parameters
    ----------
    state
        The merged weights.
    models
        The endpoints (the models merged, aligned ones when aligned).
    base
        The base model of a task-vector method, or None.
    evaluator
        Defines the loss and accuracy (all of its data).
    params
        The parameters that move along the paths (the merge's subset).
    alphas, tol
        Of each path (:func:`landscape.interpolate`).
    curvature
        Also measure sharpness and the top Hessian eigenvalue of the merge and of each endpoint.
    rho
        Radius of the L2 ball of the sharpness.

    Returns
    -------
    dict
        ``loss``, ``accuracy``, ``endpoint_loss``, ``endpoint_accuracy``, ``base_loss``,
        ``base_accuracy``, ``loss_barrier``, ``accuracy_barrier``, ``paths`` and, with
        ``curvature``, ``sharpness``, ``lambda_max``, ``endpoint_sharpness``, ``endpoint_lambda_max``.
    """
    merged = evaluator.vector(state)
    ends = [evaluator.vector(m) for m in models]
    points = [merged, *ends] + ([evaluator.vector(base)] if base is not None else [])
    metrics = evaluator.evaluate(torch.stack(points))
    n = len(ends)
    out: dict[str, Any] = {
        "loss": float(metrics.loss[0]), "accuracy": float(metrics.accuracy[0]),
        "endpoint_loss": np.asarray(metrics.loss[1:n + 1]), "endpoint_accuracy": np.asarray(metrics.accuracy[1:n + 1]),
        "base_loss": float(metrics.loss[-1]) if base is not None else math.nan,
        "base_accuracy": float(metrics.accuracy[-1]) if base is not None else math.nan}
    paths = [interpolate(merged, end, evaluator, alphas=alphas, tol=tol, params=params) for end in ends]
    out.update(loss_barrier=np.array([p.loss_barrier for p in paths]),
               accuracy_barrier=np.array([p.accuracy_barrier for p in paths]),
               paths=[{"alphas": p.alphas.tolist(), "loss": p.loss.tolist(), "accuracy": p.accuracy.tolist(),
                       "search": dict(p.search)} for p in paths])
    if curvature:
        patterns, include_frozen = curvature_params(params)
        found = [sharpness(v, evaluator, rho=rho, kind="l2", params=patterns, include_frozen=include_frozen)
                 for v in [merged, *ends]]
        out.update(sharpness=found[0].value, lambda_max=found[0].lambda_max,
                   endpoint_sharpness=np.array([r.value for r in found[1:]]),
                   endpoint_lambda_max=np.array([r.lambda_max for r in found[1:]]))
    return out
