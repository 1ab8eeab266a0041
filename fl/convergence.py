"""Has a run converged? The slope of its global test accuracy over the last rounds.

A claim about a trained model is only about a *trained* model: an arm still climbing at its
last round measures training progress, not the method. The criterion (fixed before any
claim is measured, and the same for every arm):

    slope = least-squares slope of test_accuracy against round over the last
            max(MIN_WINDOW, ceil(WINDOW_FRACTION * R)) rounds of an R-round run

and the run has converged when ``slope < MAX_SLOPE`` (0.1 accuracy points per round). The
plateau is the mean test accuracy over the same window.

>>> metrics = [{"round": r, "test_accuracy": min(0.8, 0.1 * r)} for r in range(1, 31)]
>>> c = assess(metrics)
>>> c.converged, round(c.plateau, 3), c.window
(True, 0.8, 5)
>>> assess(metrics[:6]).converged   # still climbing 10 points a round
False
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from landscape.infra.errors import ConfigError

#: Share of the run whose slope decides (the last 10% of rounds).
WINDOW_FRACTION = 0.1
#: Fewest rounds a slope is fitted over (a line through fewer points says little).
MIN_WINDOW = 5
#: Largest slope that counts as converged: 0.1 accuracy points per round.
MAX_SLOPE = 0.001


@dataclass(frozen=True)
class Convergence:
    """Whether a run's global test accuracy has stopped rising.

    Attributes
    ----------
    converged
        ``slope < MAX_SLOPE`` over the window.
    slope
        Least-squares slope of the test accuracy per round over the window.
    plateau
        Mean test accuracy over the window.
    window
        Number of rounds the slope was fitted over.
    last_round
        The run's last round.
    """

    converged: bool
    slope: float
    plateau: float
    window: int
    last_round: int

    def __str__(self) -> str:
        state = "converged" if self.converged else "NOT converged"
        return (f"{state}: test accuracy {self.plateau:.4f} over the last {self.window} rounds, slope "
                f"{100 * self.slope:+.3f} points/round (limit {100 * MAX_SLOPE:.1f})")


def assess(metrics: Sequence[Mapping[str, Any]], key: str = "test_accuracy") -> Convergence:
    """The convergence of a run from its per-round metrics (``Run.metrics``).

    Parameters
    ----------
    metrics
        One mapping per complete round, with ``round`` and ``key``.
    key
        The metric whose slope decides.

    Returns
    -------
    Convergence

    Raises
    ------
    ConfigError
        When fewer than two rounds hold a finite ``key``.
    """
    rows = [(float(m["round"]), float(m[key])) for m in metrics
            if m.get(key) is not None and math.isfinite(float(m[key]))]
    if len(rows) < 2:
        raise ConfigError(f"convergence needs at least two rounds with {key!r}, got {len(rows)}")
    window = min(len(rows), max(MIN_WINDOW, math.ceil(WINDOW_FRACTION * len(rows))))
    rounds, values = (np.asarray(c) for c in zip(*rows[-window:]))
    slope = float(np.polyfit(rounds, values, 1)[0])
    return Convergence(converged=slope < MAX_SLOPE, slope=slope, plateau=float(values.mean()), window=window,
                       last_round=int(rounds[-1]))
