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
>>> print(decide(iv, "greater", tol=0.005))
reproduced
>>> print(decide(Interval(0.014, -0.017, 0.045, 3), "greater", tol=0.005))
inconclusive

Many claims tested at once: :func:`p_value` gives each claim's one-sided p-value (the test
whose 95% interval the rule reads) and :func:`holm` adjusts a family of them (Holm 1979), so
that rejecting every claim whose adjusted value is below 0.05 keeps the family-wise error
rate at 5%.

>>> [round(p, 3) for p in holm([0.01, 0.04, 0.03, 0.005])]
[0.03, 0.06, 0.06, 0.02]
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats

from ..infra.errors import ConfigError
from .outcome import Outcome

#: The outcomes of the rule (members of :class:`~landscape.claims.outcome.Outcome`, kept under these names).
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_TESTABLE = (Outcome.REPRODUCED, Outcome.NOT_REPRODUCED,
                                                          Outcome.INCONCLUSIVE, Outcome.NOT_TESTABLE)
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


def decide(interval: Interval, claimed: str, *, tol: float = 0.0, bound: float = 0.0) -> Outcome:
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
    Outcome
        ``reproduced``, ``not reproduced`` or ``inconclusive``.

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


def p_value(a: Sequence[float], b: Sequence[float] = (), claimed: str = "greater", *, tol: float = 0.0,
            bound: float = 0.0) -> float:
    """One-sided Student-t p-value of a claim: how likely its values are if the effect is not on the claimed side.

    The null hypothesis puts the mean at the edge of the claimed side: 0 for ``"greater"`` and
    ``"less"`` (paired differences ``a - b``), ``-tol`` for ``"not_less"``, ``bound`` for a
    threshold claim (``"below"``/``"above"``, ``a`` alone). ``t = sign (mean - centre) /
    (std / sqrt(n))`` with ``std`` at ddof 1 and ``p = P(T_{n-1} >= t)``; with no spread the
    p-value is 0 or 1 (the mean on the claimed side or not).

    Parameters
    ----------
    a, b
        Per-seed values of the arms (``b`` empty for a threshold claim).
    claimed
        One of :data:`CLAIMED`.
    tol
        The claim's tolerance (used by ``"not_less"`` only).
    bound
        The bound of a threshold claim.

    Returns
    -------
    float
        The p-value in [0, 1].

    Raises
    ------
    ConfigError
        For an unknown ``claimed``, fewer than two values, or arms of different lengths.
    """
    if claimed not in CLAIMED:
        raise ConfigError(f"claimed must be one of {CLAIMED}, got {claimed!r}")
    values = np.asarray(a, dtype=np.float64)
    if len(b):
        if len(a) != len(b):
            raise ConfigError(f"paired arms need one value per seed each, got {len(a)} and {len(b)}")
        values = values - np.asarray(b, dtype=np.float64)
    if values.size < 2:
        raise ConfigError(f"a p-value needs at least two values, got {values.size}")
    centre = {"not_less": -tol, "below": bound, "above": bound}.get(claimed, 0.0)
    sign = 1.0 if claimed in ("greater", "above", "not_less") else -1.0
    shift = sign * (float(values.mean()) - centre)
    spread = float(values.std(ddof=1)) / math.sqrt(values.size)
    if spread == 0.0:
        return 0.0 if shift > 0 else 1.0
    return float(stats.t.sf(shift / spread, values.size - 1))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values of a family of tests (Holm 1979), in the input order.

    With the ``m`` p-values sorted ascending, ``p_(1) <= ... <= p_(m)``, the adjusted value of
    ``p_(i)`` is ``max_{j <= i} min(1, (m - j + 1) p_(j))``; a test is rejected at family-wise
    level ``alpha`` when its adjusted value is ``<= alpha``.

    Parameters
    ----------
    p_values
        One p-value per test, each in [0, 1].

    Returns
    -------
    list of float
        The adjusted p-values, in the order of ``p_values``.

    Raises
    ------
    ConfigError
        If a p-value lies outside [0, 1] or is not a number.
    """
    p = np.asarray(p_values, dtype=np.float64)
    if not ((p >= 0.0) & (p <= 1.0)).all():
        raise ConfigError(f"p-values must lie in [0, 1], got {p.tolist()}")
    order = np.argsort(p, kind="stable")
    m = p.size
    adjusted = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order])) if m else p
    out = np.empty(m)
    out[order] = adjusted
    return out.tolist()
