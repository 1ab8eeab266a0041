"""Simplexes of connected models (Benton, Maddox, Lotfi & Wilson 2021, "Loss Surface Simplexes").

Given fixed vertices (trained models) and ``extra`` trainable ones, the complex is the union of
the simplexes ``conv({fixed_i} + trainable)``, one per fixed model: with one fixed model a single
simplex grown from it (Benton et al. section 4, SPRO), with several the mode-connecting complex
of section 5 (the fixed models share the trainable vertices, and the edges between fixed models,
which cross the barrier, are not part of it; with two fixed models and one trainable vertex it is
the polygonal chain a-theta-b). Training minimises ``E L(sum_i l_i v_i)`` over points drawn
uniformly in a uniformly chosen simplex (``l ~ Dirichlet(1)``) minus ``volume_weight`` times the
log volume of the trainable simplex (Eq. 2; the volume from the Gram determinant of its edge
vectors over parameter entries). The forward pass is the model's own (:mod:`.trainer`). The
result is measured at the vertices, each simplex's centroid and ``samples`` uniform points.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError
from ..results.connectivity import SimplexResult
from .trainer import train_knots


def _dirichlet(m: int, gen: torch.Generator) -> torch.Tensor:
    """One uniform point of the (m-1)-simplex: normalised exponential draws."""
    e = -torch.log(torch.rand(m, generator=gen, dtype=torch.float64).clamp_min(1e-300))
    return e / e.sum()


def _complex_point(n_fixed: int, extra: int, gen: torch.Generator) -> torch.Tensor:
    """Barycentric coordinates over all vertices of a uniform point of a uniformly chosen simplex."""
    f = int(torch.randint(n_fixed, (1,), generator=gen))
    out = torch.zeros(n_fixed + extra, dtype=torch.float64)
    inside = _dirichlet(1 + extra, gen)
    out[f] = inside[0]
    out[n_fixed:] = inside[1:]
    return out


def simplex(models: Sequence[Any], evaluator: PointEvaluator, *, train_data: Any, extra: int = 1, epochs: int = 20,
            lr: float = 0.05, momentum: float = 0.9, batch_size: int = 128, volume_weight: float = 0.0,
            init_scale: float = 0.01, samples: int = 64, seed: int = 0) -> SimplexResult:
    """Train ``extra`` vertices that make a low-loss simplex with the given models.

    Parameters
    ----------
    models : sequence of model-like
        Fixed vertices (at least one model-like).
    evaluator : PointEvaluator
        Architecture, loss and evaluation data.
    train_data : data
        Data the trainable vertices are trained on.
    extra : int
        Number of trainable vertices, initialised at the fixed vertices' centroid plus
        Gaussian noise of ``init_scale`` times the parameters' root-mean-square (so the simplex
        is not degenerate).
    epochs, batch_size : int
        SGD passes over ``train_data`` and minibatch size.
    lr, momentum : float
        SGD learning rate and momentum.
    volume_weight : float
        Weight of the log-volume term (0: no volume regularisation).
    init_scale : float
        Scale of that initial noise, relative to the parameters' root-mean-square.
    samples : int
        Uniformly drawn evaluation points besides the vertices and the centroid.
    seed : int
        Noise, minibatch order and simplex draws.

    Returns
    -------
    SimplexResult
    """
    if len(models) < 1 or extra < 1:
        raise ConfigError(f"a simplex needs at least one fixed and one trainable vertex, got {len(models)} and {extra}")
    fixed = torch.stack([evaluator.vector(m) for m in models])
    m = len(fixed) + extra
    mask = evaluator.space.param_mask
    gen = torch.Generator().manual_seed(seed)
    centre = fixed.mean(0)
    rms = float(centre[mask].pow(2).mean().sqrt())
    noise = torch.randn(extra, len(centre), generator=gen, dtype=torch.float64) * init_scale * rms
    noise[:, ~mask] = 0.0
    knots = torch.cat([fixed, centre + noise])
    fixed_params = fixed[:, mask].to(evaluator.device, evaluator.dtype)

    def log_volume(free: torch.Tensor) -> torch.Tensor:
        vertices = torch.cat([fixed_params[:1], free])
        edges = vertices[1:] - vertices[0]
        return -volume_weight * 0.5 * torch.logdet(edges @ edges.T)

    trained, history = train_knots(evaluator, knots, [False] * len(fixed) + [True] * extra,
                                   lambda g: _complex_point(len(fixed), extra, g), train_data, epochs=epochs, lr=lr,
                                   momentum=momentum, batch_size=batch_size, seed=seed + 1,
                                   regulariser=log_volume if volume_weight > 0 else None, what="simplex training")
    centroids = torch.zeros(len(fixed), m, dtype=torch.float64)
    centroids[:, len(fixed):] = 1.0 / (1 + extra)
    centroids[torch.arange(len(fixed)), torch.arange(len(fixed))] = 1.0 / (1 + extra)
    drawn = [_complex_point(len(fixed), extra, gen) for _ in range(samples)]
    coords = torch.cat([torch.eye(m, dtype=torch.float64), centroids,
                        torch.stack(drawn) if drawn else torch.zeros(0, m, dtype=torch.float64)])
    metrics = evaluator.evaluate(coords @ trained)
    return SimplexResult(coords=coords.numpy(), loss=metrics.loss, accuracy=metrics.accuracy,
                         vertices=trained.numpy(), fixed=len(fixed), history=history,
                         spec={"kind": "simplex", "extra": extra, "epochs": epochs, "lr": lr, "momentum": momentum,
                               "batch_size": batch_size, "volume_weight": volume_weight, "init_scale": init_scale,
                               "seed": seed, "evaluator": evaluator.fingerprint()})


__all__ = ["simplex"]
