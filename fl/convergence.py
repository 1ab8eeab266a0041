"""Has a run finished training? The plateau and slope of its accuracy, and the finishing rule of claims.

Two questions, two answers.

**Where is a run, and is it still climbing?** :func:`assess` (``Run.convergence()``): over the
last ``max(MIN_WINDOW, ceil(WINDOW_FRACTION * R))`` rounds of an ``R``-round run, the mean test
accuracy (the *plateau*, the accuracy a claim reports) and the least-squares slope; the run
has ``converged`` when the slope is below ``MAX_SLOPE`` (0.1 accuracy points per round). A
diagnostic of the curve alone: it cannot tell a run whose learning rate has annealed to zero
(finished, however its last epochs rose) from one still training.

**May a claim be measured on this run?** :func:`judge`, the rule the claims (``python -m paper_claims``)
gates every arm of every claim on, fixed before the claims are measured (:data:`RULE`):

1. *annealed*: the learning rate of the run's last round (or step) is below
   ``ANNEALED_FRACTION`` (1 %) of the schedule's peak: training has stopped moving the
   model, so the run is finished whatever its curve did on the way down. The schedule is the
   one the run was trained with (:func:`schedule` reads it from an FL run's configuration;
   central training passes its trainer's), never guessed from the curve;
2. otherwise *settled*: the claim's metric moved by less than ``CHANGE_FRACTION`` (half) of
   the claim's tolerance between ``R/2`` and ``R`` (or between ``R`` and ``2R`` where a run
   twice as long exists) -- more training would not move the comparison by a tolerance;
3. otherwise *still changing* (or *not measured* when no metric values exist): no verdict.

>>> metrics = [{"round": r, "test_accuracy": min(0.8, 0.1 * r)} for r in range(1, 31)]
>>> c = assess(metrics)
>>> c.converged, round(c.plateau, 3), c.window
(True, 0.8, 5)
>>> assess(metrics[:6]).converged   # still climbing 10 points a round
False
>>> judge(Progress("accuracy", lr_end=1e-5, lr_peak=0.05, rounds=(10, 20), values=(0.80, 0.85)), tol=0.01).reason
'annealed'
>>> judge(Progress("accuracy", lr_end=0.05, lr_peak=0.05, rounds=(10, 20), values=(0.80, 0.85)), tol=0.01).reason
'still changing'
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from landscape.infra.errors import ConfigError

from .resolve import make_algorithm

#: Share of the run whose slope decides (the last 10% of rounds).
WINDOW_FRACTION = 0.1
#: Fewest rounds a slope is fitted over (a line through fewer points says little).
MIN_WINDOW = 5
#: Largest slope that counts as converged: 0.1 accuracy points per round.
MAX_SLOPE = 0.001
#: A run whose last learning rate is below this fraction of its peak has annealed: finished.
ANNEALED_FRACTION = 0.01
#: Otherwise its claim metric may move by less than this fraction of the claim's tolerance.
CHANGE_FRACTION = 0.5

#: The finishing rule in words, as the claims page prints it (numbers from the constants above).
RULE = (f"A run is *finished*, and may enter a claim, when (1) its learning rate at its last round (or step) "
        f"is below {100 * ANNEALED_FRACTION:g}% of the schedule's peak (*annealed*: the schedule is the one the run "
        f"was trained with, read from its configuration or its trainer, never guessed from the curve), or else (2) "
        f"the claim's metric changed by less than {CHANGE_FRACTION:g} x the claim's tolerance between R/2 and R "
        f"rounds, or between R and 2R where a run twice as long exists (*settled*); for an algorithm that trains "
        f"as another through round t (IMA as FedAvg before t_s), R/2 is the midpoint of rounds t..R, its earlier "
        f"rounds being the other algorithm's. Otherwise it is *still "
        f"changing* (or *not measured* when no value at R/2 exists), and a claim row that uses it gets no verdict. "
        f"Every seed of every arm of a row is judged; the row names each arm that fails and its numbers "
        f"(`fl.convergence.judge`).")


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


@dataclass(frozen=True)
class Progress:
    """What a run did near its end: the facts :func:`judge` decides on.

    Attributes
    ----------
    metric : str
        What ``values`` measure, in words (e.g. ``"test-accuracy plateau"``).
    lr_end : float
        Learning rate of the run's last round (FL) or step (central training).
    lr_peak : float
        Largest learning rate of the run's schedule.
    rounds : tuple of int
        The two run lengths the metric was measured at: ``(R // 2, R)``, or ``(R, 2 R)`` from a
        run twice as long.
    values : tuple of float
        The metric at those lengths; ``nan`` where not measured.
    """

    metric: str
    lr_end: float
    lr_peak: float
    rounds: tuple[int, int]
    values: tuple[float, float] = (math.nan, math.nan)

    @property
    def lr_fraction(self) -> float:
        """``lr_end / lr_peak``: how far the schedule has annealed."""
        return self.lr_end / self.lr_peak

    @property
    def change(self) -> float:
        """``values[1] - values[0]`` (``nan`` when either is missing)."""
        return self.values[1] - self.values[0]


@dataclass(frozen=True)
class Finish:
    """The finishing rule's verdict on one run (:func:`judge`).

    Attributes
    ----------
    finished : bool
        The run may enter a claim.
    reason : str
        ``"annealed"``, ``"settled"``, ``"still changing"`` or ``"not measured"``.
    progress : Progress
        The numbers judged.
    limit : float
        Largest change that counts as settled: ``CHANGE_FRACTION * tol``.
    """

    finished: bool
    reason: str
    progress: Progress
    limit: float

    def numbers(self) -> str:
        """The judged numbers in one phrase: the metric at both lengths and its change, the schedule's end.

        Returns
        -------
        str
            E.g. ``"0.8000 at round 20 -> 0.8200 at round 40, change +0.0200; lr at the end 100% of its peak"``.
        """
        p = self.progress
        lr = f"lr at the end {100 * p.lr_fraction:.3g}% of its peak"
        if not all(math.isfinite(v) for v in p.values):
            return f"no value at round {p.rounds[0]}; {lr}"
        return f"{p.values[0]:.4f} at round {p.rounds[0]} -> {p.values[1]:.4f} at round {p.rounds[1]}, " \
               f"change {p.change:+.4f}; {lr}"

    def __str__(self) -> str:
        if self.reason == "annealed":
            return (f"annealed (lr at the end {100 * self.progress.lr_fraction:.3g}% of its peak, below "
                    f"{100 * ANNEALED_FRACTION:g}%)")
        return f"{self.reason} ({self.progress.metric}: {self.numbers()}; limit {self.limit:.4f})"


def judge(progress: Progress, tol: float) -> Finish:
    """Whether a run has finished training, for a claim of tolerance ``tol`` (the rule :data:`RULE`).

    Parameters
    ----------
    progress : Progress
        The run's schedule at its end and its metric at two lengths.
    tol : float
        The claim's practical tolerance, in the metric's units (> 0).

    Returns
    -------
    Finish
        Finished when annealed (``lr_end < ANNEALED_FRACTION * lr_peak``) or settled
        (``|change| < CHANGE_FRACTION * tol``).

    Raises
    ------
    ConfigError
        When ``tol`` is not positive or the learning rates are not positive and finite.
    """
    if not tol > 0:
        raise ConfigError(f"judge needs a claim tolerance > 0, got {tol!r}")
    if not (0 < progress.lr_peak < math.inf and 0 <= progress.lr_end < math.inf):
        raise ConfigError(f"judge needs finite learning rates with a positive peak, got end {progress.lr_end!r} "
                          f"and peak {progress.lr_peak!r}")
    limit = CHANGE_FRACTION * tol
    if progress.lr_fraction < ANNEALED_FRACTION:
        return Finish(True, "annealed", progress, limit)
    if not all(math.isfinite(v) for v in progress.values):
        return Finish(False, "not measured", progress, limit)
    settled = abs(progress.change) < limit
    return Finish(settled, "settled" if settled else "still changing", progress, limit)


def schedule(config: Mapping[str, Any], rounds: int) -> list[float]:
    """The client learning rate of rounds ``1..rounds`` of an FL run, from its configuration.

    The algorithm's own schedule (``Algorithm.lr``: the per-round decay, IMA's exploration
    schedule), built from the stored configuration, so the rule sees what the run trained with.

    Parameters
    ----------
    config : Mapping[str, Any]
        A run's configuration (``Run.config``).
    rounds : int
        The last round (>= 1).

    Returns
    -------
    list of float
        The rate of round ``r`` at index ``r - 1``.

    Raises
    ------
    ConfigError
        When ``rounds < 1``.
    """
    if rounds < 1:
        raise ConfigError(f"a schedule needs at least one round, got {rounds}")
    algorithm = make_algorithm(config)
    return [float(algorithm.lr(r)) for r in range(1, rounds + 1)]


def plateau(metrics: Sequence[Mapping[str, Any]]) -> float:
    """The test-accuracy plateau of :func:`assess`: the default claim metric of :func:`run_progress`.

    Parameters
    ----------
    metrics : sequence of mapping
        Per-round metrics (``Run.metrics``), possibly cut at an earlier round.

    Returns
    -------
    float
        Mean test accuracy over the convergence window of those rounds.
    """
    return assess(metrics).plateau


def run_progress(run: Any, statistic: Callable[[Sequence[Mapping[str, Any]]], float] = plateau,
                 metric: str = "test-accuracy plateau") -> Progress:
    """The :class:`Progress` of an FL run: its schedule at the end and ``statistic`` at ``R // 2`` and ``R``.

    ``statistic`` is the claim's metric computed from per-round metrics; at ``R // 2`` it sees
    the metrics of rounds ``1..R // 2`` only, as if the run had stopped there.

    Parameters
    ----------
    run : Run
        A stored run (anything with ``metrics`` and ``config``).
    statistic : callable
        ``f(metrics) -> float``, the claim's metric (default: :func:`plateau`).
    metric : str
        What ``statistic`` measures, in words.

    Returns
    -------
    Progress

    Raises
    ------
    ConfigError
        When the run has trained fewer than two rounds (none by ``R // 2``: too short to judge).
    """
    metrics = list(run.metrics)
    last = int(metrics[-1]["round"]) if metrics else 0
    if last < 2:
        raise ConfigError(f"judging whether a run finished needs at least 2 trained rounds, {run} has {last}")
    rates = schedule(run.config, last)
    base, through = make_algorithm(run.config).branch_base()
    first = through if base is not None and through < last - 1 else 0
    middle = first + (last - first) // 2
    half = [m for m in metrics if int(m["round"]) <= middle]
    return Progress(metric, lr_end=rates[-1], lr_peak=max(rates), rounds=(middle, last),
                    values=(float(statistic(half)), float(statistic(metrics))))


def doubled_progress(run: Any, longer: Any, statistic: Callable[[Sequence[Mapping[str, Any]]], float] = plateau,
                     metric: str = "test-accuracy plateau") -> Progress:
    """The :class:`Progress` of an FL run judged against a run twice as long: ``statistic`` at ``R`` and ``2 R``.

    ``longer`` is the same run continued (same seed and settings, ``2 R`` rounds, a schedule
    that does not depend on ``R``); the rule (:data:`RULE`) then asks how much the metric still
    moves after ``R`` instead of how much it moved before.

    Parameters
    ----------
    run : Run
        The stored run of ``R`` rounds.
    longer : Run
        Its continuation to ``2 R`` rounds.
    statistic, metric
        As for :func:`run_progress`.

    Returns
    -------
    Progress
        The schedule of ``run`` at ``R``; the metric of ``run`` and of ``longer``.

    Raises
    ------
    ConfigError
        When ``longer`` has another seed or not twice the rounds.
    """
    metrics, more = list(run.metrics), list(longer.metrics)
    last = int(metrics[-1]["round"]) if metrics else 0
    if int(longer.config["seed"]) != int(run.config["seed"]) or (int(more[-1]["round"]) if more else 0) != 2 * last:
        raise ConfigError(f"{longer} is not {run} continued to twice its {last} rounds (same seed)")
    rates = schedule(run.config, last)
    return Progress(metric, lr_end=rates[-1], lr_peak=max(rates), rounds=(last, 2 * last),
                    values=(float(statistic(metrics)), float(statistic(more))))
