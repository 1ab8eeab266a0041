"""IMA's claims (benchmarks/claims.py, claim 4).

The late-round gain over FedAvg, its dependence on participation (Fig. 6b), and where IMA's
model sits on the line from FedAvg's (Fig. 5c/7c).

IMA and FedAvg of one seed share the partition, the initialisation and every round before
IMA starts (round 300 of 400), so each seed's difference is the effect of the IMA phase. The
IMA runs copy those rounds from the FedAvg runs (``fl.branch``) instead of training them again.

Every arm is tracked on the late accuracy of 4a (its value at R/2 and R) and every row is gated
(``Context.gate``) with 4a's tolerance (``GATE_TOL``): 4b compares gains of those accuracies,
and 4c-4d's line between final global models is not measured at R/2.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

import landscape
from fl.recipes import RECIPES

from _common import tensors
from claim_context import Context
from claim_stats import ClaimRow, fmt

#: IMA Table 1 averages accuracy over the last 10 rounds.
LAST = 10
#: Tolerance of 4a and of the finishing gate of every row: half of the ~5-point gain (Fig. 6a).
GATE_TOL = 0.025
#: Sampled fraction of the lower-participation arm (the recipe samples 0.25).
LOW_PARTICIPATION = 0.1
#: Interpolation grid of the FedAvg -> IMA line.
LINE_ALPHAS = 21


def late_accuracy(metrics: Sequence[Mapping[str, Any]], rounds: int = LAST) -> float:
    """Mean global test accuracy over the last ``rounds`` of per-round ``metrics`` (``Run.metrics``)."""
    return float(np.mean([m["test_accuracy"] for m in metrics[-rounds:]]))


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


def claim4(ctx: Context) -> list[ClaimRow]:
    """IMA against FedAvg at the recipe's participation and at a lower one; the FedAvg -> IMA line."""
    # FedAvg first: each IMA run branches from the FedAvg run of its seed at round start_round - 1
    late = {"statistic": late_accuracy, "metric": f"test accuracy over the last {LAST} rounds"}
    fedavg = ctx.arm("ima", "FedAvg", algorithm="fedavg", **late)
    fedavg_low = ctx.arm("ima", f"FedAvg, participation {LOW_PARTICIPATION}", algorithm="fedavg",
                         participation=LOW_PARTICIPATION, **late)
    main = {"IMA": ctx.arm("ima", "IMA", **late), "FedAvg": fedavg}
    low = {"IMA": ctx.arm("ima", f"IMA, participation {LOW_PARTICIPATION}", participation=LOW_PARTICIPATION, **late),
           "FedAvg": fedavg_low}
    acc = {k: [late_accuracy(r.metrics) for r in rs] for k, rs in main.items()}
    acc_low = {k: [late_accuracy(r.metrics) for r in rs] for k, rs in low.items()}
    gain = list(np.subtract(acc["IMA"], acc["FedAvg"]))
    gain_low = list(np.subtract(acc_low["IMA"], acc_low["FedAvg"]))
    ctx.log(f"claim 4: IMA {fmt(acc['IMA'])}, FedAvg {fmt(acc['FedAvg'])}; at participation {LOW_PARTICIPATION}: "
            f"IMA {fmt(acc_low['IMA'])}, FedAvg {fmt(acc_low['FedAvg'])}")
    part = RECIPES[ctx.recipe("ima")].settings["participation"]
    metric = f"global test accuracy, mean of the last {LAST} rounds (IMA Table 1's reading)"
    rows = [ClaimRow("4a", f"IMA gains late-round global accuracy over FedAvg (Table 1; participation {part})",
                     metric, ("IMA", "FedAvg"), acc["IMA"], acc["FedAvg"], "greater", tol=GATE_TOL,
                     rationale="half of the ~5-point gain at Dir 0.1 (IMA Fig. 6a)",
                     blocked=ctx.gate(GATE_TOL, *main.values())),
            ClaimRow("4b", "the gain is larger at lower participation (Fig. 6b)",
                     f"IMA - FedAvg as 4a, at participation {LOW_PARTICIPATION} against {part}",
                     (f"gain at {LOW_PARTICIPATION}", f"gain at {part}"), gain_low, gain, "greater", tol=0.01,
                     rationale="Fig. 6b gives a ratio (the gain at 0.05 is about twice the gain at 0.2), no "
                               "points: one accuracy point",
                     blocked=ctx.gate(GATE_TOL, *main.values(), *low.values()))]
    where, wall, bottom = [], [], []
    for f, i in zip(main["FedAvg"], main["IMA"]):
        t, at_fedavg, at_ima = line(f, i)
        where.append(t)
        wall.append(at_fedavg)
        bottom.append(at_ima)
    ctx.log(f"claim 4: FedAvg -> IMA line: argmin t {fmt(where)}, loss above the minimum at FedAvg {fmt(wall, 4)}, "
            f"at IMA {fmt(bottom, 4)}")
    blocked = ctx.gate(GATE_TOL, *main.values())
    line_metric = (f"training loss on (1 - t) FedAvg + t IMA (final global models, {LINE_ALPHAS} points, union "
                   "of the clients' training data)")
    rows += [ClaimRow("4c", "IMA's model sits at the bottom of the basin whose wall FedAvg's sits on (Fig. 5c/7c): "
                      "the loss minimum is on IMA's side", f"argmin t of the {line_metric}", ("IMA", ""), where,
                      claimed="above", bound=0.5, blocked=blocked,
                      rationale="closer to IMA (t = 1) than to FedAvg (t = 0)"),
             ClaimRow("4d", "... and FedAvg's end is higher above that minimum than IMA's end",
                      f"loss above the line's minimum at each end; {line_metric}", ("FedAvg end", "IMA end"), wall,
                      bottom, "greater", tol=0.01, blocked=blocked,
                      rationale="Fig. 5c/7c are drawings without numbers: 0.01 nats")]
    return rows
