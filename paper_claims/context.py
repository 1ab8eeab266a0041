"""The runs behind the claims: recipes per setting, seeds, cache, the finishing gate.

A claim's arms are FL runs of one recipe (``<paper>-<dataset>``, or the variant its group
names, :mod:`fl.recipes`) over the seeds, the baseline being the same recipe run by another
algorithm (``fl.run`` drops and records the recipe's own algorithm options). Every run is
stored under the cache folder and reused by a rerun. :meth:`Context.arm` returns an arm's
runs and records, per seed, its plateau and its :class:`fl.convergence.Progress` (schedule
at the end, claim metric at R/2 and R); :meth:`Context.gate` judges every seed of every arm
of a row by :func:`fl.convergence.judge` and names the arms that have not finished, so the
row gets no verdict. The FedAvg arm of each setting is reported as that setting's plateau.
"""
from __future__ import annotations

import time
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

import fl
import landscape
from fl.convergence import Progress, doubled_progress, judge, plateau, run_progress
from fl.recipes import RECIPES

from . import kernels as cpu_kernels
from .definitions import GROUPS, VARIANTS

#: Algorithms whose runs start from the stored run of the algorithm they train as until a
#: round (``fl.branch``): IMA is FedAvg before ``start_round``. The branch equals the run
#: trained from round 1 (tests/test_branching.py) and trains a quarter of IMA's rounds.
BRANCHED = {"ima": "fedavg"}
#: Key of a call whose run continues the recipe-length run of its settings (``fl.branch``): a run
#: of more rounds copies that run's rounds and trains the rest (FedAvg at 2R, IMA's control).
CONTINUES = "continues"
#: Settings a --quick run shrinks (a smoke test of the code path, not a measurement).
QUICK = {"rounds": 4, "local_epochs": 2, "clients": 4}


def trained_seconds(run: Any, continued: int = 0) -> float:
    """The stored per-round times of the rounds ``run`` trained itself.

    A branch's copied rounds (before ``start_round``) and the ``continued`` rounds a continuation
    copied from its shorter run are left out.
    """
    first = (int(run.config["options"]["start_round"]) if run.config["algorithm"] in BRANCHED
             else continued + 1 if continued else 0)
    return sum(float(m.get("time", 0.0)) for m in run.metrics if int(m["round"]) >= first)


@dataclass
class ArmRecord:
    """One arm's runs, one per seed: plateau and progress (the facts of the finishing rule).

    Attributes
    ----------
    setting : str
        The recipe (or central-training setting) the arm belongs to.
    label : str
        The arm's name in the claims.
    seeds : list of int
        The seeds, in the order of ``plateaus`` and ``progress``.
    plateaus : list of float
        Test-accuracy plateau per seed (``fl.convergence.assess``).
    progress : list of Progress
        Learning rate at the end against its peak, and the arm's claim metric at two lengths.
    """

    setting: str
    label: str
    seeds: list[int]
    plateaus: list[float]
    progress: list[Progress]

    def failures(self, tol: float, seeds: Collection[int] | None = None) -> str:
        """The seeds whose run has not finished for a claim of tolerance ``tol``, with numbers ("" if none).

        ``"label (setting; metric, limit L): seed s still changing (numbers); ..."``; only the
        ``seeds`` given are judged (default: all of the arm's).
        """
        bad = [(s, f) for s, f in zip(self.seeds, (judge(p, tol) for p in self.progress))
               if not f.finished and (seeds is None or s in seeds)]
        if not bad:
            return ""
        return (f"{self.label} ({self.setting}; {self.progress[0].metric}, limit {bad[0][1].limit:.4f}): "
                + "; ".join(f"seed {s} {f.reason} ({f.numbers()})" for s, f in bad))

    def line(self) -> str:
        """One line: plateau per seed, how far each schedule annealed and how the metric moved."""
        p0 = self.progress[0]
        lr = ", ".join(f"{100 * p.lr_fraction:.3g}%" for p in self.progress)
        change = ", ".join(f"{p.change:+.4f}" for p in self.progress)
        return (f"{self.setting} / {self.label}: plateau {np.mean(self.plateaus):.4f} (seeds: "
                f"{', '.join(f'{v:.3f}' for v in self.plateaus)}); lr at the end / peak: {lr}; {p0.metric} "
                f"change from {p0.rounds[0]} to {p0.rounds[1]}: {change}")


def blockers(records: Sequence[ArmRecord | tuple[ArmRecord, Collection[int]]], tol: float) -> str:
    """Why a row whose arms are ``records`` gets no verdict: every unfinished arm and seed ("" when none).

    Parameters
    ----------
    records : sequence of ArmRecord or (ArmRecord, seeds)
        Every tracked arm behind the row, each judged once however often it is listed; an
        arm given with seeds is judged on those seeds only (the union over its listings),
        otherwise on all of its seeds.
    tol : float
        The row's gate tolerance (see :data:`paper_claims.definitions.GROUPS`).

    Returns
    -------
    str
        :meth:`ArmRecord.failures` of each arm that failed, joined
        by `` / `` (no ``|``: it goes into a Markdown table cell); empty when every judged seed of
        every arm finished.
    """
    chosen: dict[int, tuple[ArmRecord, set[int] | None]] = {}
    for item in records:
        record, seeds = item if isinstance(item, tuple) else (item, None)
        _, known = chosen.setdefault(id(record), (record, set() if seeds is not None else None))
        if known is not None and seeds is not None:
            known.update(seeds)
        elif seeds is None:
            chosen[id(record)] = (record, None)
    return " / ".join(text for text in (record.failures(tol, seeds) for record, seeds in chosen.values()) if text)


@dataclass(frozen=True)
class ArmPlan:
    """The runs of one arm before they are trained: what :meth:`Context.train` trains and a dry run lists.

    Attributes
    ----------
    paper : str
        The recipe's paper (``<paper>-<dataset>``).
    label : str
        The arm's name in the claims.
    calls : tuple of dict
        One call of :meth:`Context.run` per seed (``seed``, ``algorithm`` and overrides).
    tracked : bool
        Whether the arm is recorded and gated (False: a fixed-budget protocol).
    statistic : callable
        The arm's claim metric from per-round metrics (``fl.convergence.run_progress``).
    metric : str
        What ``statistic`` measures, in words.
    """

    paper: str
    label: str
    calls: tuple[dict[str, Any], ...]
    tracked: bool = True
    statistic: Callable[[Sequence[Mapping[str, Any]]], float] = plateau
    metric: str = "test-accuracy plateau"


class Context:
    """Seeds, quick mode, device, data set, run cache, arm records and the log.

    Parameters
    ----------
    seeds : sequence of int
        The paired seeds (same partition and initialisation for every arm of a seed).
    quick : bool
        Shrink every run (``QUICK``): checks the code path in seconds, measures nothing.
    cache : Path
        Folder of the stored runs.
    dataset : str
        ``"mnist1d"`` (embedded) or a data set with ``<paper>-<dataset>`` recipes (``"cifar10"``).
    device : str
        Torch device of the runs.
    data_root : str or None
        Folder holding the data set's files (torchvision data sets).
    threads : int
        Torch CPU threads of each worker of ``pool``.
    pool : Executor or None
        Worker processes that train the runs of :meth:`runs` (None: train them here, one
        after the other). Claim groups measured side by side share one pool, so its workers
        stay busy with single runs however unequal the groups are.
    kernels : str
        The CPU kernels (``cpu_kernels.SETTINGS``) each worker applies; every run folder
        records the kernels it was trained with and is reused only under the same ones.
    """

    def __init__(self, seeds: Sequence[int], quick: bool, cache: Path, *, dataset: str = "mnist1d",
                 device: str = "cpu", data_root: str | None = None, threads: int = 1,
                 pool: Executor | None = None, kernels: str = "pinned"):
        self.seeds, self.quick, self.cache = list(seeds), quick, Path(cache)
        self.dataset, self.device, self.data_root = dataset, device, data_root
        self.threads, self.pool, self.kernels = threads, pool, kernels
        self.log_lines: list[str] = []
        self.arms: list[ArmRecord] = []
        self.timings: list[tuple[str, str, int, float]] = []
        self.owners: dict[Path, ArmRecord] = {}
        self.started = time.time()

    def group(self, name: str) -> Context:
        """A context for the claim group ``name``: its seeds continued up to the group's fewest.

        The next integers after the largest seed are added until the group has
        ``GROUPS[name].seeds`` of them; a quick run keeps its seeds.

        Parameters
        ----------
        name : str
            A claim group (key of :data:`paper_claims.definitions.GROUPS`).

        Returns
        -------
        Context
            A new context sharing the cache, device and pool (with its own log and arm records).
        """
        seeds = list(self.seeds)
        while not self.quick and len(seeds) < GROUPS[name].seeds:
            seeds.append(max(seeds) + 1)
        return Context(seeds, self.quick, self.cache, dataset=self.dataset, device=self.device,
                       data_root=self.data_root, threads=self.threads, pool=self.pool, kernels=self.kernels)

    def log(self, text: str) -> None:
        """Print ``text`` with the elapsed time and keep it for the page's log."""
        line = f"[{time.time() - self.started:7.1f}s] {text}"
        print(line, flush=True)
        self.log_lines.append(line)

    def recipe(self, paper: str) -> str:
        """The recipe of ``paper`` (``"fedgucci"``, ``"ima"``, ...) on this context's data set.

        ``<paper>-<dataset>-<variant>`` where the paper's group names a variant
        (:data:`paper_claims.definitions.VARIANTS`) and the data set has it, else ``<paper>-<dataset>``.
        """
        name = f"{paper}-{self.dataset}"
        variant = f"{name}-{VARIANTS[paper]}" if paper in VARIANTS else ""
        if variant in RECIPES:
            return variant
        if name not in RECIPES:
            raise landscape.ConfigError(f"no recipe {name!r}: the claims run on {sorted(RECIPES)}")
        return name

    def explicit(self, paper: str, algorithm: str, overrides: dict[str, Any]) -> dict[str, Any]:
        """The settings passed to ``fl.run`` on top of the recipe.

        ``overrides``, and in quick mode the shrunk sizes (round-indexed options of the
        recipe's own algorithm included).
        """
        recipe = RECIPES[self.recipe(paper)].settings
        explicit = {"save_clients": "last", **overrides}
        if self.quick:
            merged = {**recipe, **overrides}
            explicit.update({key: min(merged[key], cap) for key, cap in QUICK.items()})
            if algorithm == recipe["algorithm"]:
                explicit.update({key: 3 for key in ("start_round", "tau") if key in recipe})
        return explicit

    def algorithm(self, paper: str, algorithm: str | None) -> str:
        """The algorithm of a run: ``algorithm``, or the recipe's own when None."""
        return algorithm or RECIPES[self.recipe(paper)].settings["algorithm"]

    def folder(self, paper: str, seed: int, algorithm: str | None = None, **overrides: Any) -> Path:
        """The folder under the cache of :meth:`run`'s run: named by recipe, algorithm, overrides and seed."""
        tag = "-".join(f"{k}{Path(v).stem if k == 'init' else v}" for k, v in sorted(overrides.items())
                       if not isinstance(v, (dict, list)))
        return self.cache / (f"{self.recipe(paper)}-{self.algorithm(paper, algorithm)}{'-' + tag if tag else ''}"
                             f"-seed{seed}{'-quick' if self.quick else ''}")

    def run(self, paper: str, seed: int, *, algorithm: str | None = None, **overrides: Any) -> fl.Run:
        """``fl.run`` of ``paper``'s recipe for ``seed``, with another ``algorithm`` and ``overrides``.

        With ``continues=True`` among ``overrides`` (and more rounds than the recipe's), the run
        continues the recipe-length run of the same settings (trained first if needed) instead
        of training its first rounds again; a quick run, whose rounds are capped, trains in full.
        """
        continues = bool(overrides.pop(CONTINUES, False)) and not self.quick
        alg = self.algorithm(paper, algorithm)
        explicit = self.explicit(paper, alg, overrides)
        out = self.folder(paper, seed, algorithm, **overrides)
        source = None
        if alg in BRANCHED:  # rounds the algorithm trains as another: copied from that run (fl.branch)
            source = self.run(paper, seed, algorithm=BRANCHED[alg], **overrides)
        elif continues:  # the same run at the recipe's rounds, continued (fl.branch)
            source = self.run(paper, seed, algorithm=algorithm, **{k: v for k, v in overrides.items() if k != "rounds"})
        cpu_kernels.check(out)  # a stored run is reused only under the kernels it was trained with
        for _ in range(240):  # another claims process may be writing this run: wait for it (up to 1 h)
            try:
                common = dict(recipe=self.recipe(paper), **explicit, seed=seed, out=out, device=self.device,
                              data_root=self.data_root, progress=False,
                              on_round=lambda r, metrics: cpu_kernels.stamp(out))
                return fl.run(alg, **common) if source is None else fl.branch(source, alg, **common)
            except landscape.ConfigError as err:
                if "being written by another process" not in str(err):
                    raise
                time.sleep(15)
        raise TimeoutError(f"{out} stayed locked by another process for an hour")

    def runs(self, paper: str, calls: Sequence[dict[str, Any]]) -> list[fl.Run]:
        """:meth:`run` of ``paper`` for each of ``calls`` (keyword arguments, ``seed`` included).

        With a pool, every call is trained in a worker first (all of them queued at once), then
        reopened here.
        """
        if self.pool is not None:
            spec = (self.seeds, self.quick, self.cache, self.dataset, self.device, self.data_root, self.threads,
                    self.kernels)
            for future in [self.pool.submit(train_run, spec, paper, dict(call)) for call in calls]:
                future.result()
        return [self.run(paper, **call) for call in calls]

    def plan(self, paper: str, label: str, *, algorithm: str | None = None, tracked: bool = True,
             statistic: Callable[[Sequence[Mapping[str, Any]]], float] = plateau,
             metric: str = "test-accuracy plateau", seeds: Sequence[int] | None = None, **overrides: Any) -> ArmPlan:
        """An arm of one run per seed: ``paper``'s recipe with ``algorithm`` and ``overrides``.

        A tracked arm is recorded by :meth:`train` (:meth:`track`, claim metric ``statistic``) and
        gated; protocols of a fixed few rounds, whose claims are about that budget, are not.
        ``seeds`` (default: the context's) lets an arm run on a subset of them.
        """
        calls = tuple({"seed": s, "algorithm": algorithm, **overrides}
                      for s in (self.seeds if seeds is None else seeds))
        return ArmPlan(paper, label, calls, tracked, statistic, metric)

    def train(self, plan: ArmPlan) -> list[fl.Run]:
        """The runs of ``plan`` (trained or found in the cache), recorded when the arm is tracked.

        Every arm's training time (the sum of its runs' stored per-round times, whichever
        invocation trained them; the rounds a branch or a continuation copied not counted) is kept in
        :attr:`timings` as ``(recipe, label, runs, minutes)``.
        """
        runs = self.runs(plan.paper, plan.calls)
        continued = [int(RECIPES[self.recipe(plan.paper)].settings["rounds"]) if call.get(CONTINUES) and not self.quick
                     else 0 for call in plan.calls]
        minutes = sum(trained_seconds(r, first) for r, first in zip(runs, continued)) / 60
        self.timings.append((self.recipe(plan.paper), plan.label, len(runs), minutes))
        if plan.tracked:
            self.track(self.recipe(plan.paper), plan.label, runs, plan.statistic, plan.metric)
        return runs

    def track(self, setting: str, label: str, runs: Sequence[Any],
              statistic: Callable[[Sequence[Mapping[str, Any]]], float] = plateau,
              metric: str = "test-accuracy plateau", longer: Sequence[Any] | None = None) -> ArmRecord:
        """Record the arm ``runs`` (one per seed, in the order of the seeds) for :meth:`gate` and the page.

        Parameters
        ----------
        setting : str
            The recipe the runs belong to.
        label : str
            The arm's name.
        runs : sequence of Run
            One stored run per seed.
        statistic : callable
            The arm's claim metric from per-round metrics (``fl.convergence.run_progress``).
        metric : str
            What ``statistic`` measures, in words.
        longer : sequence of Run, optional
            The same runs continued to twice their rounds (one per seed): each run is then
            judged on R -> 2R (``fl.convergence.doubled_progress``) instead of R/2 -> R.

        Returns
        -------
        ArmRecord
            The record, also appended to :attr:`arms` and logged.
        """
        record = ArmRecord(setting, label, [int(r.config["seed"]) for r in runs],
                           [r.convergence().plateau for r in runs],
                           [run_progress(r, statistic, metric) if longer is None else
                            doubled_progress(r, twice, statistic, metric)
                            for r, twice in zip(runs, longer if longer is not None else runs)])
        self.arms.append(record)
        self.owners.update({r.path: record for r in runs})
        self.log(record.line())
        return record

    def gate(self, tol: float, *arms: Sequence[Any]) -> str:
        """Why a row built from ``arms`` (lists of runs) gets no verdict ("" when every tracked run finished).

        The seed of every run given, of every tracked arm, is judged by :func:`fl.convergence.judge`
        with the row's gate tolerance ``tol`` (each arm once, however often it is listed); untracked
        runs (fixed-budget protocols) are not judged.
        """
        return blockers([(self.owners[r.path], {int(r.config["seed"])}) for runs in arms for r in runs
                         if r.path in self.owners], tol)


def train_run(spec: tuple[Any, ...], paper: str, call: dict[str, Any]) -> None:
    """Train (or find) one run of :meth:`Context.run` in a worker process; ``spec`` are the context's arguments."""
    import torch

    seeds, quick, cache, dataset, device, data_root, threads, kernels = spec
    torch.set_num_threads(threads)
    cpu_kernels.apply(kernels)
    Context(seeds, quick, cache, dataset=dataset, device=device, data_root=data_root, kernels=kernels).run(paper,
                                                                                                          **call)
