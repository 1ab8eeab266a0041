"""A dry run of the claims: what a measurement would train, what the cache holds, how long the rest takes.

Every arm x seed of the selected claim groups is listed with its run folder (the folder
:meth:`~paper_claims.context.Context.run` would train into), whether the cache holds it complete,
partly (rounds stored) or not at all, and the rounds and local SGD steps left to train; the
central models of claims 2-3 likewise, with their SGD steps. The time is estimated from one
timed local SGD step of each recipe's model on a batch of its data (after one untimed step),
times the steps left. Nothing is written: no folder is created, no run is started.

Local steps per round are ``round(participation x clients) x local_epochs x ceil(n_k / batch)``
with ``n_k`` the mean client size (training samples / clients), times the number of pool
members for LSS; a branched IMA run counts only the rounds after its branch point. Ditto's
personal steps, evaluation and the analyses are not counted: the estimate is of the local
training only, at the speed of the timed step.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F

from fl.datasets import load_dataset
from fl.models import build_model
from fl.recipes import RECIPES
from fl.resolve import build_config, merge_settings
from fl.store import RunStore

from . import fedgucci, floco, ima, lss, transitivity
from .context import BRANCHED, CONTINUES, Context

#: The groups' planned FL arms (the central group trains models, :func:`transitivity.planned_models`).
ARMS = {"fedgucci": fedgucci.arms, "ima": ima.arms, "floco": floco.arms, "lss": lss.arms}


@dataclass(frozen=True)
class PlannedRun:
    """One run (or central model) of a claims measurement, before it is trained.

    Attributes
    ----------
    group : str
        The claim group.
    arm : str
        The arm's label.
    seed : int or None
        The seed (None for a central model, whose file name holds it).
    folder : Path
        Where the run (or model) is stored in the cache.
    stored : int
        Rounds already stored (for a central model: 1 when it is stored, else 0).
    rounds : int
        Rounds the run trains from scratch (1 for a central model).
    steps_per_round : int
        Local SGD steps of one round (of the whole training for a central model).
    recipe : str
        The recipe whose model a step trains.
    """

    group: str
    arm: str
    seed: int | None
    folder: Path
    stored: int
    rounds: int
    steps_per_round: int
    recipe: str

    @property
    def cached(self) -> bool:
        """Whether the cache holds the whole run."""
        return self.stored >= self.rounds

    @property
    def steps(self) -> int:
        """Local SGD steps left to train."""
        return max(self.rounds - self.stored, 0) * self.steps_per_round


def fl_config(ctx: Context, paper: str, call: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration ``fl.run`` resolves for one call of :meth:`Context.run` (without training)."""
    call = dict(call)
    call.pop(CONTINUES, None)
    seed, algorithm = call.pop("seed"), ctx.algorithm(paper, call.pop("algorithm", None))
    merged = merge_settings(ctx.recipe(paper), {**ctx.explicit(paper, algorithm, call), "algorithm": algorithm,
                                                 "seed": seed})
    name, model = merged.pop("algorithm"), merged.pop("model", None)
    return build_config(name, model=model, recipe=ctx.recipe(paper), **merged)[0]


def fl_run(ctx: Context, group: str, label: str, paper: str, call: Mapping[str, Any], samples: int) -> PlannedRun:
    """The planned run of one call: its folder, what the cache holds, its rounds and steps."""
    config = fl_config(ctx, paper, call)
    overrides = {k: v for k, v in call.items() if k not in ("seed", "algorithm", CONTINUES)}
    folder = ctx.folder(paper, call["seed"], call.get("algorithm"), **overrides)
    store = RunStore(folder)
    stored = config["rounds"] if store.is_complete() else (store.read_progress() or 0)
    if config["algorithm"] in BRANCHED and not stored:  # the rounds before the branch are copied
        stored = int(config["options"]["start_round"]) - 1
    if call.get(CONTINUES) and not ctx.quick and not stored:  # a continuation copies the recipe's rounds
        stored = int(RECIPES[ctx.recipe(paper)].settings["rounds"])
    per_client = math.ceil(samples / config["clients"] / config["batch_size"])
    sampled = max(1, round(config["participation"] * config["clients"]))
    members = int(config.get("options", {}).get("members", 1)) if config["algorithm"] == "lss" else 1
    return PlannedRun(group, label, call["seed"], folder, stored, config["rounds"],
                      sampled * config["local_epochs"] * per_client * members, ctx.recipe(paper))


def plan(ctx: Context, names: Sequence[str]) -> list[PlannedRun]:
    """Every run and central model the groups ``names`` need, in the order they would be trained.

    Parameters
    ----------
    ctx : Context
        Seeds, quick mode, data set and cache of the measurement.
    names : sequence of str
        Claim groups (keys of :data:`paper_claims.definitions.GROUPS`).

    Returns
    -------
    list of PlannedRun
    """
    samples = len(load_dataset(ctx.dataset, root=ctx.data_root).train_y)
    out: list[PlannedRun] = []
    for name in names:
        if name == "central":
            out += [PlannedRun(name, "central model", None, path, int(path.exists()), 1, steps,
                               ctx.recipe("fedgucci")) for path, steps in transitivity.planned_models(ctx)]
            continue
        group = ctx.group(name)
        for arm in ARMS[name](group).values():
            out += [fl_run(group, name, arm.label, arm.paper, call, samples) for call in arm.calls]
    return out


def step_seconds(ctx: Context, recipe: str, *, repeats: int = 9) -> float:
    """Seconds of one local SGD step of ``recipe``'s model on a batch of its data (median of ``repeats``).

    Parameters
    ----------
    ctx : Context
        The data set and device.
    recipe : str
        A key of ``fl.RECIPES``.
    repeats : int
        Timed steps (after one untimed step).

    Returns
    -------
    float
        Wall seconds of one forward, backward and optimiser step.
    """
    settings = RECIPES[recipe].settings
    data = load_dataset(ctx.dataset, root=ctx.data_root)
    batch = int(settings.get("batch_size", 32))
    device = torch.device(ctx.device)
    model = build_model(settings["model"], num_classes=int(data.num_classes), input_shape=data.input_shape,
                        seed=0).to(device)
    x, y = data.train_x[:batch].to(device), data.train_y[:batch].to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def report(planned: Sequence[PlannedRun], seconds: Mapping[str, float]) -> str:
    """The dry run as text: one line per run, then the totals and the estimated time.

    Parameters
    ----------
    planned : sequence of PlannedRun
        The runs (:func:`plan`).
    seconds : mapping
        Seconds of one local step per recipe (:func:`step_seconds`).

    Returns
    -------
    str
    """
    lines = []
    for r in planned:
        state = "cached" if r.cached else f"{r.stored}/{r.rounds} rounds stored" if r.stored else "to train"
        seed = "" if r.seed is None else f" seed {r.seed}"
        work = "" if r.cached else f"; {r.rounds - r.stored} rounds, {r.steps} local steps"
        lines.append(f"{r.group} / {r.arm}{seed}: {state} ({r.folder.name}){work}")
    todo = [r for r in planned if not r.cached]
    estimate = sum(r.steps * seconds[r.recipe] for r in todo)
    per_step = ", ".join(f"{k} {1e3 * v:.2f} ms" for k, v in seconds.items())
    lines += ["", f"{len(planned)} runs, {len(planned) - len(todo)} in the cache, {len(todo)} to train "
              f"({sum(r.steps for r in todo)} local steps); one local step: {per_step}; estimated training "
              f"time {estimate / 60:.1f} min (local training only: evaluation and analyses not counted). "
              "Nothing was written."]
    return "\n".join(lines)


def dry_run(ctx: Context, names: Sequence[str]) -> str:
    """:func:`report` of :func:`plan`, the step of each recipe timed once.

    Parameters
    ----------
    ctx : Context
        The measurement's context.
    names : sequence of str
        Claim groups.

    Returns
    -------
    str
    """
    planned = plan(ctx, names)
    return report(planned, {recipe: step_seconds(ctx, recipe) for recipe in dict.fromkeys(r.recipe for r in planned)})
