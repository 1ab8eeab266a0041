"""Seed statistics and verdicts of the claim measurements (benchmarks/claims.py).

A claim is measured once per seed. A comparison claim pairs the two arms by seed (same
partition, same initialisation) and looks at the per-seed differences ``d_s = a_s - b_s``:

* effect size: ``d_z = mean(d) / std(d)`` (paired Cohen's d, ``std`` with ddof = 1);
* verdict: ``reproduced`` when ``mean(d)`` is in the claimed direction by more than the
  claim's practical tolerance ``tol`` and every seed agrees in sign; ``not reproduced``
  when ``|mean(d)| <= tol`` (no practical difference) or every seed points the other way;
  ``inconclusive`` otherwise (seeds disagree). With 3 seeds "every seed agrees" is a
  one-sided sign test at p = 1/8, so every verdict here rests on few seeds and is a
  reading of this measurement, not a significance statement.

A threshold claim (one arm, e.g. "the identity holds", "the barrier is about 0") is
``reproduced`` when every seed meets the bound, ``not reproduced`` when none does, and
``inconclusive`` otherwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_MEASURED = ("reproduced", "not reproduced", "inconclusive",
                                                          "not measured")


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof = 1; 0 for a single value).

    Parameters
    ----------
    values : sequence of float
        One value per seed.

    Returns
    -------
    tuple of float
        ``(mean, std)``.
    """
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0


@dataclass
class ClaimRow:
    """One measured statement: per-seed values of one or two arms, effect size and verdict.

    Parameters
    ----------
    claim : str
        Claim number and letter of issue 13 section 4 (e.g. ``"1a"``).
    statement : str
        What the paper claims, in the direction measured.
    metric : str
        What is measured, on which data.
    arms : tuple of str
        Labels of arm A (the method) and arm B (the baseline; ``""`` for a threshold claim).
    a, b : list of float
        Per-seed values of the arms (``b`` empty for a threshold claim).
    claimed : str
        ``"greater"`` / ``"less"`` (A against B), ``"not_less"`` (A >= B - tol), or ``"below"``
        / ``"above"`` (A against ``bound``).
    tol : float
        Practical tolerance of a comparison.
    bound : float
        Bound of a threshold claim.
    note : str
        What was tried, caveats.
    """

    claim: str
    statement: str
    metric: str
    arms: tuple[str, str]
    a: list[float]
    b: list[float] = field(default_factory=list)
    claimed: str = "greater"
    tol: float = 0.0
    bound: float = 0.0
    note: str = ""

    @property
    def effect(self) -> float:
        """Paired ``d_z`` of a comparison (``nan`` for a threshold claim)."""
        if not self.b:
            return math.nan
        d = np.asarray(self.a) - np.asarray(self.b)
        m, s = mean_std(d)
        if s == 0.0:
            return 0.0 if m == 0.0 else math.copysign(math.inf, m)
        return m / s

    @property
    def verdict(self) -> str:
        """See the module docstring."""
        if not self.a:
            return NOT_MEASURED
        if not self.b:
            ok = [v < self.bound if self.claimed == "below" else v > self.bound for v in self.a]
            return REPRODUCED if all(ok) else NOT_REPRODUCED if not any(ok) else INCONCLUSIVE
        d = np.asarray(self.a) - np.asarray(self.b)
        if self.claimed == "not_less":
            if d.mean() >= -self.tol:
                return REPRODUCED
            return NOT_REPRODUCED if (d < -self.tol).all() else INCONCLUSIVE
        sign = 1.0 if self.claimed == "greater" else -1.0
        signed = sign * d
        if abs(d.mean()) <= self.tol:
            return NOT_REPRODUCED
        if (signed > 0).all():
            return REPRODUCED
        return NOT_REPRODUCED if (signed < 0).all() else INCONCLUSIVE


def fmt(values: Sequence[float], digits: int = 3) -> str:
    """``"mean ± std"`` of per-seed values, ``"-"`` when there are none."""
    if not len(values):
        return "-"
    m, s = mean_std(values)
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def markdown_table(rows: Sequence[ClaimRow]) -> str:
    """The claims table in Markdown: one line per row, arms as mean ± std over seeds.

    Parameters
    ----------
    rows : sequence of ClaimRow
        The measured rows.

    Returns
    -------
    str
        A Markdown table.
    """
    lines = ["| # | claim | metric | method (A) | baseline (B) | effect d_z | verdict |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        b = fmt(r.b) if r.b else (f"bound {'<' if r.claimed == 'below' else '>'} {r.bound:g}" if r.a else "-")
        effect = "-" if math.isnan(r.effect) else f"{r.effect:+.2f}" if abs(r.effect) < 100 else \
            f"{'+' if r.effect > 0 else '-'}>100"
        a = f"{r.arms[0]}: {fmt(r.a)}" if r.a else "-"
        b = f"{r.arms[1]}: {b}" if r.b else b
        lines.append(f"| {r.claim} | {r.statement} | {r.metric} | {a} | {b} | {effect} | {r.verdict} |")
    return "\n".join(lines)
