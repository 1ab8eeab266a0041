"""The one vocabulary of claim verdicts: :class:`Outcome`.

Every verdict of the toolkit is one of these, whether it comes from a check on the user's own
models (:class:`~landscape.claims.verdict.Verdict`, :func:`~landscape.claims.replicate`), from
the decision rule on a paired interval (:func:`~landscape.claims.statistics.decide`) or from
a row of the papers' claims table (``paper_claims``):

* ``reproduced``: the claim holds (for a measurement over seeds: the interval excludes 0 on
  the claimed side and the mean clears the claim's tolerance);
* ``not reproduced``: the claim fails (the interval lies inside the tolerance band, or
  entirely on the wrong side);
* ``inconclusive``: the data cannot tell (the interval straddles; replicates disagree);
* ``not testable``: the measurement cannot test the claim: a premise is not met (models not
  connected to the anchor) or both arms sit at or below the metric's resolution;
* ``no verdict: not converged``: an arm has not finished training, so a comparison would
  measure training progress, not the method;
* ``not measured``: no value was measured.

Only the first three are *decisions*; the others say why there is none. An :class:`Outcome`
is a ``str``, so ``outcome == "reproduced"`` and JSON output work as with plain text.

>>> Outcome("not reproduced") is Outcome.NOT_REPRODUCED
True
>>> f"{Outcome.REPRODUCED}", Outcome.NOT_CONVERGED.decided
('reproduced', False)
"""
from __future__ import annotations

from enum import Enum


class Outcome(str, Enum):
    """A claim's verdict (the module docstring gives each meaning)."""

    REPRODUCED = "reproduced"
    NOT_REPRODUCED = "not reproduced"
    INCONCLUSIVE = "inconclusive"
    NOT_TESTABLE = "not testable"
    NOT_CONVERGED = "no verdict: not converged"
    NOT_MEASURED = "not measured"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @staticmethod
    def of(holds: bool) -> Outcome:
        """``REPRODUCED`` when ``holds``, else ``NOT_REPRODUCED`` (a check's two decisions).

        Parameters
        ----------
        holds : bool
            Whether the check's condition is met.

        Returns
        -------
        Outcome
        """
        return Outcome.REPRODUCED if holds else Outcome.NOT_REPRODUCED

    @property
    def decided(self) -> bool:
        """Whether the outcome is a decision on the claim (reproduced, not reproduced, inconclusive)."""
        return self in DECISIONS


#: The outcomes that decide a claim; the others say why there is no decision.
DECISIONS = (Outcome.REPRODUCED, Outcome.NOT_REPRODUCED, Outcome.INCONCLUSIVE)
