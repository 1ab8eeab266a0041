"""Adaptive search for the supremum of a path's barrier curves (FedGuCci Eq. 3/4).

Instead of a fixed grid, :func:`adaptive_search` evaluates a coarse grid and then bisects, in
batches, only the intervals where the barrier curves could still exceed the best value found
by more than the tolerance. The rule, the assumption behind its bound and what the tolerance
means are in ``docs/barriers.md`` ("Adaptive search"); in short:

* Each curve ``c`` (the loss term of Eq. 3 and the accuracy term of Eq. 4 at each evaluated
  alpha) is bounded on an interval ``[x0, x1]`` of width ``h`` by the concave parabola through
  its two end values with curvature ``M``, plus a random-walk allowance:
  ``c(x) <= c0 + s (x - x0) + M / 2 (x - x0)(x1 - x) + SAFETY * sigma * sqrt(h)``.
* ``M`` is estimated, per interval, as :data:`SAFETY` times the largest absolute second divided
  difference of the evaluated triples that overlap the interval; ``sigma`` (:func:`roughness`)
  from third differences on short stencils at the curve's highest coarse points. The accuracy
  on ``N`` samples is a step function whose small-scale wiggles behave like a random walk;
  ``sigma`` covers them, the parabola covers the smooth trend. This is an assumption, not a
  guarantee: no finite search bounds the supremum of an arbitrary function (a spike narrower
  than the coarse grid is invisible to any method that has not evaluated it).
* Intervals whose bound exceeds the best value by more than ``tol`` are split at their
  midpoint, all in one batch per round, until none is left, or an interval would be narrower
  than :data:`MIN_WIDTH` on alpha, or :data:`MAX_EVALUATIONS` points have been used.

The alphas are dyadic rationals (``k / 2**m``), so they are exact in floating point and the same
inputs give the same alphas.
"""
from __future__ import annotations

from numbers import Real
from typing import Any, Callable

import numpy as np

from ..infra.errors import ConfigError
from ..results.barriers import accuracy_barrier_curve, loss_barrier_curve

#: The value of ``alphas`` that asks for the adaptive search.
ADAPTIVE = "adaptive"
#: Points of the first, evenly spaced grid (alpha = k / 8).
COARSE = 9
#: No interval narrower than this on alpha is split (the search's resolution floor on alpha).
MIN_WIDTH = 2.0 ** -10
#: Factor applied to the estimated curvature and roughness of a curve in its bound.
SAFETY = 2.0
#: Spacing of the 4-point stencils that measure a curve's roughness near its highest points.
PROBE = 2.0 ** -8
#: Number of roughness stencils per curve, at its highest coarse points.
CENTRES = 3
#: Most points one path may use (a 201-point grid's worth).
MAX_EVALUATIONS = 201
#: Tolerance on the barrier values when ``tol`` is not given.
DEFAULT_TOL = 1e-3

#: alphas -> (loss, accuracy) at those alphas, evaluated as one batch.
EvaluateFn = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def search_tolerance(alphas: Any, tol: float | None) -> float | None:
    """Validate the path options: the tolerance of an adaptive search, or None for a grid.

    Parameters
    ----------
    alphas
        The ``alphas`` argument of a path function: a count, the values, or ``"adaptive"``.
    tol
        The ``tol`` argument (None: :data:`DEFAULT_TOL` for an adaptive search).

    Returns
    -------
    float or None
        The tolerance when ``alphas == "adaptive"``, else None.

    Raises
    ------
    ConfigError
        If ``alphas`` is a string other than ``"adaptive"``, ``tol`` is not a finite number
        above 0, or ``tol`` is given with a fixed grid.
    """
    if isinstance(alphas, str):
        if alphas != ADAPTIVE:
            raise ConfigError(f"alphas={alphas!r} is not a grid: give a number of points, the alphas "
                              f"themselves, or alphas={ADAPTIVE!r}")
        if tol is None:
            return DEFAULT_TOL
        if isinstance(tol, bool) or not isinstance(tol, Real) or not np.isfinite(tol) or tol <= 0:
            raise ConfigError(f"tol={tol!r}: the adaptive barrier search needs a finite tolerance above 0 "
                              f"(default {DEFAULT_TOL:g})")
        return float(tol)
    if tol is not None:
        raise ConfigError(f"tol={tol!r} applies only to alphas={ADAPTIVE!r}; a fixed grid has no tolerance")
    return None


def interval_bounds(alphas: np.ndarray, curve: np.ndarray, safety: float = SAFETY,
                    roughness: float = 0.0) -> np.ndarray:
    """Upper bound of a curve on each interval between consecutive alphas.

    On ``[x0, x1]`` the bound is the largest value of ``c0 + s t + M / 2 t (h - t)`` for
    ``t`` in ``[0, h]`` (``h = x1 - x0``, ``s`` the chord's slope), with ``M`` the interval's
    curvature estimate: ``safety`` times the largest ``|second divided difference|`` of the
    (at most two) evaluated triples of consecutive points that contain the interval; plus
    ``safety * roughness * sqrt(h)`` for the random-walk part of a curve (see :func:`roughness`).

    Parameters
    ----------
    alphas
        At least three increasing alphas.
    curve
        Finite curve values at ``alphas``.
    safety
        Factor on the estimated curvature and roughness (above 1 allows for what the points have
        not seen).
    roughness
        The curve's random-walk scale ``sigma`` (0 for a smooth curve).

    Returns
    -------
    numpy.ndarray
        ``(len(alphas) - 1,)`` bounds, each at least the larger of its interval's end values.
    """
    h = np.diff(alphas)
    slope = np.diff(curve) / h
    second = np.abs(2.0 * np.diff(slope) / (h[:-1] + h[1:]))  # triple centred at points 1..n-2
    curvature = safety * np.maximum(np.r_[0.0, second], np.r_[second, 0.0])
    with np.errstate(divide="ignore", invalid="ignore"):
        peak = np.where(curvature > 0, h / 2 + slope / np.where(curvature > 0, curvature, 1.0),
                        np.where(slope > 0, h, 0.0))
    t = np.clip(peak, 0.0, h)
    return curve[:-1] + slope * t + 0.5 * curvature * t * (h - t) + safety * roughness * np.sqrt(h)


def stencil(alphas: np.ndarray, curve: np.ndarray, spacing: float = PROBE, centres: int = CENTRES) -> np.ndarray:
    """The roughness stencils: ``x - spacing, x, x + spacing, x + 2 spacing`` at the curve's highest points.

    Parameters
    ----------
    alphas, curve
        The evaluated alphas (at least three) and the curve there.
    spacing
        Distance between a stencil's points.
    centres
        Number of stencils, at the highest interior points (moved inside [0, 1] where needed).

    Returns
    -------
    numpy.ndarray
        ``(centres, 4)``: one stencil per row, increasing.
    """
    interior = np.arange(1, len(alphas) - 1)
    top = alphas[interior[np.argsort(-curve[interior], kind="stable")[:centres]]]
    start = np.clip(top - spacing, 0.0, 1.0 - 3 * spacing)
    return start[:, None] + spacing * np.arange(4)


def roughness(alphas: np.ndarray, curve: np.ndarray, stencils: np.ndarray) -> float:
    """Random-walk scale ``sigma`` of a curve from its values on the stencils (0 for a smooth curve).

    The accuracy along a path is a mean of step functions (one per sample, switching where the
    sample's prediction changes), so at small scales it moves like a random walk: by about
    ``sigma * sqrt(h)`` over a distance ``h``, which no curvature bound covers. A third difference
    on four points ``spacing`` apart cancels any quadratic trend (a smooth curve leaves its third
    derivative times ``spacing**3``) and, for independent increments of variance
    ``sigma**2 * spacing``, has variance ``6 sigma**2 spacing``. The estimate is the root mean
    square over the stencils of the third differences, divided by ``sqrt(6 spacing)``.

    Parameters
    ----------
    alphas, curve
        The evaluated alphas (including every stencil's) and the curve there.
    stencils
        ``(k, 4)`` alphas (:func:`stencil`).

    Returns
    -------
    float
        The estimate of ``sigma``.
    """
    third = np.diff(curve[np.searchsorted(alphas, stencils)], 3, axis=1)
    return float(np.sqrt(np.mean(third ** 2) / (6 * (stencils[0, 1] - stencils[0, 0]))))


def _curves(alphas: np.ndarray, loss: np.ndarray, accuracy: np.ndarray) -> dict[str, np.ndarray]:
    return {"loss": loss_barrier_curve(alphas, loss), "accuracy": accuracy_barrier_curve(alphas, accuracy)}


def _refinement(alphas: np.ndarray, curves: dict[str, np.ndarray], rough: dict[str, float], tol: float,
                min_width: float, safety: float) -> tuple[dict[str, float], np.ndarray]:
    """The gaps (bound minus best value) of both curves and how far each interval's bound is above tol."""
    gaps: dict[str, float] = {}
    excess = np.full(len(alphas) - 1, -np.inf)
    for name, curve in curves.items():
        if not np.isfinite(curve).all():  # an overflowed point: the barrier is inf/NaN, nothing to bound
            gaps[name] = float("nan")
            continue
        above = interval_bounds(alphas, curve, safety, rough[name]) - curve.max()
        gaps[name] = max(float(above.max()), 0.0)
        excess = np.maximum(excess, above - tol)
    excess[np.diff(alphas) < 2 * min_width] = -np.inf
    return gaps, excess


def adaptive_search(evaluate: EvaluateFn, tol: float, *, coarse: int = COARSE, min_width: float = MIN_WIDTH,
                    safety: float = SAFETY,
                    max_evaluations: int = MAX_EVALUATIONS) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Evaluate a path where its barrier curves may peak, until the bounds are within ``tol``.

    Round 1 evaluates ``coarse`` evenly spaced alphas on [0, 1]; round 2 a 5-point stencil
    (:data:`PROBE` apart) around each curve's best point, to estimate its :func:`roughness`; each
    later round bisects, in one call of ``evaluate``, every interval whose
    :func:`interval_bounds` exceeds the best value of the loss curve (Eq. 3) or the accuracy
    curve (Eq. 4) by more than ``tol`` and is at least ``2 * min_width`` wide. When the budget
    runs short, the intervals furthest above the tolerance go first.

    Parameters
    ----------
    evaluate
        ``alphas -> (loss, accuracy)`` at those alphas.
    tol
        Tolerance on the barrier values, in each curve's units (loss; relative accuracy drop).
    coarse
        Points of the first grid (at least 3).
    min_width
        Resolution floor on alpha (at most :data:`PROBE`).
    safety
        Factor on the estimated curvature and roughness (see :func:`interval_bounds`).
    max_evaluations
        Most points evaluated in all (at least ``coarse``).

    Returns
    -------
    alphas, loss, accuracy : numpy.ndarray
        Every evaluated point, sorted by alpha.
    record : dict
        ``method``, ``tol``, ``evaluations``, ``rounds``, ``loss_gap`` and ``accuracy_gap``
        (how far above the barrier found the curve's supremum may lie under the curvature and
        roughness assumption; NaN when a loss overflowed), ``converged`` (both gaps within
        ``tol``), ``stopped`` (``"tolerance"``, ``"min_width"``, ``"max_evaluations"`` or
        ``"nonfinite"``), ``loss_roughness`` and ``accuracy_roughness``, and the search settings.

    Raises
    ------
    ConfigError
        If ``coarse`` is below 3, ``max_evaluations`` below ``coarse`` or ``min_width`` not in
        (0, :data:`PROBE`].
    """
    if coarse < 3 or max_evaluations < coarse or not 0 < min_width <= PROBE:
        raise ConfigError(f"an adaptive search needs coarse >= 3 points, max_evaluations >= coarse and "
                          f"0 < min_width <= {PROBE:g} (got coarse={coarse}, max_evaluations={max_evaluations}, "
                          f"min_width={min_width:g})")
    alphas = np.linspace(0.0, 1.0, coarse)
    loss, accuracy = (np.asarray(v, dtype=np.float64) for v in evaluate(alphas))
    curves = _curves(alphas, loss, accuracy)
    stencils = {name: stencil(alphas, curve) for name, curve in curves.items()  # none where nothing varies
                if np.isfinite(curve).all() and np.ptp(curve) > 0}
    rough = dict.fromkeys(curves, 0.0)
    new = np.setdiff1d(np.concatenate([np.empty(0), *(p.ravel() for p in stencils.values())]),
                       alphas)[:max_evaluations - len(alphas)]
    rounds = 1
    while new.size:
        new_loss, new_accuracy = evaluate(new)
        order = np.argsort(np.r_[alphas, new], kind="stable")
        alphas = np.r_[alphas, new][order]
        loss = np.r_[loss, np.asarray(new_loss, dtype=np.float64)][order]
        accuracy = np.r_[accuracy, np.asarray(new_accuracy, dtype=np.float64)][order]
        curves = _curves(alphas, loss, accuracy)
        rounds += 1
        if rounds == 2:
            rough.update({name: roughness(alphas, curves[name], points) for name, points in stencils.items()
                          if np.isin(points, alphas).all() and np.isfinite(curves[name]).all()})
        gaps, excess = _refinement(alphas, curves, rough, tol, min_width, safety)
        chosen = np.flatnonzero(excess > 0)
        budget = max_evaluations - len(alphas)
        if chosen.size > budget:  # the intervals furthest above the tolerance first
            chosen = np.sort(chosen[np.argsort(-excess[chosen], kind="stable")[:budget]])
        new = 0.5 * (alphas[chosen] + alphas[chosen + 1])
    gaps, excess = _refinement(alphas, curves, rough, tol, min_width, safety)
    converged = bool(gaps["loss"] <= tol and gaps["accuracy"] <= tol)
    stopped = ("tolerance" if converged else "max_evaluations" if (excess > 0).any() else
               "nonfinite" if np.isnan(list(gaps.values())).any() else "min_width")
    record = {"method": ADAPTIVE, "tol": tol, "evaluations": int(len(alphas)), "rounds": rounds,
              "loss_gap": gaps["loss"], "accuracy_gap": gaps["accuracy"], "converged": converged,
              "stopped": stopped, "loss_roughness": rough["loss"], "accuracy_roughness": rough["accuracy"],
              "coarse": coarse, "min_width": min_width, "safety": safety, "max_evaluations": max_evaluations}
    return alphas, loss, accuracy, record
