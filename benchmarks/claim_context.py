"""The runs behind benchmarks/claims.py: recipes per setting, seeds, cache, convergence.

A claim's arms are FL runs of one recipe (``<paper>-<dataset>``, :mod:`fl.recipes`) over the
seeds, the baseline being the same recipe run by another algorithm (``fl.run`` drops and
records the recipe's own algorithm options). Every run is stored under the cache folder and
reused by a rerun. :meth:`Context.arm` returns an arm's runs and records each run's
convergence (:mod:`fl.convergence`); a row built from an arm that did not converge gets no
verdict, and the FedAvg arm of each setting is reported as that setting's plateau.
"""
from __future__ import annotations

import time
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

import fl
import landscape
from fl.convergence import Convergence
from fl.recipes import RECIPES

#: Algorithms whose runs start from the stored run of the algorithm they train as until a
#: round (``fl.branch``): IMA is FedAvg before ``start_round``. The branch equals the run
#: trained from round 1 (tests/test_branching.py) and trains a quarter of IMA's rounds.
BRANCHED = {"ima": "fedavg"}
#: Settings a --quick run shrinks (a smoke test of the code path, not a measurement).
QUICK = {"rounds": 4, "local_epochs": 2, "clients": 4}


@dataclass
class ArmRecord:
    """The convergence of one arm's runs (one per seed)."""

    setting: str
    label: str
    convergence: list[Convergence] = field(default_factory=list)

    @property
    def converged(self) -> bool:
        """Every seed's run converged."""
        return all(c.converged for c in self.convergence)

    def line(self) -> str:
        """One line: plateau per seed, mean and the seeds that did not converge."""
        plateaus = [c.plateau for c in self.convergence]
        bad = [str(i) for i, c in enumerate(self.convergence) if not c.converged]
        return (f"{self.setting} / {self.label}: plateau {np.mean(plateaus):.4f} (seeds: "
                f"{', '.join(f'{p:.3f}' for p in plateaus)}); "
                + ("converged on every seed" if not bad else f"NOT converged on seed index {', '.join(bad)}"))


class Context:
    """Seeds, quick mode, device, data set, run cache, convergence records and the log.

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
    """

    def __init__(self, seeds: Sequence[int], quick: bool, cache: Path, *, dataset: str = "mnist1d",
                 device: str = "cpu", data_root: str | None = None, threads: int = 1,
                 pool: Executor | None = None):
        self.seeds, self.quick, self.cache = list(seeds), quick, Path(cache)
        self.dataset, self.device, self.data_root = dataset, device, data_root
        self.threads, self.pool = threads, pool
        self.log_lines: list[str] = []
        self.arms: list[ArmRecord] = []
        self.status: dict[Path, bool] = {}
        self.started = time.time()

    def log(self, text: str) -> None:
        """Print ``text`` with the elapsed time and keep it for the page's log."""
        line = f"[{time.time() - self.started:7.1f}s] {text}"
        print(line, flush=True)
        self.log_lines.append(line)

    def recipe(self, paper: str) -> str:
        """The recipe of ``paper`` (``"fedgucci"``, ``"ima"``, ...) on this context's data set."""
        name = f"{paper}-{self.dataset}"
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

    def run(self, paper: str, seed: int, *, algorithm: str | None = None, **overrides: Any) -> fl.Run:
        """``fl.run`` of ``paper``'s recipe for ``seed``, with another ``algorithm`` and ``overrides``."""
        alg = algorithm or RECIPES[self.recipe(paper)].settings["algorithm"]
        explicit = self.explicit(paper, alg, overrides)
        tag = "-".join(f"{k}{Path(v).stem if k == 'init' else v}" for k, v in sorted(overrides.items())
                       if not isinstance(v, (dict, list)))
        out = self.cache / (f"{self.recipe(paper)}-{alg}{'-' + tag if tag else ''}-seed{seed}"
                            f"{'-quick' if self.quick else ''}")
        source = None
        if alg in BRANCHED:  # rounds the algorithm trains as another: copied from that run (fl.branch)
            source = self.run(paper, seed, algorithm=BRANCHED[alg], **overrides)
        for _ in range(240):  # another claims process may be writing this run: wait for it (up to 1 h)
            try:
                common = dict(recipe=self.recipe(paper), **explicit, seed=seed, out=out, device=self.device,
                              data_root=self.data_root, progress=False)
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
            spec = (self.seeds, self.quick, self.cache, self.dataset, self.device, self.data_root, self.threads)
            for future in [self.pool.submit(train_run, spec, paper, dict(call)) for call in calls]:
                future.result()
        return [self.run(paper, **call) for call in calls]

    def arm(self, paper: str, label: str, *, algorithm: str | None = None, track: bool = True,
            **overrides: Any) -> list[fl.Run]:
        """One run per seed.

        Records their convergence under ``label`` unless ``track`` is False (protocols of a few
        rounds, where a slope over rounds says nothing).
        """
        runs = self.runs(paper, [{"seed": s, "algorithm": algorithm, **overrides} for s in self.seeds])
        if track:
            record = ArmRecord(self.recipe(paper), label, [r.convergence() for r in runs])
            self.arms.append(record)
            self.status.update({r.path: c.converged for r, c in zip(runs, record.convergence)})
            self.log(record.line())
        return runs

    def converged(self, *arms: Sequence[fl.Run]) -> bool:
        """Every tracked run of ``arms`` converged (untracked protocols count as converged)."""
        return all(self.status.get(r.path, True) for runs in arms for r in runs)


def train_run(spec: tuple[Any, ...], paper: str, call: dict[str, Any]) -> None:
    """Train (or find) one run of :meth:`Context.run` in a worker process; ``spec`` are the context's arguments."""
    import torch

    seeds, quick, cache, dataset, device, data_root, threads = spec
    torch.set_num_threads(threads)
    Context(seeds, quick, cache, dataset=dataset, device=device, data_root=data_root).run(paper, **call)
