"""LSS's claims (claim 6 of the claims page).

Accuracy against FedAvg from a pretrained start (Table 1) and from a random one (Table 11),
flatness (Table 7: the dominant Hessian eigenvalue falls as the soup grows from 2 to 4
members), the regularisers' ablation (Fig. 5) and the connectivity of a client's pool.

Both arms train with the same SGD (lr 0.04, momentum 0.9: the engine's FedAvg has no Adam)
for the recipe's 3 rounds. FedAvg runs twice: at the paper's protocol (8 local epochs, the
epochs of one LSS member) and compute-matched (members x 8 epochs); flatness is compared with
both and with FedAvg at matched training loss, since sharpness follows how far training went.
The pretrained start is :func:`fl.pretrain` on MNIST-1D signals disjoint from the clients'
(one checkpoint per seed). These few-round protocols are not convergence runs: their arms
are not checked for a plateau.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

import fl
import landscape

from . import kernels as cpu_kernels
from .context import ArmPlan, Context
from .definitions import CLAIMS, HESSIAN_SAMPLES, LSS_SGD, PRETRAIN_EPOCHS
from .measures import tensors
from .rows import ClaimRow, fmt


def training_data(run: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The union of the clients' training data (first ``HESSIAN_SAMPLES`` signals)."""
    x, y = (torch.cat([tensors(d)[i] for d in run.client_datasets().values() if len(d)]) for i in (0, 1))
    return x[:HESSIAN_SAMPLES], y[:HESSIAN_SAMPLES]


def sharpness(run: Any) -> tuple[float, float]:
    """Log of the top Hessian eigenvalue (Lanczos) of the training loss at the final global model, and that loss."""
    ev = landscape.Evaluator(run.module(), training_data(run), progress=False)
    state = run.global_state(-1)
    top = float(landscape.hessian_eigenvalues(state, ev, k=1, max_iter=60)[0])
    return float(np.log(max(top, 1e-12))), float(ev.evaluate([state]).loss[0])


def pool_barrier(run: Any) -> float:
    """Mean accuracy barrier over all member pairs of every client's last-round pool.

    Measured on that client's training data (``Run.algorithm_state``:
    ``lss.pool.<client>.<member>.<tensor>``).
    """
    state, data = run.algorithm_state(-1), run.client_datasets()
    barriers = []
    for k in sorted(data):
        members: dict[str, dict[str, torch.Tensor]] = {}
        for name, t in state.items():
            parts = name.split(".", 4)
            if parts[:3] == ["lss", "pool", str(k)]:
                members.setdefault(parts[3], {})[parts[4]] = t
        ev = landscape.Evaluator(run.module(), tensors(data[k]), progress=False)
        ms = [members[m] for m in sorted(members, key=int)]
        barriers += [landscape.interpolate(ms[i], ms[j], ev, alphas=11).accuracy_barrier
                     for i in range(len(ms)) for j in range(i + 1, len(ms))]
    return float(np.mean(barriers))


MEMBERS = 4


def local_epochs(ctx: Context) -> int:
    """Local epochs of one LSS member (and of FedAvg at the paper's protocol): 8, or 2 in quick mode."""
    return 2 if ctx.quick else 8


def pretrained(ctx: Context) -> list[Path | None]:
    """The pretrained start of each seed (None where the data set has no pretraining data: only MNIST-1D has)."""
    folder = ctx.cache / "pretrained"
    return [folder / f"{ctx.recipe('lss')}-seed{s}-e{PRETRAIN_EPOCHS}.safetensors" if ctx.dataset == "mnist1d"
            else None for s in ctx.seeds]


def arms(ctx: Context) -> dict[str, ArmPlan]:
    """LSS with 2, 3 and ``MEMBERS`` members, FedAvg at three budgets, the ablation and the random starts.

    Fixed-budget protocols: no arm is tracked.
    """
    epochs, inits = local_epochs(ctx), pretrained(ctx)

    def arm(label: str, algorithm: str | None = None, start: bool = True, **overrides: Any) -> ArmPlan:
        optimiser = LSS_SGD if algorithm is None else {k: LSS_SGD[k] for k in ("lr", "momentum")}
        calls = tuple({"seed": s, "algorithm": algorithm, **optimiser,
                       **({"init": str(init)} if start and init else {}), **overrides}
                      for s, init in zip(ctx.seeds, inits))
        return ArmPlan("lss", label, calls, tracked=False)

    return {**{f"LSS {n}": arm(f"LSS, {n} members", members=n) for n in (2, 3, MEMBERS)},
            **{f"FedAvg {e}": arm(f"FedAvg, {e} local epochs", "fedavg", local_epochs=e)
               for e in (epochs, 2 * epochs, MEMBERS * epochs)},
            "ablation": arm("LSS with lambda = 0", members=MEMBERS, affinity=0.0, diversity=0.0),
            "scratch LSS": arm("LSS from the random init", start=False, members=MEMBERS),
            "scratch FedAvg": arm("FedAvg from the random init", "fedavg", start=False)}


def claim6(ctx: Context) -> list[ClaimRow]:
    """LSS against FedAvg, members 2-4, the ablation and the pools (see the module docstring)."""
    recipe = ctx.recipe("lss")
    members, epochs = MEMBERS, local_epochs(ctx)
    (ctx.cache / "pretrained").mkdir(parents=True, exist_ok=True)
    cpu_kernels.stamp(ctx.cache / "pretrained")  # reused only under the kernels they were trained with
    inits = pretrained(ctx)
    for s, path in zip(ctx.seeds, inits):  # pretraining data exist for MNIST-1D only (fl.pretrain)
        if path is not None and not path.exists():
            fl.pretrain(ctx.dataset, fl.RECIPES[recipe].settings["model"], out=path, seed=s,
                        epochs=1 if ctx.quick else PRETRAIN_EPOCHS, device=ctx.device, progress=False)
    runs = {k: ctx.train(plan) for k, plan in arms(ctx).items()}
    lss = {n: runs[f"LSS {n}"] for n in (2, 3, members)}
    fedavg = {e: runs[f"FedAvg {e}"] for e in (epochs, 2 * epochs, members * epochs)}
    ablation = runs["ablation"]
    scratch = {"LSS": runs["scratch LSS"], "FedAvg": runs["scratch FedAvg"]}
    acc = lambda runs: [float(r.metrics[-1]["test_accuracy"]) for r in runs]  # noqa: E731
    sharp = {k: [sharpness(r) for r in rs] for k, rs in
             {**{f"LSS {n}": v for n, v in lss.items()}, **{f"FedAvg {e}": v for e, v in fedavg.items()}}.items()}
    for k, v in sharp.items():
        ctx.log(f"claim 6: {k}: log top eigenvalue {fmt([a for a, _ in v])}, training loss {fmt([b for _, b in v], 4)}")
    top = {k: [a for a, _ in v] for k, v in sharp.items()}
    matched = []  # per seed: FedAvg whose training loss is nearest LSS's
    for i in range(len(ctx.seeds)):
        target = sharp[f"LSS {members}"][i][1]
        nearest = min(fedavg, key=lambda e: abs(sharp[f"FedAvg {e}"][i][1] - target))
        matched.append(top[f"FedAvg {nearest}"][i])
    slopes = [float(np.polyfit([2, 3, members], [top[f"LSS {n}"][i] for n in (2, 3, members)], 1)[0])
              for i in range(len(ctx.seeds))]
    distance = [float(np.log(a.metrics[-1]["pool_mean_distance"] / b.metrics[-1]["pool_mean_distance"]))
                for a, b in zip(lss[members], ablation)]
    ctx.log(f"claim 6: accuracy LSS {fmt(acc(lss[members]))}, FedAvg {epochs} epochs {fmt(acc(fedavg[epochs]))}, "
            f"FedAvg {members * epochs} epochs {fmt(acc(fedavg[members * epochs]))}, LSS without regularisers "
            f"{fmt(acc(ablation))}; from random init LSS {fmt(acc(scratch['LSS']))}, "
            f"FedAvg {fmt(acc(scratch['FedAvg']))}")
    ratio = [float(r.metrics[-1]["regulariser_gradient_ratio"]) for r in lss[members]]
    start = (f"fl.pretrain, {PRETRAIN_EPOCHS} epochs on disjoint MNIST-1D signals" if inits[0] else
             f"none: no pretraining data for {ctx.dataset}, so 6a-6b start from the random init too")
    note = (f"3 rounds, 5 clients, both arms SGD lr 0.04 momentum 0.9; pretrained start: {start}; LSS options: "
            f"{lss[members][0].config.get('options')}; regulariser/task gradient ratio in the last round "
            f"{fmt(ratio)}")
    return [ClaimRow.of(CLAIMS["6a"], acc(lss[members]), acc(fedavg[epochs]), note=note),
            ClaimRow.of(CLAIMS["6b"], acc(lss[members]), acc(fedavg[members * epochs])),
            ClaimRow.of(CLAIMS["6c"], acc(scratch["LSS"]), acc(scratch["FedAvg"])),
            ClaimRow.of(CLAIMS["6d"], top[f"LSS {members}"], top[f"FedAvg {epochs}"]),
            ClaimRow.of(CLAIMS["6e"], top[f"LSS {members}"], top[f"FedAvg {members * epochs}"]),
            ClaimRow.of(CLAIMS["6f"], top[f"LSS {members}"], matched, fedavg_epochs=", ".join(map(str, fedavg))),
            ClaimRow.of(CLAIMS["6g"], slopes),
            ClaimRow.of(CLAIMS["6h"], acc(lss[members]), acc(ablation)),
            ClaimRow.of(CLAIMS["6i"], [abs(d) for d in distance]),
            ClaimRow.of(CLAIMS["6j"], [pool_barrier(r) for r in lss[members]])]
