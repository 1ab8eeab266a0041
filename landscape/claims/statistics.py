"""The statistics behind every claim verdict: paired confidence intervals and one decision rule.

A claim is measured once per seed (or pair, or run). A *comparison* pairs two arms by seed
(same partition and initialisation) and looks at the differences ``d_s = a_s - b_s``; a
*threshold* claim looks at one arm against a bound. Both are summarised by a Student-t
confidence interval of the mean,

    mean(d) +- t_{(1 + level) / 2, n - 1} * std(d) / sqrt(n),        std with ddof = 1,

and decided by one rule, fixed before measuring (a claim's tolerance is part of its
definition, with its rationale):

* ``reproduced``: the interval excludes 0 on the claimed side *and* the mean clears the
  tolerance on that side;
* ``not reproduced``: the interval lies inside the tolerance band ``[-tol, tol]``, or
  entirely on the wrong side of 0;
* ``inconclusive``: anything else (the data cannot tell);
* ``not testable``: both arms sit at or below the metric's resolution (for instance a
  barrier smaller than one test sample's worth of accuracy), so no difference is measurable.

For a threshold claim the bound plays the role of 0 (``"below"``: the interval lies below
the bound; ``"above"``: above it). ``"not_less"`` (non-inferiority, A >= B - tol) is
reproduced when the interval's lower end is above ``-tol`` and not reproduced when its
upper end is below ``-tol``.

>>> iv = Interval.of([0.01, 0.03, 0.02, 0.025, 0.015])
>>> round(iv.mean, 3), round(iv.low, 4), round(iv.high, 4)
(0.02, 0.0102, 0.0298)
>>> decide(iv, "greater", tol=0.005)
'reproduced'
>>> decide(Interval(0.014, -0.017, 0.045, 3), "greater", tol=0.005)
'inconclusive'
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats

from ..infra.errors import ConfigError

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_TESTABLE = ("reproduced", "not reproduced", "inconclusive",
                                                          "not testable")
#: The directions a claim can take (see the module docstring).
CLAIMED = ("greater", "less", "not_less", "below", "above")
#: Fewest paired seeds a verdict may rest on (a reviewer's minimum; the interval needs n >= 2).
MIN_SEEDS = 5


@dataclass(frozen=True)
class Interval:
    """A Student-t confidence interval of a mean.

    Attributes
    ----------
    mean
        Mean of the values.
    low, high
        The interval's ends (equal to the mean for a single value).
    n
        Number of values.
    level
        Confidence level.
    """

    mean: float
    low: float
    high: float
    n: int
    level: float = 0.95

    @staticmethod
    def of(values: Sequence[float], level: float = 0.95) -> "Interval":
        """The interval of the mean of ``values``.

        Parameters
        ----------
        values
            One value per seed (for a comparison: the paired differences).
        level
            Confidence level in (0, 1).

        Returns
        -------
        Interval

        Raises
        ------
        ConfigError
            If there is no value, a value is not finite, or ``level`` is outside (0, 1).
        """
        arr = np.asarray(values, dtype=np.float64).ravel()
        if arr.size == 0:
            raise ConfigError("a confidence interval needs at least one value")
        if not np.isfinite(arr).all():
            raise ConfigError(f"a confidence interval needs finite values, got {arr.tolist()}")
        if not 0.0 < level < 1.0:
            raise ConfigError(f"level must lie in (0, 1), got {level}")
        mean = float(arr.mean())
        if arr.size == 1:
            return Interval(mean, mean, mean, 1, level)
        half = float(stats.t.ppf(0.5 + level / 2, arr.size - 1) * arr.std(ddof=1) / math.sqrt(arr.size))
        return Interval(mean, mean - half, mean + half, int(arr.size), level)

    @staticmethod
    def paired(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> "Interval":
        """The interval of the mean paired difference ``a_s - b_s``.

        Parameters
        ----------
        a, b
            Per-seed values of the two arms, in the same seed order.
        level
            Confidence level.

        Returns
        -------
        Interval

        Raises
        ------
        ConfigError
            If the arms have different lengths.
        """
        if len(a) != len(b):
            raise ConfigError(f"paired arms need one value per seed each, got {len(a)} and {len(b)}")
        return Interval.of(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64), level)

    def __str__(self) -> str:
        return f"{self.mean:+.4g} [{self.low:+.4g}, {self.high:+.4g}]"


def decide(interval: Interval, claimed: str, *, tol: float = 0.0, bound: float = 0.0) -> str:
    """The verdict of a claim from its interval (the rule of the module docstring).

    Parameters
    ----------
    interval
        For a comparison, the interval of the paired differences ``a - b``; for a threshold
        claim, the interval of the arm's mean.
    claimed
        One of :data:`CLAIMED`.
    tol
        The claim's practical tolerance (>= 0), fixed before measuring.
    bound
        The bound of a threshold claim (``"below"`` / ``"above"``).

    Returns
    -------
    str
        ``"reproduced"``, ``"not reproduced"`` or ``"inconclusive"``.

    Raises
    ------
    ConfigError
        If ``claimed`` is unknown or ``tol`` is negative.
    """
    if claimed not in CLAIMED:
        raise ConfigError(f"claimed must be one of {CLAIMED}, got {claimed!r}")
    if not tol >= 0.0:
        raise ConfigError(f"tol must be >= 0, got {tol}")
    if claimed == "not_less":
        if interval.low > -tol:
            return REPRODUCED
        return NOT_REPRODUCED if interval.high < -tol else INCONCLUSIVE
    centre = bound if claimed in ("below", "above") else 0.0
    sign = 1.0 if claimed in ("greater", "above") else -1.0
    low, high = sorted((sign * (interval.low - centre), sign * (interval.high - centre)))
    mean = sign * (interval.mean - centre)
    if low > 0.0 and mean > tol:
        return REPRODUCED
    if high < 0.0 or (-tol <= low and high <= tol):
        return NOT_REPRODUCED
    return INCONCLUSIVE


def below_resolution(a: Sequence[float], b: Sequence[float], resolution: float) -> bool:
    """Whether both arms' means sit at or below the metric's resolution (not testable).

    Parameters
    ----------
    a, b
        Per-seed values of the two arms.
    resolution
        The smallest difference the metric can show (for an accuracy barrier on ``n`` test
        samples at accuracy ``A``: ``1 / (n A)``, one sample's worth).

    Returns
    -------
    bool
    """
    return bool(len(a) and len(b) and abs(float(np.mean(a))) <= resolution and abs(float(np.mean(b))) <= resolution)
