"""FedGuCci's FL claims (claim 1 of the claims page).

Accuracy against FedAvg, with two controls: FedAvg at the matched step size (1b) and FedAvg
at a learning rate tuned on held-out client data (1c).

Every row is gated (``Context.gate``) with 1a's tolerance on the arms' test-accuracy plateau,
after ``FEDGUCCI_ROUNDS`` rounds: each run continues the recipe's 150-round run (the paper's
schedule, lr x 0.99 per round, which does not depend on the number of rounds) with ``fl.branch``.

The official code's FedGuCci (the recipe's reading) adds, after each cross-entropy step, a
step on ``beta * L(alpha w + (1 - alpha) w_anc)`` at ``alpha = 0.5``, whose gradient with
respect to ``w`` is ``alpha * beta = 0.05`` times a task gradient: it acts partly like a 5%
larger step. The control arm of 1b is FedAvg with ``lr x (1 + beta * alpha)``.

1c's FedAvg learning rate is chosen per seed from ``LR_FACTORS`` times the recipe's, on runs
that hold out ``VALIDATION_FRACTION`` of each client's training data (the run's local test
split): the lr whose global model is most accurate on those held-out data over the
convergence window (:func:`tuned_lr`; the global test set plays no part). Arm B is then
FedAvg at that lr on the full training data, trained only for the seeds that chose it.
FedGuCci keeps its recipe's lr (the paper's setting).

The controls are trained only when FedGuCci's own arm has finished training on every seed and
they are not deferred (``DEFERRED``): otherwise 1b and 1c say why without their runs.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

import landscape
from fl.recipes import RECIPES

from .context import CONTINUES, ArmPlan, Context, blockers
from .definitions import (
    ACCURACY_TOL,
    CLAIMS,
    DEFERRED,
    FEDGUCCI_ROUNDS,
    LR_FACTORS,
    SETTINGS,
    VALIDATION_FRACTION,
)
from .measures import tensors
from .rows import ClaimRow, fmt


def plateau(run: Any) -> float:
    """Mean global test accuracy over the run's convergence window (the last 10% of rounds)."""
    return float(run.convergence().plateau)


def step_factor(ctx: Context) -> float:
    """The control arm's learning-rate factor ``1 + beta * alpha`` (the connectivity step's extra gradient)."""
    settings = RECIPES[ctx.recipe("fedgucci")].settings
    return 1.0 + settings["beta"] * settings.get("fixed_alpha", 0.5)


def sweep(ctx: Context) -> list[float]:
    """FedAvg's learning rates of 1c: ``LR_FACTORS`` times the recipe's."""
    lr = RECIPES[ctx.recipe("fedgucci")].settings["lr"]
    return [round(lr * f, 6) for f in LR_FACTORS]


def validation_metrics(run: Any) -> list[dict[str, float]]:
    """Accuracy of the run's global model on the clients' held-out data, each round of its convergence window.

    Parameters
    ----------
    run : fl.Run
        A run trained with ``local_test_fraction`` > 0.

    Returns
    -------
    list of dict
        ``{"round": r, "validation_accuracy": a}`` for the last ``run.convergence().window`` rounds.
    """
    held = [d for d in run.client_test_datasets().values() if len(d)]
    if not held:
        raise landscape.ConfigError(f"run {run.path} holds out no client data (local_test_fraction is 0)")
    x, y = (torch.cat([tensors(d)[i] for d in held]) for i in (0, 1))
    ev = landscape.Evaluator(run.module(), (x, y), progress=False)
    window = [int(m["round"]) for m in run.metrics[-run.convergence().window:]]
    return [{"round": r, "validation_accuracy": float(ev.evaluate([run.global_state(r)]).accuracy[0])}
            for r in window]


def tuned_lr(curves: Mapping[float, Sequence[Mapping[str, Any]]]) -> float:
    """The learning rate whose validation accuracy, mean over its records, is highest (ties: the first given).

    Parameters
    ----------
    curves : mapping
        Learning rate -> records of :func:`validation_metrics`; only ``"validation_accuracy"`` is read.

    Returns
    -------
    float
        The chosen learning rate.
    """
    scores = {lr: float(np.mean([m["validation_accuracy"] for m in records])) for lr, records in curves.items()}
    return max(scores, key=lambda lr: scores[lr])  # max keeps the first of equal scores


def arms(ctx: Context) -> dict[str, ArmPlan]:
    """FedGuCci, FedAvg, FedAvg at the matched step size, 1c's validation runs and its candidate arms B, by label.

    Every run has ``FEDGUCCI_ROUNDS`` rounds and continues the recipe-length run of its settings.
    The candidates at the learning rates other than the recipe's are trained only for the seeds
    that choose them (:func:`claim1`); a dry run lists them all. Deferred controls are left out.
    """
    lr = RECIPES[ctx.recipe("fedgucci")].settings["lr"]
    longer = {"rounds": FEDGUCCI_ROUNDS, CONTINUES: True}
    out = {"FedGuCci": ctx.plan("fedgucci", "FedGuCci", **longer),
           "FedAvg": ctx.plan("fedgucci", "FedAvg", algorithm="fedavg", **longer)}
    if "1b" not in DEFERRED:
        control = "FedAvg lr x %.2f" % step_factor(ctx)
        out[control] = ctx.plan("fedgucci", control, algorithm="fedavg", lr=round(lr * step_factor(ctx), 6), **longer)
    if "1c" not in DEFERRED:
        for rate in sweep(ctx):
            out[f"FedAvg lr {rate:g}, validation"] = ctx.plan(
                "fedgucci", f"FedAvg lr {rate:g}, {100 * VALIDATION_FRACTION:g}% held out", algorithm="fedavg",
                lr=rate, local_test_fraction=VALIDATION_FRACTION, tracked=False, **longer)
        for rate in sweep(ctx):
            if rate != lr:
                out[f"FedAvg lr {rate:g}"] = ctx.plan("fedgucci", f"FedAvg lr {rate:g} (if chosen)",
                                                      algorithm="fedavg", lr=rate, tracked=False, **longer)
    return out


def matched_step(ctx: Context, plans: Mapping[str, ArmPlan], fedgucci: Sequence[Any]) -> ClaimRow:
    """Row 1b: FedGuCci against FedAvg at ``lr x step_factor``."""
    factor = step_factor(ctx)
    control = "FedAvg lr x %.2f" % factor
    runs = ctx.train(plans[control])
    return ClaimRow.of(CLAIMS["1b"], [plateau(r) for r in fedgucci], [plateau(r) for r in runs], factor=factor,
                       blocked=ctx.gate(ACCURACY_TOL, fedgucci, runs))


def tuned(ctx: Context, plans: Mapping[str, ArmPlan], fedgucci: Sequence[Any]) -> ClaimRow:
    """Row 1c: FedGuCci against FedAvg at the learning rate of :func:`sweep` chosen per seed on held-out data."""
    rates = sweep(ctx)
    held = {rate: ctx.train(plans[f"FedAvg lr {rate:g}, validation"]) for rate in rates}
    curves = [{rate: validation_metrics(held[rate][i]) for rate in rates} for i in range(len(ctx.seeds))]
    chosen = [tuned_lr(c) for c in curves]
    for seed, c in zip(ctx.seeds, curves):
        ctx.log(f"claim 1c: seed {seed} validation accuracy by lr: "
                + ", ".join(f"{rate:g} {np.mean([m['validation_accuracy'] for m in c[rate]]):.4f}" for rate in rates))
    candidates = {rate: plans.get(f"FedAvg lr {rate:g}", plans["FedAvg"]) for rate in rates}
    runs = ctx.runs("fedgucci", [candidates[rate].calls[i] for i, rate in enumerate(chosen)])
    record = ctx.track(ctx.recipe("fedgucci"), "FedAvg, lr tuned on held-out data", runs)
    blocked = blockers([ctx.owners[r.path] for r in fedgucci] + [record], ACCURACY_TOL)
    text = ", ".join(f"seed {s}: lr {rate:g}" for s, rate in zip(ctx.seeds, chosen))
    return ClaimRow.of(CLAIMS["1c"], [plateau(r) for r in fedgucci], [plateau(r) for r in runs], blocked=blocked,
                       lrs=", ".join(f"{rate:g}" for rate in rates), chosen=text, **SETTINGS)


def claim1(ctx: Context) -> list[ClaimRow]:
    """FedGuCci against FedAvg, FedAvg at the matched step size and FedAvg at the learning rate tuned per seed.

    The controls are trained only when FedGuCci's arm has finished on every seed and they are
    not deferred (:data:`~paper_claims.definitions.DEFERRED`); otherwise their rows say why.
    """
    plans = arms(ctx)
    runs = {k: ctx.train(plans[k]) for k in ("FedGuCci", "FedAvg")}
    acc = {k: [plateau(r) for r in rs] for k, rs in runs.items()}
    ctx.log("claim 1: plateau accuracy " + "; ".join(f"{k} {fmt(v)}" for k, v in acc.items()))
    rows = [ClaimRow.of(CLAIMS["1a"], acc["FedGuCci"], acc["FedAvg"], rounds=runs["FedGuCci"][0].config["rounds"],
                        base=RECIPES[ctx.recipe("fedgucci")].settings["rounds"],
                        blocked=ctx.gate(ACCURACY_TOL, runs["FedGuCci"], runs["FedAvg"]))]
    unfinished = ctx.gate(ACCURACY_TOL, runs["FedGuCci"])
    texts = {"factor": step_factor(ctx), "lrs": ", ".join(f"{rate:g}" for rate in sweep(ctx)), "chosen": "-",
             **SETTINGS}
    for claim, measure in (("1b", matched_step), ("1c", tuned)):
        if claim in DEFERRED:
            rows.append(ClaimRow.of(CLAIMS[claim], [], note=DEFERRED[claim], **texts))
        elif unfinished:
            rows.append(ClaimRow.of(CLAIMS[claim], [], blocked=unfinished, **texts,
                                    note="not trained: FedGuCci's own arm has not finished, so no claim-1 row can "
                                         "get a verdict"))
        else:
            rows.append(measure(ctx, plans, runs["FedGuCci"]))
    return rows
