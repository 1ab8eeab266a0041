"""Adaptive search for the supremum of a path's barrier curves (FedGuCci Eq. 3/4).

Instead of a fixed grid, :func:`adaptive_search` evaluates a coarse grid and then bisects, in
batches, only the intervals where the barrier curves could still exceed the best value found
by more than the tolerance. The rule, the assumption behind its bound and what the tolerance
means are in ``docs/barriers.md`` ("Adaptive search"); in short:

* Each curve ``c`` (the loss term of Eq. 3 and the accuracy term of Eq. 4 at each evaluated
  alpha) is bounded on an interval ``[x0, x1]`` by the concave parabola through its two end
  values with curvature ``M``: ``c(x) <= c0 + s (x - x0) + M / 2 (x - x0)(x1 - x)``, valid when
  ``|c''| <= M`` on the interval.
* ``M`` is estimated, per interval, as :data:`SAFETY` times the largest absolute second divided
  difference of the evaluated triples that overlap the interval. This is an assumption, not a
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
from .barriers import accuracy_barrier_curve, loss_barrier_curve

#: The value of ``alphas`` that asks for the adaptive search.
ADAPTIVE = "adaptive"
#: Points of the first, evenly spaced grid (alpha = k / 8).
COARSE = 9
#: No interval narrower than this on alpha is split (the search's resolution floor on alpha).
MIN_WIDTH = 2.0 ** -10
#: Factor applied to the second divided differences to estimate a curve's curvature bound.
SAFETY = 2.0
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


def interval_bounds(alphas: np.ndarray, curve: np.ndarray, safety: float = SAFETY) -> np.ndarray:
    """Upper bound of a curve on each interval between consecutive alphas (parabola bound).

    On ``[x0, x1]`` the bound is the largest value of ``c0 + s t + M / 2 t (h - t)`` for
    ``t`` in ``[0, h]`` (``h = x1 - x0``, ``s`` the chord's slope), with ``M`` the interval's
    curvature estimate: ``safety`` times the largest ``|second divided difference|`` of the
    (at most two) evaluated triples of consecutive points that contain the interval.

    Parameters
    ----------
    alphas
        At least three increasing alphas.
    curve
        Finite curve values at ``alphas``.
    safety
        Factor on the estimated curvature (above 1 allows for curvature the points have not seen).

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
    return curve[:-1] + slope * t + 0.5 * curvature * t * (h - t)


def _refinement(alphas: np.ndarray, loss: np.ndarray, accuracy: np.ndarray, tol: float, min_width: float,
                safety: float) -> tuple[dict[str, float], np.ndarray]:
    """The gaps (bound minus best value) of both curves and how far each interval's bound is above tol."""
    gaps: dict[str, float] = {}
    excess = np.full(len(alphas) - 1, -np.inf)
    for name, curve in (("loss", loss_barrier_curve(alphas, loss)),
                        ("accuracy", accuracy_barrier_curve(alphas, accuracy))):
        if not np.isfinite(curve).all():  # an overflowed point: the barrier is inf/NaN, nothing to bound
            gaps[name] = float("nan")
            continue
        above = interval_bounds(alphas, curve, safety) - curve.max()
        gaps[name] = max(float(above.max()), 0.0)
        excess = np.maximum(excess, above - tol)
    excess[np.diff(alphas) < 2 * min_width] = -np.inf
    return gaps, excess


def adaptive_search(evaluate: EvaluateFn, tol: float, *, coarse: int = COARSE, min_width: float = MIN_WIDTH,
                    safety: float = SAFETY,
                    max_evaluations: int = MAX_EVALUATIONS) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Evaluate a path where its barrier curves may peak, until the bounds are within ``tol``.

    Starts with ``coarse`` evenly spaced alphas on [0, 1]; each round bisects, in one call of
    ``evaluate``, every interval whose :func:`interval_bounds` exceeds the best value of the loss
    curve (Eq. 3) or the accuracy curve (Eq. 4) by more than ``tol`` and is at least
    ``2 * min_width`` wide. When the budget runs short, the intervals furthest above the
    tolerance go first.

    Parameters
    ----------
    evaluate
        ``alphas -> (loss, accuracy)`` at those alphas.
    tol
        Tolerance on the barrier values, in each curve's units (loss; relative accuracy drop).
    coarse
        Points of the first grid (at least 3).
    min_width
        Resolution floor on alpha.
    safety
        Factor on the estimated curvature (see :func:`interval_bounds`).
    max_evaluations
        Most points evaluated in all (at least ``coarse``).

    Returns
    -------
    alphas, loss, accuracy : numpy.ndarray
        Every evaluated point, sorted by alpha.
    record : dict
        ``method``, ``tol``, ``evaluations``, ``rounds``, ``loss_gap`` and ``accuracy_gap``
        (how far above the barrier found the curve's supremum may lie under the curvature
        assumption; NaN when a loss overflowed), ``converged`` (both gaps within ``tol``),
        ``stopped`` (``"tolerance"``, ``"min_width"``, ``"max_evaluations"`` or ``"nonfinite"``)
        and the search settings.

    Raises
    ------
    ConfigError
        If ``coarse`` is below 3 or ``max_evaluations`` below ``coarse``.
    """
    if coarse < 3 or max_evaluations < coarse:
        raise ConfigError(f"an adaptive search needs coarse >= 3 points and max_evaluations >= coarse "
                          f"(got coarse={coarse}, max_evaluations={max_evaluations})")
    alphas = np.linspace(0.0, 1.0, coarse)
    loss, accuracy = (np.asarray(v, dtype=np.float64) for v in evaluate(alphas))
    rounds = 1
    while True:
        gaps, excess = _refinement(alphas, loss, accuracy, tol, min_width, safety)
        chosen = np.flatnonzero(excess > 0)
        budget = max_evaluations - len(alphas)
        if chosen.size == 0 or budget <= 0:
            break
        if chosen.size > budget:  # the intervals furthest above the tolerance first
            chosen = np.sort(chosen[np.argsort(-excess[chosen], kind="stable")[:budget]])
        new = 0.5 * (alphas[chosen] + alphas[chosen + 1])
        new_loss, new_accuracy = evaluate(new)
        order = np.argsort(np.r_[alphas, new], kind="stable")
        alphas = np.r_[alphas, new][order]
        loss = np.r_[loss, np.asarray(new_loss, dtype=np.float64)][order]
        accuracy = np.r_[accuracy, np.asarray(new_accuracy, dtype=np.float64)][order]
        rounds += 1
    converged = bool(gaps["loss"] <= tol and gaps["accuracy"] <= tol)
    stopped = ("tolerance" if converged else "max_evaluations" if chosen.size else
               "nonfinite" if np.isnan(list(gaps.values())).any() else "min_width")
    record = {"method": ADAPTIVE, "tol": tol, "evaluations": int(len(alphas)), "rounds": rounds,
              "loss_gap": gaps["loss"], "accuracy_gap": gaps["accuracy"], "converged": converged,
              "stopped": stopped,
              "coarse": coarse, "min_width": min_width, "safety": safety, "max_evaluations": max_evaluations}
    return alphas, loss, accuracy, record
