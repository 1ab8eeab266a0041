"""``landscape.curve``: a learned low-loss curve between two models, for any architecture.

Garipov et al. (2018), "Loss Surfaces, Mode Connectivity, and Fast Ensembling of DNNs",
section 3.2: the curve ``phi_theta(t)`` with fixed endpoints ``a`` (t=0) and ``b`` (t=1) is
trained by minimising ``E_{t ~ U(0, 1)} L(phi_theta(t))`` (Eq. 2), one ``t`` per minibatch.
The bends are flat vectors of the evaluator's parameter space and the forward pass is the
model's own (:mod:`.trainer`); the curve is then evaluated by the evaluator beside the straight
line. For BatchNorm models use an Evaluator with ``bn="recompute"`` (Garipov et al. recompute
the statistics at every point of the curve).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np
import torch

from ..evaluation.batches import all_pairs
from ..evaluation.dry_run import estimate_points
from ..evaluation.inputs import map_tensors
from ..evaluation.protocol import PointEvaluator
from ..geometry.paths import interpolate
from ..geometry.planes import plane
from ..infra.errors import ConfigError, TrainingDivergedError
from ..infra.estimate import JobEstimate, Work, combined, time_once
from ..results.connectivity import CurveResult
from ..results.curve_shapes import KINDS, coefficients
from ..results.geometry import PlaneResult
from ..space.points import PointSet
from ..space.subsets import ParamsLike, Subspace, recorded_subspace, restrict_models
from .trainer import Sampler, train_knots


def curve(a: Any, b: Any, evaluator: PointEvaluator, *, kind: str = "bezier", train_data: Any, bends: int = 1,
          epochs: int = 20, lr: float = 0.05, momentum: float = 0.9, batch_size: int = 128,
          weight_decay: float = 0.0, points: int = 21, seed: int = 0, params: ParamsLike = None,
          dry_run: bool = False) -> CurveResult | JobEstimate:
    """Train a Bezier curve or polygonal chain from ``a`` to ``b`` and measure it.

    Parameters
    ----------
    a, b : model-like
        Model-likes of the evaluator's architecture (the fixed endpoints).
    evaluator : PointEvaluator
        Architecture, loss and evaluation data (the curve is measured on its data).
    kind : str
        ``"bezier"`` or ``"polychain"``.
    train_data : data
        Data the bends are trained on.
    bends : int
        Number of trainable knots (1: Garipov's quadratic Bezier / three-point chain);
        initialised on the segment a-b at ``t = i / (bends + 1)``, so training starts from the line.
    epochs, batch_size : int
        SGD passes over ``train_data`` and minibatch size.
    lr, momentum, weight_decay : float
        SGD learning rate, momentum and weight decay.
    points : int
        Evaluation points on [0, 1] (both ends included).
    seed : int
        Minibatch order and the ``t`` draws.
    params : None, "trainable" or patterns
        Train the bends only in these parameters (as ``params=`` of :func:`landscape.interpolate`);
        the other entries stay at ``a``'s values, and ``a`` and ``b`` must agree there. The
        knots, the training and the evaluated points then live in the subset (``result.knots``
        is (m, S)); no full-size vector is built per point.
    dry_run : bool
        Train and evaluate nothing: return what the curve will cost (gradient steps, timed
        after a warm-up on one minibatch, and the forward passes of the curve's and the line's
        points; the curve's points cannot be in the cache before training).

    Returns
    -------
    CurveResult or JobEstimate
        With ``dry_run=True`` the :class:`~landscape.infra.estimate.JobEstimate`.

    Raises
    ------
    TrainingDivergedError
        When training makes the loss or the bends NaN or infinite, or the trained curve's loss
        is not finite where the line's is (a learning rate too large).
    """
    if kind not in KINDS:
        raise ConfigError(f"kind must be one of {KINDS}, got {kind!r}")
    if bends < 1 or points < 2:
        raise ConfigError(f"need bends >= 1 and points >= 2, got {bends} and {points}")
    va, vb = evaluator.vector(a), evaluator.vector(b)
    sub, (ka, kb) = restrict_models(evaluator.space, params, [va, vb], ["model a", "model b"])
    m = bends + 2
    # knots on the line such that phi(t) starts as the straight segment: for Bernstein
    # polynomials knots at i/n reproduce linear functions, as for the chain
    s = torch.arange(m, dtype=torch.float64) / (m - 1)
    knots = (1 - s)[:, None] * ka + s[:, None] * kb
    knots[0], knots[-1] = ka, kb

    def sample(gen: torch.Generator) -> torch.Tensor:
        t = torch.rand(1, generator=gen, dtype=torch.float64).numpy()
        return torch.from_numpy(coefficients(kind, t, m)[0])

    trainable = [False] + [True] * bends + [False]
    t = np.linspace(0.0, 1.0, points)
    c = torch.from_numpy(coefficients(kind, t, m))
    if dry_run:
        return _estimate(evaluator, knots, trainable, sample, train_data, epochs=epochs, batch_size=batch_size,
                         sub=sub, reference=va, measure=lambda ev: (_evaluate_curve(ev, c, knots, sub, va),
                                                                    interpolate(va, vb, ev, alphas=t, params=params)))
    trained, history = train_knots(evaluator, knots, trainable, sample, train_data,
                                   epochs=epochs, lr=lr, momentum=momentum, batch_size=batch_size,
                                   weight_decay=weight_decay, seed=seed, what="curve training", subset=sub,
                                   reference=va)
    curve_loss, curve_accuracy = _evaluate_curve(evaluator, c, trained, sub, va)
    line = interpolate(va, vb, evaluator, alphas=t, params=params)
    if np.isfinite(line.loss).all() and not np.isfinite(curve_loss).all():
        raise TrainingDivergedError("curve training", max(epochs - 1, 0), ["loss on the trained curve"],
                                    {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})
    return CurveResult(t=t, loss=curve_loss, accuracy=curve_accuracy, line_loss=line.loss,
                       line_accuracy=line.accuracy, knots=trained.numpy(), curve_kind=kind, history=history,
                       spec={"kind": "curve", "curve": kind, "bends": bends, "epochs": epochs, "lr": lr,
                             "momentum": momentum, "batch_size": batch_size, "weight_decay": weight_decay,
                             "seed": seed, "evaluator": evaluator.fingerprint(),
                             **({"params": sub.spec()} if sub is not None else {})})


def _evaluate_curve(evaluator: PointEvaluator, c: torch.Tensor, knots: torch.Tensor, sub: Subspace | None,
                    reference: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Loss and accuracy at ``c @ knots`` (with a subset: ``reference`` outside it, never a full vector per point)."""
    if sub is None:
        vecs = c @ knots
        return evaluator.evaluate_points(PointSet.explicit(vecs), reference=vecs[0], label="curve")
    base = reference.clone()
    base[sub.index] = 0.0
    return evaluator.evaluate_points(PointSet(base, knots, c, sub.index), reference=reference, label="curve")


def _estimate(evaluator: PointEvaluator, knots: torch.Tensor, trainable: list[bool], sample: Sampler, data: Any, *,
              epochs: int, batch_size: int, sub: Subspace | None, reference: torch.Tensor,
              measure: Callable[[PointEvaluator], Any]) -> JobEstimate:
    """The dry run of :func:`curve`: its SGD steps (one minibatch timed after a warm-up) and its evaluations."""
    x_all, y_all = all_pairs(data, evaluator.batch_fn)
    first = (map_tensors(x_all, lambda t: t[:batch_size]), y_all[:batch_size])
    step = time_once(lambda: train_knots(evaluator, knots, trainable, sample, first, epochs=1, lr=1e-9,
                                         batch_size=batch_size, subset=sub, reference=reference), evaluator.device)
    steps = epochs * math.ceil(len(y_all) / batch_size)
    training = JobEstimate("curve training", (Work("gradient step", steps, steps, step,
                                                   f"{epochs} epochs x {math.ceil(len(y_all) / batch_size)} "
                                                   f"minibatches of {batch_size}"),))
    evaluation = estimate_points("curve evaluation", evaluator, measure)
    evaluation = dataclasses.replace(evaluation, cache=tuple(c for c in evaluation.cache if c.what != "curve points"))
    return combined("curve", [training, evaluation],
                    ["the curve's points are known only after training: they count as to compute"])


def curve_plane(result: CurveResult, evaluator: PointEvaluator, *, resolution: int = 21, margin: float = 0.2,
                reference: Any = None) -> PlaneResult:
    """The plane through the endpoints and the (first) bend, as Garipov et al.'s Figure 1.

    Parameters
    ----------
    result : CurveResult
        A trained curve; its first, second and last knots span the plane.
    evaluator : PointEvaluator
        Architecture, loss and evaluation data.
    resolution : int
        Grid points per axis.
    margin : float
        Widening of the grid on each side, as a fraction of its width (height).
    reference : model-like, optional
        For a curve trained with ``params=``: the model outside the subset (model ``a``); the
        plane is then over the same subset.

    Returns
    -------
    PlaneResult
        Models "a", "b" and "bend" placed; a quadratic Bezier curve lies in this plane.

    Raises
    ------
    ConfigError
        A subset curve without ``reference``, or a subset this evaluator's model does not have.
    """
    knots = torch.from_numpy(result.knots)
    subset = result.spec.get("params")
    params = None
    if subset is not None:
        if reference is None:
            raise ConfigError(f"this curve was trained with params={subset['params']!r} and stores its knots in "
                              "that subset only; pass reference=<model a> for the rest of the model")
        sub = recorded_subspace(evaluator.space, subset, "this curve")
        knots, params = sub.embed(knots, evaluator.vector(reference)), subset["params"]
    return plane(knots[0], knots[-1], knots[1], evaluator, resolution=resolution, margin=margin,
                           labels=("a", "b", "bend"), params=params)
