"""Rows of the claims table: seed statistics and verdicts (``python -m paper_claims``).

A claim is measured once per seed. A comparison claim pairs the two arms by seed (same
partition, same initialisation) and looks at the per-seed differences ``d_s = a_s - b_s``,
summarised by their mean, a paired 95% Student-t confidence interval and the effect size
``d_z = mean(d) / std(d)`` (paired Cohen's d, ``std`` with ddof = 1). Every claim carries a
practical tolerance ``tol`` fixed in its definition before measuring. The verdict
(``landscape.claims.statistics.decide``, the rule ``landscape.claims.replicate`` uses too):

* ``reproduced``: the interval excludes 0 in the claimed direction and the mean clears ``tol``;
* ``not reproduced``: the interval lies within ``[-tol, tol]`` or entirely on the wrong side;
* ``inconclusive``: otherwise;
* ``not testable``: a premise of the measurement fails (IMA's: FedAvg has plateaued before
  averaging starts; a loss-matched baseline: its loss within the stated distance of the
  method's), or both arms' means sit at or below the metric's resolution (for a barrier, one
  test sample's worth), so no difference can be measured; the row names the failing seeds;
* ``no verdict: not converged``: a run of an arm has not finished training by the finishing
  rule (``fl.convergence.judge``, below), so the comparison would measure training progress,
  not the method; the row names each such arm and seed with its numbers.

A threshold claim (one arm against a bound, e.g. "the barrier is about 0") uses the interval
of the arm's mean: ``reproduced`` when it lies on the claimed side of the bound, ``not
reproduced`` when it lies on the other side, ``inconclusive`` when it contains the bound.

The column ``Holm p`` gives each decided row's one-sided p-value of its claim (against the
tolerance or bound), adjusted by Holm's step-down method over every decided row of the page
as one family: a reader who wants the family-wise error held at 5% reads "reproduced" only
where it is below 0.05 too. The column ``n`` is the number of paired seeds; ``hw <= tol``
says whether the interval's half-width is within the tolerance (for a threshold claim, the
distance from the bound), i.e. whether the seeds were enough to decide at that resolution.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from landscape.claims.outcome import Outcome
from landscape.claims.statistics import Interval, below_resolution, decide, holm, p_value

from .definitions import ClaimDef


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
        Claim number and letter in the claims table (e.g. ``"1a"``).
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
        Practical tolerance of a comparison, fixed before measuring.
    bound : float
        Bound of a threshold claim.
    note : str
        What was tried, caveats.
    resolution : float
        Smallest difference the metric can show (0: no floor); both arms at or below it make
        the row ``not testable``.
    rationale : str
        Why ``tol`` (or ``bound``) has its value, written with the claim before measuring.
    blocked : str
        Why the row gets no verdict: each arm and seed that has not finished training, with its
        numbers (``paper_claims.context.blockers``); empty when every run behind the row finished.
    untestable : str
        Which premise of the measurement fails, with its numbers (the row is ``not testable``);
        empty when the premises hold.
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
    resolution: float = 0.0
    rationale: str = ""
    blocked: str = ""
    untestable: str = ""

    @classmethod
    def of(cls, definition: ClaimDef, a: Sequence[float], b: Sequence[float] = (), *, blocked: str = "",
           untestable: str = "", resolution: float = 0.0, note: str | None = None, **setting: Any) -> ClaimRow:
        """The row of a defined claim with its measured values.

        Parameters
        ----------
        definition : ClaimDef
            The claim (``paper_claims.definitions.CLAIMS``).
        a, b : sequence of float
            Per-seed values of the arms (``b`` empty for a threshold claim).
        blocked : str
            Why the row gets no verdict ("" when every run finished).
        untestable : str
            Which premise fails ("" when they hold).
        resolution : float
            The metric's resolution (0: no floor).
        note : str or None
            The setting measured, replacing the definition's note when given.
        **setting
            Values of the definition's placeholders.

        Returns
        -------
        ClaimRow
        """
        texts = definition.filled(**setting)
        if note is not None:
            texts["note"] = note
        return cls(a=list(a), b=list(b), blocked=blocked, untestable=untestable, resolution=resolution, **texts)

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
    def interval(self) -> Interval | None:
        """95% t-interval of the paired differences (or of the arm, threshold claims); None without finite values."""
        if not self.a or not np.all(np.isfinite([*self.a, *self.b])):
            return None
        return Interval.paired(self.a, self.b) if self.b else Interval.of(self.a)

    @property
    def verdict(self) -> Outcome:
        """See the module docstring."""
        if self.blocked:
            return Outcome.NOT_CONVERGED
        if self.untestable:
            return Outcome.NOT_TESTABLE
        if not self.a:
            return Outcome.NOT_MEASURED
        interval = self.interval
        if interval is None:
            return Outcome.NOT_MEASURED
        if self.b and self.resolution > 0 and below_resolution(self.a, self.b, self.resolution):
            return Outcome.NOT_TESTABLE
        return decide(interval, self.claimed, tol=self.tol, bound=self.bound)

    @property
    def p_value(self) -> float:
        """One-sided p-value of the claim (``landscape.claims.statistics.p_value``; ``nan`` with fewer than 2 seeds)."""
        if len(self.a) < 2:
            return math.nan
        return p_value(self.a, self.b, self.claimed, tol=self.tol, bound=self.bound)


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
    lines = ["| # | claim | metric | method (A) | baseline (B) | A - B (or A), 95% CI | effect d_z | tol | n | "
             "hw <= tol | Holm p | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    adjusted = holm_column(rows)
    for r, p in zip(rows, adjusted):
        b = fmt(r.b) if r.b else (f"bound {'<' if r.claimed == 'below' else '>'} {r.bound:g}" if r.a else "-")
        effect = "-" if math.isnan(r.effect) else f"{r.effect:+.2f}" if abs(r.effect) < 100 else \
            f"{'+' if r.effect > 0 else '-'}>100"
        a = f"{r.arms[0]}: {fmt(r.a)}" if r.a else "-"
        b = f"{r.arms[1]}: {b}" if r.b else b
        ci = "-" if r.interval is None else str(r.interval)
        reason = r.blocked or r.untestable
        verdict = f"{r.verdict} ({reason})" if reason else r.verdict
        holm_p = "-" if math.isnan(p) else f"{p:.3g}"
        lines.append(f"| {r.claim} | {r.statement} | {r.metric} | {a} | {b} | {ci} | {effect} | {r.tol:g} | "
                     f"{len(r.a)} | {enough(r)} | {holm_p} | {verdict} |")
    return "\n".join(lines)


def enough(row: ClaimRow) -> str:
    """``"yes"`` when the row's 95% half-width is within its tolerance (a threshold claim: its bound's distance).

    ``"-"`` without an interval or a scale to compare with (a threshold claim whose mean sits on its bound).
    """
    interval = row.interval
    if interval is None or math.isnan(interval.low):
        return "-"
    half = (interval.high - interval.low) / 2
    scale = row.tol if row.b else abs(interval.mean - row.bound)
    return "-" if scale == 0 else "yes" if half <= scale else "no"


def holm_column(rows: Sequence[ClaimRow]) -> list[float]:
    """Holm-adjusted p-values of the rows that reach a decision, as one family (``nan`` for the others).

    The family is every row whose verdict is a decision (``Outcome.decided``: reproduced, not
    reproduced, inconclusive) and that has at least two seeds; rows without a verdict (not
    converged, not testable, not measured) are left out of the family and get ``nan``.

    Parameters
    ----------
    rows : sequence of ClaimRow
        The table's rows.

    Returns
    -------
    list of float
        One value per row, in the rows' order: the adjusted p-value (Holm 1979, over the family),
        ``nan`` outside the family.
    """
    family = [i for i, r in enumerate(rows) if r.verdict.decided and len(r.a) >= 2]
    out = [math.nan] * len(rows)
    for i, p in zip(family, holm([rows[i].p_value for i in family])):
        out[i] = p
    return out
