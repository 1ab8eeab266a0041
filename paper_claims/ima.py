"""IMA's claims (claim 4 of the claims page).

The late-round gain over FedAvg, its dependence on participation (Fig. 6b), and where IMA's
model sits on the line from FedAvg's (Fig. 5c/7c).

IMA and FedAvg of one seed share the partition, the initialisation and every round before
IMA starts (round 300 of 400), so each seed's difference is the effect of the IMA phase. The
IMA runs copy those rounds from the FedAvg runs (``fl.branch``) instead of training them again.

Every arm is tracked on the late accuracy of 4a (its value at R/2 and R) and every row is gated
(``Context.gate``) with 4a's tolerance (``IMA_GATE_TOL``): 4b compares gains of those accuracies,
and 4c-4d's line between final global models is not measured at R/2.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

import landscape
from fl.recipes import RECIPES

from .context import ArmPlan, Context
from .definitions import CLAIMS, IMA_GATE_TOL, LAST, LINE_ALPHAS, LOW_PARTICIPATION, SETTINGS
from .measures import tensors
from .rows import ClaimRow, fmt


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


def arms(ctx: Context) -> dict[str, ArmPlan]:
    """FedAvg and IMA at the recipe's participation and at ``LOW_PARTICIPATION``, FedAvg first.

    Each IMA run branches from the FedAvg run of its seed at round ``start_round - 1``.
    """
    late = {"statistic": late_accuracy, "metric": f"test accuracy over the last {LAST} rounds"}
    low = {"participation": LOW_PARTICIPATION}
    return {"FedAvg": ctx.plan("ima", "FedAvg", algorithm="fedavg", **late),
            "FedAvg low": ctx.plan("ima", f"FedAvg, participation {LOW_PARTICIPATION}", algorithm="fedavg",
                                   **low, **late),
            "IMA": ctx.plan("ima", "IMA", **late),
            "IMA low": ctx.plan("ima", f"IMA, participation {LOW_PARTICIPATION}", **low, **late)}


def claim4(ctx: Context) -> list[ClaimRow]:
    """IMA against FedAvg at the recipe's participation and at a lower one; the FedAvg -> IMA line."""
    runs = {k: ctx.train(plan) for k, plan in arms(ctx).items()}
    main = {"IMA": runs["IMA"], "FedAvg": runs["FedAvg"]}
    low = {"IMA": runs["IMA low"], "FedAvg": runs["FedAvg low"]}
    acc = {k: [late_accuracy(r.metrics) for r in rs] for k, rs in main.items()}
    acc_low = {k: [late_accuracy(r.metrics) for r in rs] for k, rs in low.items()}
    gain = list(np.subtract(acc["IMA"], acc["FedAvg"]))
    gain_low = list(np.subtract(acc_low["IMA"], acc_low["FedAvg"]))
    ctx.log(f"claim 4: IMA {fmt(acc['IMA'])}, FedAvg {fmt(acc['FedAvg'])}; at participation {LOW_PARTICIPATION}: "
            f"IMA {fmt(acc_low['IMA'])}, FedAvg {fmt(acc_low['FedAvg'])}")
    setting = {"part": RECIPES[ctx.recipe("ima")].settings["participation"], **SETTINGS}
    blocked = ctx.gate(IMA_GATE_TOL, *main.values())
    rows = [ClaimRow.of(CLAIMS["4a"], acc["IMA"], acc["FedAvg"], blocked=blocked, **setting),
            ClaimRow.of(CLAIMS["4b"], gain_low, gain, blocked=ctx.gate(IMA_GATE_TOL, *main.values(), *low.values()),
                        **setting)]
    where, wall, bottom = [], [], []
    for f, i in zip(main["FedAvg"], main["IMA"]):
        t, at_fedavg, at_ima = line(f, i)
        where.append(t)
        wall.append(at_fedavg)
        bottom.append(at_ima)
    ctx.log(f"claim 4: FedAvg -> IMA line: argmin t {fmt(where)}, loss above the minimum at FedAvg {fmt(wall, 4)}, "
            f"at IMA {fmt(bottom, 4)}")
    rows += [ClaimRow.of(CLAIMS["4c"], where, blocked=blocked, **setting),
             ClaimRow.of(CLAIMS["4d"], wall, bottom, blocked=blocked, **setting)]
    return rows
