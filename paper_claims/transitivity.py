"""Central-training claims of the claims page (claims 2-3: FedGuCci Sec. 3).

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
Every row is gated with 2c's tolerance (``CENTRAL_GATE_TOL``), the accuracy of the pool's models.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

import landscape
from fl.central import Trainer
from fl.convergence import Progress, assess
from fl.datasets import load_dataset
from fl.recipes import RECIPES

from . import kernels as cpu_kernels
from .context import ArmRecord, blockers
from .definitions import CENTRAL_GATE_TOL, CLAIMS, EPOCHS, POOL, SCHEDULE, WEAK_POOL
from .rows import ClaimRow, fmt

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


def scale(ctx: Any) -> tuple[int, int, int]:
    """Epochs, pool size and weak-anchor pool size of the context (tiny in quick mode)."""
    return (2, 3, 2) if ctx.quick else (EPOCHS, POOL, WEAK_POOL)


def trainer(ctx: Any, data: Any, seed: int, epochs: int) -> Trainer:
    """The central trainer of ``seed`` (lr 0.05, batch 32, the FedGuCci recipe's model, ``SCHEDULE``)."""
    model = RECIPES[ctx.recipe("fedgucci")].settings["model"]  # the FL claims' model
    return Trainer(data.train_x, data.train_y, data.input_shape, epochs, 0.05, 32, seed, model=model,
                   schedule=SCHEDULE)


def planned_models(ctx: Any) -> list[tuple[Path, int]]:
    """Every model the claims train (stored under the cache's ``central`` folder) and its SGD steps.

    The same models, under the same names, that :func:`transitivity_claims` trains or finds:
    per seed the anchor, the semi-trained anchor, model 0 of every arm (with its learning
    curve), model 0 trained twice as long, and the pools.

    Parameters
    ----------
    ctx : Context
        The claims context.

    Returns
    -------
    list of (Path, int)
        Each model's file and the SGD steps that train it.
    """
    data = load_dataset(ctx.dataset, root=ctx.data_root)
    epochs, pool, weak_pool = scale(ctx)
    folder, out = ctx.cache / "central", []
    for seed in ctx.seeds:
        tr, longer = trainer(ctx, data, seed, epochs), trainer(ctx, data, seed, 2 * epochs)
        per_epoch = len(tr.rates(1, len(tr.y)))
        names = [(tr, "anchor", "vanilla", epochs), (tr, "semi anchor", "steps20", 0),
                 (longer, "model 0", "vanilla", 2 * epochs)]
        names += [(tr, f"model {i}", tag, epochs) for i in range(pool)
                  for tag in ("vanilla", "trained-anchor-beta1")]
        names += [(tr, f"model {i}", f"{weak}-anchor-beta1", epochs) for i in range(weak_pool)
                  for weak in ("random-init", "semi-trained")]
        out += [(folder / f"{t.file_name(key, tag)}.safetensors", n * per_epoch if n else 20)
                for t, key, tag, n in names]
    return out


def transitivity_claims(ctx: Any) -> list[ClaimRow]:
    """Claims 2 and 3 (see the module docstring)."""
    data = load_dataset(ctx.dataset, root=ctx.data_root)
    model = RECIPES[ctx.recipe("fedgucci")].settings["model"]  # the FL claims' model
    epochs, pool, weak_pool = scale(ctx)
    m: dict[str, list[float]] = {}
    sizes = list(range(2, pool + 1))
    records = {arm: ArmRecord("central training", label, list(ctx.seeds), [], []) for arm, label in ARMS.items()}
    folder = ctx.cache / "central"
    folder.mkdir(parents=True, exist_ok=True)
    cpu_kernels.stamp(folder)  # its models are reused only under the kernels they were trained with
    for seed in ctx.seeds:
        tr = trainer(ctx, data, seed, epochs)
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
        longer = trainer(ctx, data, seed, 2 * epochs).cached(folder, keys[0])
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
    gate = CENTRAL_GATE_TOL
    pair = {"blocked": blockers([records["trained"], records["vanilla"]], gate), "note": setting}
    rows = [ClaimRow.of(CLAIMS["2a"], m["trained barrier"], m["vanilla barrier"], pool=pool, **pair),
            ClaimRow.of(CLAIMS["2b"], m["trained fused"], m["vanilla fused"], **pair),
            ClaimRow.of(CLAIMS["2c"], m["trained ind"], m["vanilla ind"], **pair)]
    for letter, name in (("d", "random-init"), ("e", "semi-trained")):
        rows.append(ClaimRow.of(CLAIMS[f"2{letter}"], m[f"{name} barrier"], m["vanilla barrier"], weak_pool=weak_pool,
                                blocked=blockers([records[name], records["vanilla"]], gate),
                                note=setting + "; semi-trained anchor: 20 SGD steps"))
    rows.append(ClaimRow.of(CLAIMS["3a"], m["slope vanilla slope"], k_min=sizes[0], k_max=sizes[-1],
                            blocked=blockers([records["vanilla"]], gate)))
    rows.append(ClaimRow.of(CLAIMS["3b"], m["slope conn slope"], m["slope vanilla slope"], **pair))
    return rows
