"""The :class:`Verdict` of a claim check, and :func:`replicate` for verdicts over seeds or pairs.

A verdict carries the measured numbers, the thresholds it was decided with, the result
objects behind the numbers, a legend of the numbers' names, and which numbers are reported
for information only. One measurement has no spread: :func:`replicate` runs a check on
several pairs, seeds or runs and reports the mean, standard deviation and how many hold.
"""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..infra.errors import ConfigError
from ..results.base import jsonable
from .outcome import Outcome
from .statistics import Interval, decide

#: The outcomes a check can reach (:class:`~landscape.claims.outcome.Outcome`).
STATUSES = (Outcome.REPRODUCED, Outcome.NOT_REPRODUCED, Outcome.INCONCLUSIVE, Outcome.NOT_TESTABLE)


@dataclass(frozen=True)
class Verdict:
    """The outcome of a claim check.

    Attributes
    ----------
    kind
        The check (``"transitivity"``, ``"group_connectivity"``, ...).
    claim
        The claim in one sentence.
    status
        An :class:`~landscape.claims.outcome.Outcome`: ``reproduced`` (the claim holds),
        ``not reproduced``, ``not testable`` (a premise is not met, e.g. the models are not
        connected to the anchor) or ``inconclusive`` (replicates disagree). Given as text, it is
        converted.
    reason
        One sentence saying why.
    numbers
        The measured values.
    thresholds
        The decision thresholds.
    results
        The result objects behind the numbers.
    reference
        Where the claim comes from (paper, equation) and the docs page explaining it.
    legend
        Plain-language meaning of the names in ``numbers``.
    informational
        Names of numbers reported for context that do not enter the decision.
    replicates
        How many measurements the verdict rests on (1: a single pair or seed, no spread).
    margin
        Signed distance of the deciding quantity from its threshold, positive on the claimed
        side (e.g. ``threshold - barrier``); None when the decision is not one number.
        :func:`replicate` decides on the confidence interval of the margins.
    margin_rule
        What ``margin`` is, as a formula of the numbers and thresholds (printed beside it).
    """

    kind: str
    claim: str
    status: Outcome
    reason: str
    numbers: Mapping[str, Any]
    thresholds: Mapping[str, Any]
    results: Mapping[str, Any] = field(default_factory=dict)
    reference: str = ""
    legend: Mapping[str, str] = field(default_factory=dict)
    informational: tuple[str, ...] = ()
    replicates: int = 1
    margin: float | None = None
    margin_rule: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ConfigError(f"status must be one of {[str(s) for s in STATUSES]}, got {self.status!r}")
        object.__setattr__(self, "status", Outcome(self.status))

    @property
    def holds(self) -> bool:
        """True only for the status ``reproduced``."""
        return self.status == Outcome.REPRODUCED

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (numbers, thresholds, verdict; result objects are left out).

        Returns
        -------
        dict
        """
        return {"kind": self.kind, "claim": self.claim, "holds": self.holds, "status": self.status,
                "reason": self.reason, "reference": self.reference, "replicates": self.replicates,
                "numbers": jsonable(dict(self.numbers)), "thresholds": jsonable(dict(self.thresholds)),
                "legend": dict(self.legend), "informational": list(self.informational)}

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON.

        Returns
        -------
        str
            Indented JSON text (non-finite numbers written as ``NaN``/``Infinity``).
        """
        return json.dumps(self.to_dict(), indent=2, allow_nan=True)

    # ------------------------------------------------------------- rendering
    def _rows(self) -> list[tuple[str, str]]:
        return [(k + (" (info)" if k in self.informational else ""), fmt(v)) for k, v in self.numbers.items()]

    def _footer(self) -> list[str]:
        lines = ["Thresholds: " + ", ".join(f"{k}={fmt(v)}" for k, v in self.thresholds.items())]
        if self.replicates == 1:
            lines.append("One measurement, no spread: use landscape.claims.replicate over seeds or pairs.")
        else:
            lines.append(f"Over {self.replicates} replicates: numbers are means, *_std their standard deviations.")
        if self.informational:
            lines.append("(info): reported for context, not part of the verdict.")
        if self.margin is not None:
            lines.append(f"Margin: {fmt(self.margin)} = {self.margin_rule or 'distance from the threshold'} "
                         "(positive on the claimed side; replicate() decides on its interval over seeds)")
        lines += [f"{k}: {v}" for k, v in self.legend.items() if k in self.numbers]
        if self.reference:
            lines.append(f"Reference: {self.reference}")
        return lines

    def __repr__(self) -> str:
        margin = "" if self.margin is None else f"; margin {fmt(self.margin)} = {self.margin_rule}"
        return f"Verdict({self.kind}: {self.status} -- {self.reason}{margin})"

    def __str__(self) -> str:
        rows = self._rows()
        width = max((len(k) for k, _ in rows), default=0)
        lines = [f"Claim: {self.claim}", f"Verdict: {self.status.upper()} -- {self.reason}"]
        lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
        return "\n".join(lines + self._footer())

    def _repr_markdown_(self) -> str:
        mark = {Outcome.REPRODUCED: "✅", Outcome.NOT_REPRODUCED: "❌", Outcome.NOT_TESTABLE: "➖",
                Outcome.INCONCLUSIVE: "❔"}[self.status] + f" {self.status}"
        lines = [f"**{self.claim}**", "", f"Verdict: **{mark}** — {self.reason}", "",
                 "| quantity | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in self._rows()]
        lines += [""] + [f"- {line}" for line in self._footer()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        colour = {Outcome.REPRODUCED: "#1a7f37", Outcome.NOT_REPRODUCED: "#cf222e", Outcome.NOT_TESTABLE: "#6e7781",
                  Outcome.INCONCLUSIVE: "#9a6700"}[self.status]
        rows = "".join(f"<tr><td style='text-align:left'>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                       for k, v in self._rows())
        notes = "".join(f"<li>{html.escape(line)}</li>" for line in self._footer())
        return (f"<div><div><strong>{html.escape(self.claim)}</strong></div>"
                f"<div>Verdict: <strong style='color:{colour}'>{html.escape(str(self.status))}</strong> — "
                f"{html.escape(self.reason)}</div><table><thead><tr><th>quantity</th><th>value</th></tr>"
                f"</thead><tbody>{rows}</tbody></table><ul>{notes}</ul></div>")


def fmt(value: Any) -> str:
    """A short text for a number, flag or list in a verdict table.

    Parameters
    ----------
    value
        The value.

    Returns
    -------
    str
    """
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.4g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    return str(value)


def replicate(check: Callable[..., Verdict], cases: Sequence[Sequence[Any] | Mapping[str, Any]],
              **common: Any) -> Verdict:
    """Run a claim check on several cases (pairs, seeds, runs) and summarise the spread.

    Parameters
    ----------
    check
        A check such as :func:`~landscape.claims.transitivity`.
    cases
        Positional argument tuples (or keyword mappings) of ``check``, one per replicate.
    **common
        Keyword arguments shared by every case (the evaluator, thresholds, ...).

    Returns
    -------
    Verdict
        ``numbers`` holds the mean of every numeric quantity, ``<name>_std`` its standard
        deviation (ddof 1), ``holds_in`` the count of replicates that hold, and ``margin``,
        ``margin_low``, ``margin_high`` the 95% t-interval of the applicable replicates'
        margins. The status is ``reproduced`` when that interval lies above 0, ``not
        reproduced`` when it lies below 0, ``inconclusive`` otherwise
        (:func:`~landscape.claims.statistics.decide`), ``not testable`` when no replicate is
        applicable. Checks without a margin fall back to agreement: ``reproduced`` / ``not
        reproduced`` only when every applicable replicate agrees.
        ``results["verdicts"]`` keeps the individual verdicts.
    """
    if len(cases) < 2:
        raise ConfigError("replicate needs at least two cases (pairs, seeds or runs) to measure a spread")
    verdicts = [check(**case, **common) if isinstance(case, Mapping) else check(*case, **common) for case in cases]
    first = verdicts[0]
    numbers: dict[str, Any] = {}
    for name in first.numbers:
        values = [v.numbers.get(name) for v in verdicts]
        if all(isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) for x in values):
            arr = np.asarray(values, dtype=np.float64)
            numbers[name] = float(np.mean(arr))
            numbers[f"{name}_std"] = float(np.std(arr, ddof=1))
    applicable = [v for v in verdicts if v.status in (Outcome.REPRODUCED, Outcome.NOT_REPRODUCED)]
    held = sum(v.holds for v in applicable)
    numbers["holds_in"] = f"{held}/{len(verdicts)}"
    margins = [v.margin for v in applicable]
    skipped = f"{len(verdicts) - len(applicable)} not applicable"
    if not applicable:
        status, reason = Outcome.NOT_TESTABLE, f"no replicate is applicable ({skipped})"
    elif len(applicable) >= 2 and all(m is not None and math.isfinite(m) for m in margins):
        interval = Interval.of(margins)
        numbers.update({"margin": interval.mean, "margin_low": interval.low, "margin_high": interval.high})
        status = decide(interval, "above", bound=0.0)
        reason = (f"margin {interval} (mean and 95% t-interval over {len(applicable)} applicable replicates, "
                  f"> 0 on the claimed side; {skipped}); holds in {held} of them")
    else:  # no single deciding number (or one applicable replicate): every replicate must agree
        status = Outcome.of(held == len(applicable)) if held in (0, len(applicable)) else Outcome.INCONCLUSIVE
        reason = f"holds in {held} of {len(applicable)} applicable replicates ({skipped}); no margin interval"
    legend = dict(first.legend)
    if "margin" in numbers:
        legend["margin"] = (f"mean over the replicates of {first.margin_rule or 'the distance from the threshold'} "
                            "(positive on the claimed side); margin_low, margin_high: its 95% t-interval")
    return Verdict(kind=first.kind, claim=first.claim, status=status, reason=reason, numbers=numbers,
                   thresholds=first.thresholds, results={"verdicts": verdicts}, reference=first.reference,
                   legend=legend, informational=first.informational, replicates=len(verdicts),
                   margin_rule=first.margin_rule)
