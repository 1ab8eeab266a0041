"""IMA's claims (claim 4 of the claims page).

The late-round gain over FedAvg, its dependence on participation (Fig. 6b), where IMA's
model sits on the line from FedAvg's (Fig. 5c/7c), and a control: the gain against FedAvg
trained twice as long.

The group runs the recipe's ``plateau`` variant where the data set has one
(``ima-mnist1d-plateau``: the paper's 50 local steps per round, R = 800, t_s = 600), in which
FedAvg has plateaued before IMA starts, IMA's premise. IMA and FedAvg of one seed share the
partition, the initialisation and every round before IMA starts, so each seed's difference
is the effect of the IMA phase. The IMA runs copy those rounds from the FedAvg runs
(``fl.branch``) instead of training them again.

Every arm is tracked on the late accuracy of 4a and every row is gated (``Context.gate``) with
4a's tolerance (``IMA_GATE_TOL``): 4b compares gains of those accuracies, and 4c-4d's line
between final global models is not measured at R/2. The rule (``fl.convergence.RULE``) compares
an arm's value at R/2 and R, except: FedAvg at the recipe's participation is compared at R and 2R
(its FedAvg 2R runs continue it), and IMA, which trains as FedAvg before t_s, at the midpoint of
t_s..R and R. Every row is also not testable unless the premise holds (:func:`premise_failures`):
on each seed FedAvg's late accuracy up to t_s and up to R differ by less than ``PREMISE_TOL``.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

import landscape
from fl.recipes import RECIPES

from .context import ArmPlan, Context
from .definitions import (
    CLAIMS,
    DEFERRED,
    IMA_GATE_TOL,
    LAST,
    LINE_ALPHAS,
    LOW_PARTICIPATION,
    PREMISE_TOL,
    SETTINGS,
)
from .measures import tensors
from .rows import ClaimRow, fmt


def late_accuracy(metrics: Sequence[Mapping[str, Any]], rounds: int = LAST) -> float:
    """Mean global test accuracy over the last ``rounds`` of per-round ``metrics`` (``Run.metrics``)."""
    return float(np.mean([m["test_accuracy"] for m in metrics[-rounds:]]))


def premise(metrics: Sequence[Mapping[str, Any]], start_round: int) -> tuple[float, float]:
    """FedAvg's late accuracy (:func:`late_accuracy`) over the rounds up to ``start_round`` (t_s) and up to R.

    Parameters
    ----------
    metrics : sequence of mapping
        FedAvg's per-round metrics (``Run.metrics``), rounds 1..R.
    start_round : int
        t_s, the round IMA starts averaging.

    Returns
    -------
    tuple of float
        ``(at t_s, at R)``.
    """
    return late_accuracy([m for m in metrics if int(m["round"]) <= start_round]), late_accuracy(metrics)


def premise_failures(label: str, seeds: Sequence[int], values: Sequence[tuple[float, float]]) -> str:
    """Why IMA's premise fails for the FedAvg arm ``label``: each seed whose accuracy moved after t_s ("" if none).

    The premise holds on a seed when ``|at R - at t_s| < PREMISE_TOL`` (half of 4a's tolerance).

    Parameters
    ----------
    label : str
        The FedAvg arm, as the page names it.
    seeds : sequence of int
        The seeds, in the order of ``values``.
    values : sequence of tuple of float
        :func:`premise` per seed.

    Returns
    -------
    str
        ``"IMA's premise fails for <label> ...: seed s (a -> b, +d); ..."``; empty when it holds on every seed.
    """
    bad = [(s, a, b) for s, (a, b) in zip(seeds, values) if not abs(b - a) < PREMISE_TOL]
    if not bad:
        return ""
    return (f"IMA's premise fails for {label}: its accuracy over the last {LAST} rounds moves by {PREMISE_TOL:g} "
            "or more from t_s to R on " + "; ".join(f"seed {s} ({a:.4f} -> {b:.4f}, {b - a:+.4f})"
                                                    for s, a, b in bad))


def premise_summary(label: str, seeds: Sequence[int], values: Sequence[tuple[float, float]]) -> str:
    """How many seeds satisfy IMA's premise for the FedAvg arm ``label``, with every seed's numbers."""
    held = sum(abs(b - a) < PREMISE_TOL for a, b in values)
    return (f"IMA's premise ({label}: late accuracy at t_s and at R differ by less than {PREMISE_TOL:g}) holds on "
            f"{held} of {len(values)} seeds; at t_s / at R / difference: "
            + "; ".join(f"seed {s} {a:.4f} / {b:.4f} / {b - a:+.4f}" for s, (a, b) in zip(seeds, values)))


def line(fedavg: object, ima: object) -> tuple[float, float, float]:
    """Training loss along ``(1 - t) FedAvg + t IMA`` (final global models, union of the clients' training data).

    The argmin ``t*`` and the loss above the minimum at each end.
    """
    data = fedavg.client_datasets()  # type: ignore[attr-defined]
    x, y = (torch.cat([tensors(d)[i] for d in data.values() if len(d)]) for i in (0, 1))
    ev = landscape.Evaluator(fedavg.module(), (x, y), progress=False)  # type: ignore[attr-defined]
    path = landscape.interpolate(fedavg.global_state(-1), ima.global_state(-1), ev,  # type: ignore[attr-defined]
                                 alphas=LINE_ALPHAS)
    loss = np.asarray(path.loss, dtype=np.float64)
    low = float(loss.min())
    return float(path.alphas[int(loss.argmin())]), float(loss[0] - low), float(loss[-1] - low)


def rounds(ctx: Context) -> int:
    """R, the rounds of the group's recipe (before a quick run shrinks them)."""
    return int(RECIPES[ctx.recipe("ima")].settings["rounds"])


def arms(ctx: Context) -> dict[str, ArmPlan]:
    """FedAvg and IMA at the recipe's participation and at ``LOW_PARTICIPATION``, FedAvg first; FedAvg to 2R.

    Each IMA run branches from the FedAvg run of its seed at round ``start_round - 1``.
    """
    late = {"statistic": late_accuracy, "metric": f"test accuracy over the last {LAST} rounds"}
    low = {"participation": LOW_PARTICIPATION}
    main = {"FedAvg": ctx.plan("ima", "FedAvg", algorithm="fedavg", tracked=False, **late),
            "IMA": ctx.plan("ima", "IMA", **late),
            "FedAvg 2R": ctx.plan("ima", "FedAvg, 2R rounds", algorithm="fedavg", rounds=2 * rounds(ctx),
                                  continues=True, **late)}
    if "4b" in DEFERRED:
        return main
    return {**main, "FedAvg low": ctx.plan("ima", f"FedAvg, participation {LOW_PARTICIPATION}", algorithm="fedavg",
                                           **low, **late),
            "IMA low": ctx.plan("ima", f"IMA, participation {LOW_PARTICIPATION}", **low, **late)}


def premises(ctx: Context, label: str, fedavg: Sequence[Any], ima: Sequence[Any]) -> tuple[str, str]:
    """The premise's blocker and summary for one FedAvg arm (its runs and the IMA runs branched from them)."""
    values = [premise(f.metrics, int(i.config["options"]["start_round"])) for f, i in zip(fedavg, ima)]
    summary = premise_summary(label, ctx.seeds, values)
    ctx.log(f"claim 4: {summary}")
    return premise_failures(label, ctx.seeds, values), summary


def low_participation(ctx: Context, runs: Mapping[str, Sequence[Any]], gain: Sequence[float], failed: str,
                      setting: Mapping[str, Any]) -> ClaimRow:
    """Row 4b: IMA's gain at ``LOW_PARTICIPATION`` against its gain at the recipe's (``gain``, premise ``failed``)."""
    if "4b" in DEFERRED:
        return ClaimRow.of(CLAIMS["4b"], [], note=DEFERRED["4b"], **setting)
    low = {"IMA": runs["IMA low"], "FedAvg": runs["FedAvg low"]}
    acc_low = {k: [late_accuracy(r.metrics) for r in rs] for k, rs in low.items()}
    ctx.log(f"claim 4: at participation {LOW_PARTICIPATION}: IMA {fmt(acc_low['IMA'])}, "
            f"FedAvg {fmt(acc_low['FedAvg'])}")
    failed_low, summary_low = premises(ctx, f"FedAvg, participation {LOW_PARTICIPATION}", low["FedAvg"], low["IMA"])
    return ClaimRow.of(CLAIMS["4b"], list(np.subtract(acc_low["IMA"], acc_low["FedAvg"])), gain,
                       blocked=ctx.gate(IMA_GATE_TOL, runs["IMA"], runs["FedAvg"], *low.values()),
                       untestable=" / ".join(r for r in (failed, failed_low) if r),
                       note=f"{summary_low}; at the recipe's participation: as 4a", **setting)


def claim4(ctx: Context) -> list[ClaimRow]:
    """IMA against FedAvg at the recipe's participation and at a lower one; the FedAvg -> IMA line; FedAvg at 2R."""
    plans = arms(ctx)
    runs = {k: ctx.train(plan) for k, plan in plans.items()}
    ctx.track(ctx.recipe("ima"), plans["FedAvg"].label, runs["FedAvg"], late_accuracy, plans["FedAvg 2R"].metric,
              longer=None if ctx.quick else runs["FedAvg 2R"])  # R -> 2R: FedAvg 2R continues these runs
    main = {"IMA": runs["IMA"], "FedAvg": runs["FedAvg"]}
    acc = {k: [late_accuracy(r.metrics) for r in rs] for k, rs in main.items()}
    acc_2r = [late_accuracy(r.metrics) for r in runs["FedAvg 2R"]]
    gain = list(np.subtract(acc["IMA"], acc["FedAvg"]))
    ctx.log(f"claim 4: IMA {fmt(acc['IMA'])}, FedAvg {fmt(acc['FedAvg'])}, FedAvg at 2R {fmt(acc_2r)}")
    failed, summary = premises(ctx, "FedAvg", runs["FedAvg"], runs["IMA"])
    setting = {"part": RECIPES[ctx.recipe("ima")].settings["participation"],
               "rounds": runs["IMA"][0].config["rounds"], "double": runs["FedAvg 2R"][0].config["rounds"], **SETTINGS}

    def blocked(*arms: Sequence[Any]) -> str:
        """The gate of the arms."""
        return ctx.gate(IMA_GATE_TOL, *arms)

    rows = [ClaimRow.of(CLAIMS["4a"], acc["IMA"], acc["FedAvg"], blocked=blocked(*main.values()), untestable=failed,
                        note=summary, **setting),
            low_participation(ctx, runs, gain, failed, setting)]
    where, wall, bottom = [], [], []
    for f, i in zip(main["FedAvg"], main["IMA"]):
        t, at_fedavg, at_ima = line(f, i)
        where.append(t)
        wall.append(at_fedavg)
        bottom.append(at_ima)
    ctx.log(f"claim 4: FedAvg -> IMA line: argmin t {fmt(where)}, loss above the minimum at FedAvg {fmt(wall, 4)}, "
            f"at IMA {fmt(bottom, 4)}")
    rows += [ClaimRow.of(CLAIMS["4c"], where, blocked=blocked(*main.values()), untestable=failed, **setting),
             ClaimRow.of(CLAIMS["4d"], wall, bottom, blocked=blocked(*main.values()), untestable=failed, **setting),
             ClaimRow.of(CLAIMS["4e"], acc["IMA"], acc_2r, blocked=blocked(runs["IMA"], runs["FedAvg 2R"]),
                         untestable=failed, **setting)]
    return rows
