"""Central-training claims of benchmarks/claims.py (FedGuCci Sec. 3).

Transitivity with a trained anchor (Table 1: individual accuracy, fused accuracy and
barrier), with weak anchors (Tables 7/9), and the group barrier against the group size K
(Fig. 4, K = 2..8).

Per seed: an anchor and a pool of models from their own initialisations, trained
with plain cross-entropy and with the connectivity loss (beta = 1) to a trained, a
random-init and a semi-trained anchor, with the model of the FedGuCci recipe on the same data.
Training: SGD with momentum 0.9, batch 32, learning rate 0.05 annealed to 0 by a cosine over
``EPOCHS`` epochs (a constant rate leaves the models 3-9 points short of a run twice as long).

Finished training, by the rule of the FL runs (:func:`fl.convergence.judge`), for every arm
(vanilla, connectivity loss, each weak anchor): the schedule is the Trainer's own
(:meth:`Trainer.rates`), and a cosine schedule ends annealed. The metric the rule falls back
on is model 0's test accuracy, recorded after every epoch of each arm (epoch R/2 against R);
the vanilla model 0 is also trained for twice the epochs, and its arm compares R with 2R.
Every row is gated with 2c's tolerance (``GATE_TOL``), the accuracy of the pool's models.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

import landscape
from fl.convergence import Progress, assess
from fl.datasets import load_dataset
from fl.recipes import RECIPES

import claim_kernels
from claim_context import ArmRecord, blockers
from claim_stats import ClaimRow, fmt
from transitivity import Trainer

#: Models per seed in the pool (Fig. 4 goes up to K = 8) and with a weak anchor (pairs only).
POOL, WEAK_POOL = 8, 3
#: Epochs of central training.
EPOCHS = 20
#: Learning-rate schedule of central training (``Trainer.schedule``).
SCHEDULE = "cosine"
#: Tolerance of the finishing gate of every central row: 2c's (one accuracy point).
GATE_TOL = 0.01
#: The central arms: key (the anchor, or vanilla) -> label on the page.
ARMS = {"vanilla": "vanilla CE", "trained": "connectivity loss, trained anchor",
        "random-init": "connectivity loss, random-init anchor",
        "semi-trained": "connectivity loss, semi-trained anchor"}


def learning_curve(tr: Trainer, folder: Path, key: str, ev: landscape.Evaluator, tag: str = "vanilla",
                   **kwargs: Any) -> list[dict[str, float]]:
    """Test accuracy of ``key``'s model (``tag``, trained with ``kwargs``) after every epoch.

    ``[{"round": epoch, "test_accuracy": a}, ...]``, the form :func:`fl.convergence.assess`
    reads, stored beside the cached models and re-read by a later call. The training that
    records it also stores the model where :meth:`Trainer.cached` finds it, so the model is
    trained once.
    """
    path = Path(folder) / f"{tr.file_name(key, tag)}-curve.json"
    if path.exists():
        return json.loads(path.read_text())
    curve: list[dict[str, float]] = []
    state = tr.train(key, on_epoch=lambda epoch, module: curve.append(
        {"round": epoch, "test_accuracy": float(ev.evaluate([module.state_dict()]).accuracy[0])}), **kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = Path(folder) / f"{tr.file_name(key, tag)}.safetensors"
    if not model.exists():
        landscape.save_state_dict(state, model)
    path.write_text(json.dumps(curve))
    return curve


def progress(tr: Trainer, curve: Sequence[Mapping[str, float]], doubled: float | None = None) -> Progress:
    """The finishing rule's facts of one central model: its schedule's end and its accuracy at two lengths.

    Epoch ``R // 2`` against ``R`` of ``curve``, or ``R`` against ``2 R`` when ``doubled`` (the
    accuracy of the same model trained twice as long) is given.
    """
    rates = tr.rates(tr.epochs, len(tr.y))
    acc = [c["test_accuracy"] for c in curve]
    rounds, values = ((tr.epochs, 2 * tr.epochs), (acc[-1], doubled)) if doubled is not None else \
        ((tr.epochs // 2, tr.epochs), (acc[tr.epochs // 2 - 1], acc[-1]))
    return Progress("test accuracy of model 0", lr_end=rates[-1], lr_peak=max(rates), rounds=rounds,
                    values=(float(values[0]), float(values[1])))


def pair_metrics(models: Sequence[Mapping[str, Any]], ev: landscape.Evaluator) -> dict[str, float]:
    """Table 1's metrics, averaged over all pairs.

    Individual accuracy (mean of the two endpoints), fused accuracy (the midpoint) and the
    accuracy barrier (Eq. 4, 11 alphas).
    """
    ind, fused, barrier = [], [], []
    for i in range(len(models)):
        for j in range(i + 1, len(models)):
            path = landscape.interpolate(models[i], models[j], ev, alphas=11)
            ind.append(0.5 * (path.accuracy[0] + path.accuracy[-1]))
            fused.append(path.accuracy[5])
            barrier.append(path.accuracy_barrier)
    return {"ind": float(np.mean(ind)), "fused": float(np.mean(fused)), "barrier": float(np.mean(barrier))}


def transitivity_claims(ctx: Any) -> list[ClaimRow]:
    """Claims 2 and 3 (see the module docstring)."""
    data = load_dataset(ctx.dataset, root=ctx.data_root)
    model = RECIPES[ctx.recipe("fedgucci")].settings["model"]  # the FL claims' model
    epochs, pool, weak_pool = (2, 3, 2) if ctx.quick else (EPOCHS, POOL, WEAK_POOL)
    m: dict[str, list[float]] = {}
    sizes = list(range(2, pool + 1))
    records = {arm: ArmRecord("central training", label, list(ctx.seeds), [], []) for arm, label in ARMS.items()}
    folder = ctx.cache / "central"
    folder.mkdir(parents=True, exist_ok=True)
    claim_kernels.stamp(folder)  # its models are reused only under the kernels they were trained with
    for seed in ctx.seeds:
        tr = Trainer(data.train_x, data.train_y, data.input_shape, epochs, 0.05, 32, seed, model=model,
                     schedule=SCHEDULE)
        ev = landscape.Evaluator(tr.init("template"), (data.test_x, data.test_y), progress=False)
        anchor = tr.cached(folder, "anchor")
        keys = [f"model {i}" for i in range(pool)]
        weak = {"random-init": tr.init("random anchor").state_dict(),
                "semi-trained": tr.cached(folder, "semi anchor", "steps20", steps=20)}
        anchors = {"trained": anchor, **weak}
        tags = {"vanilla": ("vanilla", {}), **{k: (f"{k}-anchor-beta1", {"anchor": a, "beta": 1.0})
                                               for k, a in anchors.items()}}
        # model 0 of every arm first, recording its learning curve; the cached pools then reuse it
        curves = {arm: learning_curve(tr, folder, keys[0], ev, tag, **kw) for arm, (tag, kw) in tags.items()}
        longer = Trainer(data.train_x, data.train_y, data.input_shape, 2 * epochs, 0.05, 32, seed,
                         model=model, schedule=SCHEDULE).cached(folder, keys[0])
        doubled = float(ev.evaluate([longer]).accuracy[0])
        for arm, record in records.items():
            record.plateaus.append(assess(curves[arm]).plateau)
            record.progress.append(progress(tr, curves[arm], doubled if arm == "vanilla" else None))
        vanilla = [tr.cached(folder, k) for k in keys]
        conn = [tr.cached(folder, k, "trained-anchor-beta1", anchor=anchor, beta=1.0) for k in keys]
        values = {"vanilla": pair_metrics(vanilla, ev), "trained": pair_metrics(conn, ev)}
        for name, w_anc in weak.items():
            values[name] = pair_metrics([tr.cached(folder, k, f"{name}-anchor-beta1", anchor=w_anc, beta=1.0)
                                         for k in keys[:weak_pool]], ev)
        for name, models in (("slope vanilla", vanilla), ("slope conn", conn)):
            by_k = landscape.group_barrier_by_size(models, ev, sizes=sizes, draws=5, seed=seed).accuracy_barrier
            values[name] = {"slope": float(np.polyfit(sizes, np.asarray(by_k).mean(axis=1), 1)[0])}
        for arm, metrics in values.items():
            for k, v in metrics.items():
                m.setdefault(f"{arm} {k}", []).append(v)
        ctx.log(f"claims 2-3 seed {seed}: model 0 {assess(curves['vanilla'])}; {2 * epochs} epochs add "
                f"{doubled - curves['vanilla'][-1]['test_accuracy']:+.4f}; "
                + ", ".join(f"{k} {v[-1]:.3f}" for k, v in m.items()))
    for k, v in m.items():
        ctx.log(f"claims 2-3: {k} {fmt(v)}")
    for record in records.values():
        ctx.arms.append(record)
        ctx.log(record.line())
    setting = (f"central SGD (lr 0.05 cosine-annealed to 0, momentum 0.9, batch 32, {epochs} epochs), beta = 1 "
               f"(the paper gives none), {model}; test set; means over all pairs of the pool")
    base = ("vanilla CE",)
    pair = blockers([records["trained"], records["vanilla"]], GATE_TOL)
    row = {"blocked": pair, "note": setting}
    rows = [ClaimRow("2a", "transitivity: models connected to one trained anchor are connected to each other "
                     "(Table 1, barrier)", f"accuracy barrier between models from different inits ({pool} per seed)",
                     ("with connectivity loss", *base), m["trained barrier"], m["vanilla barrier"], "less",
                     tol=0.16, rationale="half of Table 1's CNN reduction (0.821 -> 0.495)", **row),
            ClaimRow("2b", "... their midpoint is more accurate (Table 1, fused accuracy)",
                     "accuracy of the pair's midpoint", ("with connectivity loss", *base), m["trained fused"],
                     m["vanilla fused"], "greater", tol=0.10,
                     rationale="half of Table 1's CNN gain (11.5% -> 32.1%)", **row),
            ClaimRow("2c", "... at no cost in the models' own accuracy (Table 1, individual accuracy)",
                     "mean accuracy of the two endpoints", ("with connectivity loss", *base), m["trained ind"],
                     m["vanilla ind"], "not_less", tol=0.01,
                     rationale="one point: Table 1's CNN individual accuracies differ by 0.1 point", **row)]
    for letter, name, tol, paper in (("d", "random-init", 0.10, "0.821 -> 0.626"),
                                     ("e", "semi-trained", 0.06, "0.821 -> 0.702")):
        rows.append(ClaimRow(f"2{letter}", f"transitivity holds with a weak ({name}) anchor (Tables 7/9)",
                             f"accuracy barrier between models trained against a {name} anchor ({weak_pool} per "
                             "seed)", (f"{name} anchor", *base), m[f"{name} barrier"], m["vanilla barrier"], "less",
                             tol=tol, rationale=f"half of the paper's CNN reduction ({paper})",
                             blocked=blockers([records[name], records["vanilla"]], GATE_TOL),
                             note=setting + "; semi-trained anchor: 20 SGD steps"))
    rows.append(ClaimRow("3a", "the group barrier grows with the group size K (Fig. 4)",
                         f"slope of the mean group accuracy barrier (Eq. 10) over K = {sizes[0]}..{sizes[-1]}, "
                         "vanilla models", ("vanilla CE", ""), m["slope vanilla slope"], claimed="above", bound=0.0,
                         rationale="Fig. 4 shows a rising curve; any positive slope",
                         blocked=blockers([records["vanilla"]], GATE_TOL),
                         note="5 random subsets per K"))
    rows.append(ClaimRow("3b", "the connectivity loss flattens the growth of the group barrier with K (Fig. 4)",
                         "slope of the group accuracy barrier over K", ("with connectivity loss", *base),
                         m["slope conn slope"], m["slope vanilla slope"], "less", tol=0.005,
                         rationale="Fig. 4 gives curves, no numbers: half a point of barrier per added model",
                         **row))
    return rows
