"""Grids of points on a plane: their coordinates, and their evaluation into a :class:`~landscape.results.PlaneResult`.

A plane over a parameter subset (:mod:`landscape.space.subsets`) has directions of the
subset's length: its points write ``origin[index] + x u + y v`` into one full-size origin,
and its result holds the origin, directions, mask and layout of the subset only.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError
from ..infra.host_memory import check_fits, points_bytes
from ..results import PlaneResult
from ..space.points import PointSet
from ..space.subsets import Subspace


def grid_axis(lo: float, hi: float, resolution: int) -> np.ndarray:
    """``resolution`` evenly spaced coordinates on ``[lo, hi]``, refused if the grid will not fit.

    Parameters
    ----------
    lo, hi
        The ends of the axis.
    resolution
        Number of coordinates (at least 2); the square grid of ``resolution ** 2`` points must
        fit in host memory.

    Returns
    -------
    numpy.ndarray
        The coordinates, float64.

    Raises
    ------
    ConfigError
        ``resolution < 2``, or a grid larger than host memory allows.
    """
    if resolution < 2:
        raise ConfigError("resolution must be at least 2")
    check_fits(points_bytes(int(resolution) ** 2), f"a plane of resolution={int(resolution):,} "
               f"({int(resolution) ** 2:,} points)", advice="choose a smaller resolution")
    return np.linspace(lo, hi, int(resolution))


def evaluate_grid(evaluator: PointEvaluator, origin: torch.Tensor, u: torch.Tensor, v: torch.Tensor,
                  xs: np.ndarray, ys: np.ndarray, models: Mapping[str, Sequence[float]],
                  spec: dict, sub: Subspace | None = None) -> PlaneResult:
    """Loss and accuracy at ``origin + x u + y v`` for every ``x`` in ``xs`` and ``y`` in ``ys``.

    Parameters
    ----------
    evaluator
        Evaluates each grid point (``origin`` is the BatchNorm reference).
    origin, u, v
        Flat float64 vectors of the evaluator's space (with ``sub``: ``origin`` full size,
        ``u`` and ``v`` of the subset's length).
    xs, ys
        The grid's coordinates along ``u`` and ``v``.
    models
        Label -> ``(x, y)`` of the models placed in the plane.
    spec
        What defines the plane (``kind`` and options); the evaluator's fingerprint and strategy
        are added.
    sub
        The parameter subset the plane moves (None: every entry); recorded in ``spec["params"]``.

    Returns
    -------
    PlaneResult
        ``(len(ys), len(xs))`` loss and accuracy (row = y, column = x).
    """
    evaluator.warn_interpolated_batchnorm()
    gx, gy = np.meshgrid(xs, ys)  # row = y, column = x
    coeffs = torch.from_numpy(np.stack([gx.ravel(), gy.ravel()], axis=1))
    points = PointSet(origin, torch.stack([u, v]), coeffs, None if sub is None else sub.index)
    loss, acc = evaluator.evaluate_points(points, reference=origin, label="plane")
    space = evaluator.space if sub is None else sub
    extra = {} if sub is None else {"params": sub.spec()}
    return PlaneResult(
        x=xs, y=ys, loss=loss.reshape(len(ys), len(xs)), accuracy=acc.reshape(len(ys), len(xs)),
        origin=(origin if sub is None else sub.restrict(origin)).double().numpy(), u=u.double().numpy(),
        v=v.double().numpy(), param_mask=space.param_mask.numpy(),
        models={k: [float(c) for c in xy] for k, xy in models.items()},
        layout=[[e.name, e.offset, e.numel] for e in space.entries],
        spec={**spec, **extra, "evaluator": evaluator.fingerprint(), "strategy": evaluator.strategy})
