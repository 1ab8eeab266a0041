"""LSS's claims (claim 6 of the claims page).

The headline arms run the released code's protocol (recipe ``lss-<dataset>-official``: Adam
5e-4, squared-L2 affinity and simplex-volume diversity at 1e-3, member 0 trained for the
local epochs, each added member one epoch stepping every 15 batches). Its FedAvg is LSS with one
member and no regularisers, i.e. FedAvg with the same optimiser (the engine's FedAvg steps
with SGD; under SGD the two are equal bit for bit, ``tests/test_lss_official.py``), once with
every parameter trained and once with the classifier only (``<model>+head``), the baseline of
the official code, which freezes every non-classifier parameter of its timm models.

Rows: accuracy against both FedAvg arms from a pretrained start (Table 1) and from a random one
(Table 11); flatness (Table 7) against FedAvg and against FedAvg at the same training loss
(one local epoch per round, the round whose loss is nearest LSS's); the slope over 2-4 members;
the regularisers' ablation (Fig. 5); the pool's spread and connectivity; the paper's printed
regularisers (unsquared L2 at lambda = 3, 8 epochs per member) against FedAvg at the same and
at matched compute; and this page's earlier calibrated SGD protocol as a sensitivity row.
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
from fl.models import HEAD_ONLY
from fl.recipes import RECIPES

from . import kernels as cpu_kernels
from .context import QUICK, ArmPlan, Context
from .definitions import CLAIMS, HESSIAN_SAMPLES, LOSS_MATCH, LSS_SGD, MATCH_ROUNDS, PRETRAIN_EPOCHS, SETTINGS
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
#: LSS with one member and no regularisers: FedAvg with LSS's optimiser.
AS_FEDAVG = {"members": 1, "affinity": 0.0, "diversity": 0.0, "interp_samples": 1}
#: The paper's printed regularisers (App. E.1) on top of the official recipe.
PAPER_TERMS = {"distance": "l2", "diversity_measure": "mean", "affinity": 3.0, "diversity": 3.0,
               "budget": "per_member", "interp_samples": 1, "weight_decay": 5e-4}


def local_epochs(ctx: Context) -> int:
    """Local epochs of LSS's first member (and of FedAvg at the paper's protocol): the recipe's (quick: at most 2)."""
    epochs = int(RECIPES[ctx.recipe("lss")].settings["local_epochs"])
    return min(epochs, QUICK["local_epochs"]) if ctx.quick else epochs


def pretrained(ctx: Context) -> list[Path | None]:
    """The pretrained start of each seed (None where the data set has no pretraining data: only MNIST-1D has)."""
    folder = ctx.cache / "pretrained"
    return [folder / f"{ctx.recipe('lss')}-seed{s}-e{PRETRAIN_EPOCHS}.safetensors" if ctx.dataset == "mnist1d"
            else None for s in ctx.seeds]


def arms(ctx: Context) -> dict[str, ArmPlan]:
    """The official protocol (2-4 members, ablation, random start), its FedAvg arms, the paper's terms, calibrated.

    Fixed-budget protocols: no arm is tracked.
    """
    epochs, inits = local_epochs(ctx), pretrained(ctx)
    head = f"{RECIPES[ctx.recipe('lss')].settings['model']}{HEAD_ONLY}"

    def arm(label: str, algorithm: str | None = None, start: bool = True, **overrides: Any) -> ArmPlan:
        calls = tuple({"seed": s, "algorithm": algorithm, **({"init": str(init)} if start and init else {}),
                       **overrides} for s, init in zip(ctx.seeds, inits))
        return ArmPlan("lss", label, calls, tracked=False)

    calibrated = {**PAPER_TERMS, **LSS_SGD, "regulariser_calibration": 0.1}
    return {**{f"LSS {n}": arm(f"LSS, {n} members", members=n) for n in (2, 3, MEMBERS)},
            "FedAvg": arm("FedAvg (Adam)", **AS_FEDAVG),
            "FedAvg head": arm("FedAvg (Adam), head only", model=head, **AS_FEDAVG),
            "ablation": arm("LSS with lambda = 0", affinity=0.0, diversity=0.0),
            "scratch LSS": arm("LSS from the random init", start=False),
            "scratch FedAvg": arm("FedAvg (Adam) from the random init", start=False, **AS_FEDAVG),
            "scratch FedAvg head": arm("FedAvg (Adam), head only, from the random init", start=False, model=head,
                                       **AS_FEDAVG),
            "matched": arm(f"FedAvg (Adam), 1 local epoch x {MATCH_ROUNDS} rounds", local_epochs=1,
                           rounds=MATCH_ROUNDS, **AS_FEDAVG),
            "paper": arm("LSS, the paper's terms", **PAPER_TERMS),
            "paper FedAvg": arm("FedAvg (Adam), weight decay 5e-4", weight_decay=5e-4, **AS_FEDAVG),
            "paper FedAvg 32": arm(f"FedAvg (Adam), weight decay 5e-4, {MEMBERS * epochs} local epochs",
                                   local_epochs=MEMBERS * epochs, weight_decay=5e-4, **AS_FEDAVG),
            "calibrated": arm("LSS, calibrated regularisers, SGD", **calibrated),
            "calibrated FedAvg": arm("FedAvg (SGD)", "fedavg", **{k: calibrated[k] for k in
                                                                   ("lr", "momentum", "weight_decay")})}


def loss_matched(run: Any, target: float) -> tuple[int, float, float]:
    """The round of ``run`` whose global model's training loss is nearest ``target``: round, its loss and sharpness."""
    ev = landscape.Evaluator(run.module(), training_data(run), progress=False)
    rounds = [r for r in run.rounds if r >= 1]
    losses = ev.evaluate([run.global_state(r) for r in rounds]).loss
    best = int(np.argmin(np.abs(np.asarray(losses) - target)))
    state = run.global_state(rounds[best])
    top = float(landscape.hessian_eigenvalues(state, ev, k=1, max_iter=60)[0])
    return rounds[best], float(losses[best]), float(np.log(max(top, 1e-12)))


def claim6(ctx: Context) -> list[ClaimRow]:
    """LSS against FedAvg, members 2-4, the ablation, the pools, the paper's terms (see the module docstring)."""
    recipe = ctx.recipe("lss")
    (ctx.cache / "pretrained").mkdir(parents=True, exist_ok=True)
    cpu_kernels.stamp(ctx.cache / "pretrained")  # reused only under the kernels they were trained with
    inits = pretrained(ctx)
    for s, path in zip(ctx.seeds, inits):  # pretraining data exist for MNIST-1D only (fl.pretrain)
        if path is not None and not path.exists():
            fl.pretrain(ctx.dataset, fl.RECIPES[recipe].settings["model"], out=path, seed=s,
                        epochs=1 if ctx.quick else PRETRAIN_EPOCHS, device=ctx.device, progress=False)
    runs = {k: ctx.train(plan) for k, plan in arms(ctx).items()}
    lss = runs[f"LSS {MEMBERS}"]
    acc = {k: [float(r.metrics[-1]["test_accuracy"]) for r in rs] for k, rs in runs.items()}
    sharp = {k: [sharpness(r) for r in runs[k]] for k in (*(f"LSS {n}" for n in (2, 3, MEMBERS)), "FedAvg")}
    for k, v in sharp.items():
        ctx.log(f"claim 6: {k}: log top eigenvalue {fmt([a for a, _ in v])}, training loss {fmt([b for _, b in v], 4)}")
    top = {k: [a for a, _ in v] for k, v in sharp.items()}
    matched = [loss_matched(r, loss) for r, (_, loss) in zip(runs["matched"], sharp[f"LSS {MEMBERS}"])]
    off = [(s, r, m, loss) for s, (r, m, _), (_, loss) in zip(ctx.seeds, matched, sharp[f"LSS {MEMBERS}"])
           if abs(m - loss) > LOSS_MATCH * loss]
    untestable = "; ".join(f"seed {s}: nearest FedAvg loss {m:.3f} (round {r}) vs LSS {loss:.3f}"
                           for s, r, m, loss in off)
    matched_text = "Matched rounds per seed: " + ", ".join(f"{r} (loss {m:.3f} vs {loss:.3f})" for (r, m, _), (_, loss)
                                                          in zip(matched, sharp[f"LSS {MEMBERS}"]))
    slopes = [float(np.polyfit([2, 3, MEMBERS], [top[f"LSS {n}"][i] for n in (2, 3, MEMBERS)], 1)[0])
              for i in range(len(ctx.seeds))]
    spread = [(float(a.metrics[-1]["pool_mean_distance"]), float(b.metrics[-1]["pool_mean_distance"]))
              for a, b in zip(lss, runs["ablation"])]
    distance = [abs(float(np.log(a / b))) if a > 0 and b > 0 else np.nan for a, b in spread]
    no_spread = "; ".join(f"seed {s}: mean pairwise distance {a:.3g} with the regularisers, {b:.3g} without (added "
                          "members took no step)" for s, (a, b) in zip(ctx.seeds, spread) if not (a > 0 and b > 0))
    ctx.log("claim 6: accuracy " + "; ".join(f"{plan.label} {fmt(acc[k])}" for k, plan in arms(ctx).items()))
    steps = [float(np.mean([r.metrics[-1].get("added_member_steps", np.nan)])) for r in lss]
    start = (f"fl.pretrain, {PRETRAIN_EPOCHS} epochs on disjoint MNIST-1D signals" if inits[0] else
             f"none: no pretraining data for {ctx.dataset}, so 6a-6b start from the random init too")
    note = (f"3 rounds, 5 clients; pretrained start: {start}; LSS options: {lss[0].config.get('options')}; "
            f"optimiser steps of the added members per client in the last round {fmt(steps, 1)}")
    return [ClaimRow.of(CLAIMS["6a"], acc[f"LSS {MEMBERS}"], acc["FedAvg"], note=note),
            ClaimRow.of(CLAIMS["6b"], acc[f"LSS {MEMBERS}"], acc["FedAvg head"]),
            ClaimRow.of(CLAIMS["6c"], acc["scratch LSS"], acc["scratch FedAvg"]),
            ClaimRow.of(CLAIMS["6d"], acc["scratch LSS"], acc["scratch FedAvg head"]),
            ClaimRow.of(CLAIMS["6e"], top[f"LSS {MEMBERS}"], top["FedAvg"],
                        note=f"training loss LSS {fmt([b for _, b in sharp[f'LSS {MEMBERS}']])}, FedAvg "
                             f"{fmt([b for _, b in sharp['FedAvg']])}: read with 6f"),
            ClaimRow.of(CLAIMS["6f"], top[f"LSS {MEMBERS}"], [t for _, _, t in matched], untestable=untestable,
                        matched=matched_text, **SETTINGS),
            ClaimRow.of(CLAIMS["6g"], slopes),
            ClaimRow.of(CLAIMS["6h"], acc[f"LSS {MEMBERS}"], acc["ablation"]),
            ClaimRow.of(CLAIMS["6i"], distance, untestable=no_spread),
            ClaimRow.of(CLAIMS["6j"], [pool_barrier(r) for r in lss]),
            ClaimRow.of(CLAIMS["6k"], acc["paper"], acc["paper FedAvg"]),
            ClaimRow.of(CLAIMS["6l"], acc["paper"], acc["paper FedAvg 32"]),
            ClaimRow.of(CLAIMS["6m"], acc["calibrated"], acc["calibrated FedAvg"])]
