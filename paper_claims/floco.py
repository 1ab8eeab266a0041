"""FLOCO's claims (claim 5 of the claims page).

Global accuracy against FedAvg (Table 1, "g" columns), personalised local accuracy against
two personalised baselines (FedAvg plus local fine-tuning, and Ditto, Table 1's "l"
columns), and a low-loss simplex.

Local accuracy is the unweighted mean over clients of the accuracy on the client's local
test split (the recipe's ``local_test_fraction``; every arm of a seed has the same splits):
FLOCO's model at the client's simplex point (its ``local_accuracy`` metric), Ditto's personal
models (the same metric), and FedAvg's final global model after ``local_epochs`` epochs of
SGD on the client's training split with the recipe's optimiser.

The FedAvg arm is the global model of the Ditto run: Ditto's global update is FedAvg's, step
for step, so with the same seed and settings its global models are bit-identical to a FedAvg
run's (``tests/test_ditto.py`` checks this), and one run serves both baselines.

Every row is gated (``Context.gate``) with 5a's tolerance (``FLOCO_GATE_TOL``) on the arms'
test-accuracy plateau, the metric the runs record at every round.
"""
from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import landscape
from fl.algorithms.seeds import make_generator
from fl.models import build_model, classifier_name

from .context import ArmPlan, Context
from .definitions import (
    CLAIMS,
    DEFERRED,
    FLOCO_GATE_TOL,
    SETTINGS,
    SIMPLEX_POINTS,
    SMALL_HEAD_MODEL,
    SMALL_HEAD_SEEDS,
)
from .measures import tensors
from .rows import ClaimRow, fmt


def fine_tuned_local_accuracy(run: Any, seed: int) -> float:
    """Mean local test-split accuracy over clients of the final global model after fine-tuning.

    Fine-tuning: ``local_epochs`` epochs of SGD (the run's lr, momentum, weight decay and batch
    size) on the client's training split; batch order drawn from ``seed`` and the client id.
    """
    cfg = run.config
    train, test = run.client_datasets(), run.client_test_datasets()
    accs = []
    for k in sorted(test):
        if not len(test[k]):
            continue
        module = copy.deepcopy(run.module())
        module.load_state_dict(run.global_state(-1))
        module.train()
        opt = torch.optim.SGD(module.parameters(), lr=cfg["lr"], momentum=cfg["momentum"],
                              weight_decay=cfg["weight_decay"])
        x, y = tensors(train[k])
        gen = make_generator(seed, "fine-tune", k)
        for _ in range(cfg["local_epochs"]):
            order = torch.randperm(len(y), generator=gen)
            for start in range(0, len(y), cfg["batch_size"]):
                idx = order[start:start + cfg["batch_size"]]
                opt.zero_grad()
                F.cross_entropy(module(x[idx]), y[idx]).backward()
                opt.step()
        module.eval()
        with torch.no_grad():
            tx, ty = tensors(test[k])
            accs.append(float((module(tx).argmax(1) == ty).double().mean()))
    return float(np.mean(accs))


def simplex_drop(run: Any, seed: int) -> float:
    """Test accuracy of the simplex centre minus the mean over uniform points of the simplex."""
    ends = run.algorithm_state(-1)["floco.endpoints"]  # (vertices, classes, features), fl.algorithms.floco
    points = np.random.default_rng(seed).dirichlet(np.ones(ends.shape[0]), SIMPLEX_POINTS)
    points = np.vstack([np.full(ends.shape[0], 1.0 / ends.shape[0]), points])  # the centre first
    glob = run.global_state(-1)
    models = [{**glob, "classifier.weight": torch.einsum("m,moi->oi", torch.as_tensor(p, dtype=ends.dtype), ends)}
              for p in points]
    acc = landscape.Evaluator(run.module(), tensors(run.test_dataset()), progress=False).evaluate(models).accuracy
    return float(acc[0] - acc[1:].mean())


def arms(ctx: Context) -> dict[str, ArmPlan]:
    """Ditto (whose global model is FedAvg's, so one run serves both baselines) and FLOCO; both on the small head.

    The small-head arms (``SMALL_HEAD_MODEL``) run on the first ``SMALL_HEAD_SEEDS`` seeds; their
    baseline is plain FedAvg (no personal models are compared there).
    """
    small = {"seeds": ctx.seeds[:SMALL_HEAD_SEEDS], "model": SMALL_HEAD_MODEL}
    main = {"Ditto": ctx.plan("floco", "Ditto (its global model is FedAvg's)", algorithm="ditto"),
            "FLOCO": ctx.plan("floco", "FLOCO")}
    if small_head_reason(ctx):
        return main
    return {**main, "FedAvg small head": ctx.plan("floco", f"FedAvg on {SMALL_HEAD_MODEL}", algorithm="fedavg",
                                                  **small),
            "FLOCO small head": ctx.plan("floco", f"FLOCO on {SMALL_HEAD_MODEL}", **small)}


def classifier_share(module: torch.nn.Module) -> float:
    """The share of ``module``'s parameters held by its classifier (``fl.models.classifier_name``)."""
    head = classifier_name(module)
    sizes = {n: p.numel() for n, p in module.named_parameters()}
    return sum(v for n, v in sizes.items() if n.startswith(head + ".")) / sum(sizes.values())


def claim5(ctx: Context) -> list[ClaimRow]:
    """FLOCO against FedAvg (global), FedAvg + fine-tuning and Ditto (local); the simplex."""
    runs = {k: ctx.train(plan) for k, plan in arms(ctx).items()}
    arms_ = {"FLOCO": runs["FLOCO"], "FedAvg": runs["Ditto"], "Ditto": runs["Ditto"]}
    glob = {k: [float(r.convergence().plateau) for r in rs] for k, rs in arms_.items()}
    local = {"FLOCO": [float(r.metrics[-1].get("local_accuracy", np.nan)) for r in arms_["FLOCO"]],
             "Ditto": [float(r.metrics[-1].get("local_accuracy", np.nan)) for r in arms_["Ditto"]],
             "FedAvg + fine-tuning": [fine_tuned_local_accuracy(r, s) for r, s in zip(arms_["FedAvg"], ctx.seeds)]}
    ctx.log("claim 5: global accuracy " + "; ".join(f"{k} {fmt(v)}" for k, v in glob.items()))
    ctx.log("claim 5: local accuracy " + "; ".join(f"{k} {fmt(v)}" for k, v in local.items()))
    drop = [simplex_drop(r, s) for r, s in zip(arms_["FLOCO"], ctx.seeds)]
    ctx.log(f"claim 5: simplex centre minus the mean over {SIMPLEX_POINTS} uniform points {fmt(drop)}")
    gate = FLOCO_GATE_TOL
    return [ClaimRow.of(CLAIMS["5a"], glob["FLOCO"], glob["FedAvg"], blocked=ctx.gate(gate, arms_["FLOCO"],
                                                                                          arms_["FedAvg"])),
            ClaimRow.of(CLAIMS["5b"], local["FLOCO"], local["FedAvg + fine-tuning"],
                        blocked=ctx.gate(gate, arms_["FLOCO"], arms_["FedAvg"])),
            ClaimRow.of(CLAIMS["5c"], local["FLOCO"], local["Ditto"], blocked=ctx.gate(gate, arms_["FLOCO"],
                                                                                       arms_["Ditto"])),
            ClaimRow.of(CLAIMS["5d"], drop, blocked=ctx.gate(gate, arms_["FLOCO"]), **SETTINGS),
            *small_head(ctx, runs, glob)]


def small_head_reason(ctx: Context) -> str:
    """Why rows 5e-5f are not measured ("" when they are): deferred, or a data set that is not MNIST-1D."""
    if "5e" in DEFERRED:
        return DEFERRED["5e"]
    if ctx.dataset != "mnist1d":
        return f"not measured: {SMALL_HEAD_MODEL} reads MNIST-1D signals, not {ctx.dataset}"
    return ""


def small_head(ctx: Context, runs: dict[str, Any], glob: dict[str, list[float]]) -> list[ClaimRow]:
    """Rows 5e-5f: FLOCO against FedAvg on ``SMALL_HEAD_MODEL``, and against its gain on the recipe's model."""
    base = runs["FLOCO"][0]
    setting = {"small_model": SMALL_HEAD_MODEL, "base_model": base.config["model"],
               "base_share": classifier_share(base.module()), "small_share": math.nan,
               "small_seeds": ", ".join(map(str, ctx.seeds[:SMALL_HEAD_SEEDS]))}
    if ctx.dataset == "mnist1d":  # the model reads MNIST-1D signals only
        setting["small_share"] = classifier_share(build_model(
            SMALL_HEAD_MODEL, num_classes=base.config["num_classes"], input_shape=tuple(base.config["input_shape"])))
    reason = small_head_reason(ctx)
    if reason:
        return [ClaimRow.of(CLAIMS["5e"], [], note=reason, **setting),
                ClaimRow.of(CLAIMS["5f"], [], note=DEFERRED.get("5f", reason), **setting)]
    small = {k: [float(r.convergence().plateau) for r in runs[f"{k} small head"]] for k in ("FLOCO", "FedAvg")}
    paired = len(small["FLOCO"])
    ctx.log(f"claim 5: on {SMALL_HEAD_MODEL}, global accuracy FLOCO {fmt(small['FLOCO'])}; "
            f"FedAvg {fmt(small['FedAvg'])}")
    small_runs = (runs["FLOCO small head"], runs["FedAvg small head"])
    return [ClaimRow.of(CLAIMS["5e"], small["FLOCO"], small["FedAvg"], blocked=ctx.gate(FLOCO_GATE_TOL, *small_runs),
                        **setting),
            ClaimRow.of(CLAIMS["5f"], list(np.subtract(small["FLOCO"], small["FedAvg"])),
                        list(np.subtract(glob["FLOCO"][:paired], glob["FedAvg"][:paired])),
                        blocked=ctx.gate(FLOCO_GATE_TOL, *small_runs, runs["FLOCO"][:paired],
                                         runs["Ditto"][:paired]), **setting)]
