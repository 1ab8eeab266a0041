"""The half-width of a random plane: a number, or ``"auto"`` chosen from the loss's growth.

A fixed ``span`` (Li et al. 2018 use 1 in filter-normalised units) often gives a picture with
nothing in it: a model with small or large weights, a different normalisation or a sharper
minimum makes the same span either a flat patch of the minimum's floor or a plateau of huge
losses with the basin in one cell. Users of the reference implementation of Li et al. tune the
``xmin:xmax`` range by hand, plane after plane. ``span="auto"`` measures the growth first.

The rule
--------
1. Evaluate the loss at the centre, ``L0``, and along ``+u, -u, +v, -v`` at the
   :data:`PROBE_DISTANCES` ``t = 1/64, 1/32, ..., 4`` (direction units; 37 points, one batch).
2. The *rise* at ``t`` is the largest of the four ``L(c +- t d) - L0``; a non-finite loss
   (overflow) counts as an infinite rise.
3. The *target* is ``max(RISE_FACTOR * L0, L0 + RISE_MIN)``: a decade above the centre, and at
   least :data:`RISE_MIN` loss units above it, so a centre loss near zero does not shrink the
   grid to the floor of the minimum.
4. The span is the distance at which the rise first reaches ``target - L0``, interpolated
   between the two probes around it linearly in ``(log t, log rise)`` (exact for a rise that
   is a power of ``t``, such as a quadratic bowl's ``t**2``), or linearly in ``(t, rise)``
   when the rise below it is not positive. Edge cases: reached already at the first probe ->
   ``t = 1/64`` ("floored"); never reached -> ``t = 4`` ("capped"); the first probe past
   the target overflowed -> the probe below it ("overflow").

The grid's edge then lies where the steepest axis reaches the target: the basin fills the
picture, its walls rise a decade, and the plateau beyond is cut off. The result records the
chosen span in ``spec["span"]`` and the probes in ``spec["span_rule"]``.
"""
from __future__ import annotations

import math
from numbers import Real
from typing import Any

import numpy as np
import torch

from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError
from ..space.points import PointSet

#: The value of ``span`` that asks for the rule of this module.
AUTO = "auto"
#: Distances probed along each of ``+u, -u, +v, -v`` (direction units): doubling from 1/64 of
#: the filter norms (where a trained model's loss has barely moved) to 4 times them (where the
#: random direction dominates the weights and the loss only measures the direction).
PROBE_DISTANCES: tuple[float, ...] = tuple(2.0 ** k for k in range(-6, 3))
#: The target is this multiple of the centre loss: one decade, the range a log-scaled plane shows.
RISE_FACTOR = 10.0
#: ... and at least this many loss units above it (for cross-entropy one nat: the true class's
#: probability divided by e), so a centre loss near zero still gets a basin with visible walls.
RISE_MIN = 1.0


def check_span(span: Any) -> float | str:
    """``span`` if it is a positive finite number or ``"auto"``; otherwise a one-line error.

    Parameters
    ----------
    span
        The half-width asked for.

    Returns
    -------
    float or str
        The span as a float, or :data:`AUTO`.

    Raises
    ------
    ConfigError
        Naming what was given and what is accepted.
    """
    if isinstance(span, str):
        if span == AUTO:
            return AUTO
        raise ConfigError(f"span must be a positive number or {AUTO!r}, got {span!r}")
    if not isinstance(span, Real) or isinstance(span, bool) or not math.isfinite(span):
        raise ConfigError(f"span must be a positive finite number (the grid's half-width in direction units) "
                          f"or {AUTO!r}, got {span!r}")
    if span <= 0:
        raise ConfigError(f"span must be > 0 (the grid's half-width in direction units), got {span!r}; "
                          f"or pass span={AUTO!r}")
    return float(span)


def target_loss(centre_loss: float) -> float:
    """The loss level the rule's span reaches along the steepest axis.

    Parameters
    ----------
    centre_loss
        ``L0``, the loss of the centre model.

    Returns
    -------
    float
        ``max(RISE_FACTOR * L0, L0 + RISE_MIN)``.
    """
    return max(RISE_FACTOR * centre_loss, centre_loss + RISE_MIN)


def choose_span(distances: np.ndarray, rise: np.ndarray, needed: float) -> tuple[float, str]:
    """Step 4 of the rule: where the rise first reaches ``needed``.

    Parameters
    ----------
    distances
        Increasing probe distances.
    rise
        The rise at each distance (``inf`` for an overflow).
    needed
        ``target - L0`` (positive).

    Returns
    -------
    tuple of (float, str)
        The span and how it was found: ``"interpolated"``, ``"floored"``, ``"capped"`` or
        ``"overflow"``.
    """
    hits = np.flatnonzero(rise >= needed)
    if hits.size == 0:
        return float(distances[-1]), "capped"
    k = int(hits[0])
    if k == 0:
        return float(distances[0]), "floored"
    t_lo, t_hi, r_lo, r_hi = float(distances[k - 1]), float(distances[k]), float(rise[k - 1]), float(rise[k])
    if not math.isfinite(r_hi):
        return t_lo, "overflow"
    if r_lo > 0:
        share = (math.log(needed) - math.log(r_lo)) / (math.log(r_hi) - math.log(r_lo))
        return math.exp(math.log(t_lo) + share * (math.log(t_hi) - math.log(t_lo))), "interpolated"
    return t_lo + (needed - r_lo) / (r_hi - r_lo) * (t_hi - t_lo), "interpolated"


def auto_span(evaluator: PointEvaluator, centre: torch.Tensor, u: torch.Tensor,
              v: torch.Tensor, index: torch.Tensor | None = None) -> tuple[float, dict[str, Any]]:
    """The span of the module's rule for the plane ``centre + x u + y v``, and its probes.

    Parameters
    ----------
    evaluator
        Evaluates the probes (one batch of ``1 + 4 * len(PROBE_DISTANCES)`` points).
    centre
        Flat vector of the centre model.
    u, v
        The plane's two directions (flat vectors; of a parameter subset's length with ``index``).
    index
        Positions in ``centre`` of a parameter subset that ``u`` and ``v`` move (None: all).

    Returns
    -------
    tuple of (float, dict)
        The span, and the record stored as ``spec["span_rule"]``: ``centre_loss``,
        ``target_loss``, ``distances``, ``axis_losses`` (per distance: ``+u, -u, +v, -v``),
        ``rise`` and ``outcome``.

    Raises
    ------
    ConfigError
        If the centre's loss is not finite (there is no growth to measure).
    """
    distances = np.array(PROBE_DISTANCES)
    axes = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    coeffs = np.concatenate([[[0.0, 0.0]], (distances[:, None, None] * axes[None]).reshape(-1, 2)])
    points = PointSet(centre, torch.stack([u, v]), torch.from_numpy(coeffs), index)
    loss, _ = evaluator.evaluate_points(points, reference=centre, label="span probes")
    centre_loss = float(loss[0])
    if not math.isfinite(centre_loss):
        raise ConfigError(f"span={AUTO!r} needs a finite loss at the centre, got {centre_loss}; pass a numeric span")
    axis_losses = np.asarray(loss[1:], dtype=np.float64).reshape(len(distances), len(axes))
    rise = np.where(np.isfinite(axis_losses), axis_losses - centre_loss, np.inf).max(axis=1)
    target = target_loss(centre_loss)
    span, outcome = choose_span(distances, rise, target - centre_loss)
    return span, {"rule": "auto", "centre_loss": centre_loss, "target_loss": target,
                  "distances": distances.tolist(), "axis_losses": axis_losses.tolist(), "rise": rise.tolist(),
                  "outcome": outcome}
