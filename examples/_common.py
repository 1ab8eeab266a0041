"""Shared plumbing of the example scripts: arguments, logging, tables, figures, data.

Every example takes ``--out`` (default ``examples_out/<name>``), ``--seed``, ``--quick``
(tiny settings for smoke tests) and ``--threads``. It prints its tables as Markdown
(``print_table``), writes each figure as PNG (matplotlib) and standalone HTML (plotly)
through :func:`figures.save`, and finally ``tables.json`` with every table, so results
can be read back without parsing the text.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

import figures
import landscape

Row = Mapping[str, Any]
MISSING = "-"


def build_parser(name: str, description: str,
                 add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.ArgumentParser:
    """The parser of an example: the common options (``--out``, ``--seed``, ``--quick``, ``--threads``) and its own.

    Parameters
    ----------
    name : str
        The example's name (its default output folder is ``examples_out/<name>``).
    description : str
        One line for ``--help``.
    add_arguments : callable, optional
        Adds the example's own options to the parser.

    Returns
    -------
    argparse.ArgumentParser
    """
    parser = argparse.ArgumentParser(prog=f"{name}.py", description=description,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", default=str(Path("examples_out") / name), help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random choice")
    parser.add_argument("--quick", action="store_true",
                        help="tiny settings (seconds): a smoke test, not a reproduction")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads; 1 is fastest for these tiny models (more threads "
                             "mostly add synchronisation overhead, badly so on a busy machine)")
    if add_arguments is not None:
        add_arguments(parser)
    return parser


class Example:
    """One example invocation: parsed arguments, output folder, tables and files written."""

    def __init__(self, name: str, description: str, argv: Sequence[str] | None = None,
                 add_arguments: Callable[[argparse.ArgumentParser], None] | None = None):
        self.parser = build_parser(name, description, add_arguments)
        self.args = self.parser.parse_args(argv)
        self.name = name
        self.out = Path(self.args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.tables: dict[str, list[dict[str, Any]]] = {}
        self.files: list[Path] = []
        self.started = time.time()
        self.load_average = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        torch.set_num_threads(max(1, int(self.args.threads)))

    @property
    def quick(self) -> bool:
        return bool(self.args.quick)

    @property
    def seed(self) -> int:
        return int(self.args.seed)

    def log(self, message: str) -> None:
        print(f"[{self.name} {time.time() - self.started:6.1f}s] {message}", file=sys.stderr, flush=True)

    def table(self, title: str, rows: Sequence[Row], note: str | None = None) -> None:
        """Print ``rows`` (dicts with the same keys) as a Markdown table and keep it for tables.json."""
        rows = [dict(r) for r in rows]
        self.tables[title] = rows
        print(format_table(title, rows, note), flush=True)

    def save(self, stem: str, matplotlib_figure: Any, plotly_figure: Any) -> None:
        """Write ``<out>/<stem>.png`` and ``<out>/<stem>.html``."""
        for fig, suffix in ((matplotlib_figure, ".png"), (plotly_figure, ".html")):
            self.files.append(figures.save(fig, self.out / f"{stem}{suffix}"))
        self.log(f"wrote {stem}.png and {stem}.html")

    def finish(self) -> int:
        """Write tables.json, print the file list and the run time; returns the exit status 0."""
        seconds = time.time() - self.started
        payload = {"example": self.name, "seconds": seconds, "quick": self.quick, "seed": self.seed,
                   "args": vars(self.args), "tables": self.tables, "files": [p.name for p in self.files],
                   "environment": {"cpus": os.cpu_count(), "threads": torch.get_num_threads(),
                                   "load_average": self.load_average, "torch": torch.__version__}}
        path = self.out / "tables.json"
        path.write_text(json.dumps(payload, indent=1, default=_jsonable) + "\n", encoding="utf-8")
        print(f"\nWrote {len(self.files)} figure files and tables.json to {self.out} in {seconds:.1f} s")
        return 0


def format_table(title: str, rows: Sequence[Row], note: str | None = None) -> str:
    """``### title`` followed by a Markdown table (floats with 4 significant digits)."""
    if not rows:
        return f"\n### {title}\n(no rows)\n"
    columns = list(rows[0])
    lines = [f"\n### {title}", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(format_cell(row.get(c)) for c in columns) + " |")
    if note:
        lines.append(note)
    return "\n".join(lines) + "\n"


def format_cell(value: Any) -> str:
    if value is None:
        return MISSING
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if not math.isfinite(v):
            return str(v)
        return f"{v:.4g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.3e}"
    return str(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    return str(value)


def tensors(dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)`` of a ``TensorDataset`` (what ``fl.Run`` returns)."""
    if hasattr(dataset, "tensors"):
        x, y = dataset.tensors[:2]
        return x, y
    xs, ys = zip(*(dataset[i] for i in range(len(dataset))))
    return torch.stack(xs), torch.as_tensor(ys)


def test_evaluator(run: Any, **options: Any) -> landscape.Evaluator:
    """Evaluator of the run's architecture on its global test set."""
    return landscape.Evaluator(run.module(), tensors(run.test_dataset()), progress=False, **options)


def average(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float] | None = None
            ) -> dict[str, torch.Tensor]:
    """Weighted (default uniform) average of state_dicts, entry by entry."""
    w = np.ones(len(states)) if weights is None else np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    return {k: sum(float(wi) * s[k].double() for wi, s in zip(w, states)).to(states[0][k].dtype)
            for k in states[0]}


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


GLOBAL_TEST, UNION, OWN = "global test set", "union of the clients' training data", "each client's own data"
EVAL_SETS = (GLOBAL_TEST, UNION, OWN)


def _final_clients(run: Any) -> tuple[list[Mapping[str, torch.Tensor]], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Final-round client models and their training data (clients without data left out)."""
    states, data = run.client_states(-1), run.client_datasets()
    keep = [k for k in sorted(states) if len(data[k])]
    return [states[k] for k in keep], [tensors(data[k]) for k in keep]


def _union(parts: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def pairwise_barrier_values(run: Any, eval_sets: Sequence[str] = EVAL_SETS, **options: Any
                            ) -> dict[str, np.ndarray]:
    """Accuracy barrier of every pair of final-round client models, per evaluation set.

    The barrier is FedGuCci Eq. 4: a supremum over 11 alphas with the endpoints included, so
    never negative. Evaluation sets: the global test set, the union of the clients' training
    data, or, for a pair (i, j), the union of D_i and D_j.

    Parameters
    ----------
    run : fl.Run
        A run stored with the last round's client models.
    eval_sets : sequence of str
        Members of :data:`EVAL_SETS`.
    **options
        Keyword arguments of every ``landscape.Evaluator`` (e.g. ``cache``).

    Returns
    -------
    dict
        Evaluation set -> barriers of the pairs (i, j), i < j, in the order (0, 1), (0, 2), ...
        of the clients with data (the same order for two runs of one partition).
    """
    states, data = _final_clients(run)
    out = {}
    for e in eval_sets:
        if e == OWN:
            vals = [landscape.interpolate(states[i], states[j], landscape.Evaluator(
                        run.module(), _union([data[i], data[j]]), progress=False, **options),
                        alphas=11).accuracy_barrier
                    for i in range(len(states)) for j in range(i + 1, len(states))]
        else:
            xy = tensors(run.test_dataset()) if e == GLOBAL_TEST else _union(data)
            ev = landscape.Evaluator(run.module(), xy, progress=False, **options)
            vals = list(landscape.barrier_matrix(states, ev, alphas=11).accuracy_barrier[
                np.triu_indices(len(states), k=1)])
        out[e] = np.asarray(vals, dtype=np.float64)
    return out


def barrier_resolution(run: Any) -> dict[str, float]:
    """The resolution of an accuracy barrier per evaluation set.

    One sample's share of the accuracy at the run's plateau, ``1 / (n * plateau)``, ``n``
    the size of the data (for a pair's own data, two clients' mean size).

    Parameters
    ----------
    run : fl.Run
        A finished run (its ``convergence().plateau`` is the accuracy).

    Returns
    -------
    dict
        Evaluation set (:data:`EVAL_SETS`) -> smallest barrier one sample can make.
    """
    sizes = [len(d) for d in run.client_datasets().values()]
    counts = (len(run.test_dataset()), sum(sizes), 2 * float(np.mean(sizes)))  # in the order of EVAL_SETS
    return {e: 1.0 / (n * max(run.convergence().plateau, 1e-3)) for e, n in zip(EVAL_SETS, counts)}


def pairwise_barriers(run: Any, eval_sets: Sequence[str] = EVAL_SETS, **options: Any) -> dict[str, float]:
    """Mean of :func:`pairwise_barrier_values` over the pairs, per evaluation set.

    Parameters
    ----------
    run : fl.Run
        A run stored with the last round's client models.
    eval_sets : sequence of str
        Members of :data:`EVAL_SETS`.
    **options
        Keyword arguments of every ``landscape.Evaluator`` (e.g. ``cache``).

    Returns
    -------
    dict
        Evaluation set -> mean pairwise accuracy barrier.
    """
    return {e: float(v.mean()) for e, v in pairwise_barrier_values(run, eval_sets, **options).items()}


def group_barriers(run: Any, eval_sets: Sequence[str] = EVAL_SETS, **options: Any) -> dict[str, float]:
    """Group accuracy barrier of the final-round client models per evaluation set.

    FedGuCci Eq. 10 with the uniform centroid: ``1 - A(centroid) / mean_k A(w_k)``, a ratio
    that is negative when the centroid beats its members; on each client's own data it is ``1 -
    sum_k A_k(centroid) / sum_k A_k(w_k)``, ``A_k`` the accuracy on client k's training data.

    Parameters
    ----------
    run : fl.Run
        A run stored with the last round's client models.
    eval_sets : sequence of str
        Members of :data:`EVAL_SETS`.
    **options
        Keyword arguments of every ``landscape.Evaluator`` (e.g. ``cache``).

    Returns
    -------
    dict
        Evaluation set -> group accuracy barrier.
    """
    states, data = _final_clients(run)
    out = {}
    for e in eval_sets:
        if e == OWN:
            fused = average(states)
            accs = np.array([landscape.Evaluator(run.module(), xy, progress=False, **options)
                             .evaluate([fused, w]).accuracy for w, xy in zip(states, data)])
            out[e] = float(1.0 - accs[:, 0].sum() / accs[:, 1].sum())
        else:
            xy = tensors(run.test_dataset()) if e == GLOBAL_TEST else _union(data)
            ev = landscape.Evaluator(run.module(), xy, progress=False, **options)
            out[e] = float(landscape.group_barrier(states, ev).accuracy_barrier)
    return out


def run_fl(ex: Example, algorithm: str, tag: str, dataset: str = "digits", **kwargs: Any):
    """``fl.run`` on ``dataset`` into ``<out>/runs/<tag>`` (a finished run with the same config is reopened)."""
    import fl

    ex.log(f"FL run {tag}: {algorithm} on {dataset} ({kwargs.get('clients')} clients, {kwargs.get('rounds')} rounds)")
    return fl.run(algorithm, dataset=dataset, seed=ex.seed, out=ex.out / "runs" / tag, progress=False, **kwargs)


def convergence_row(name: str, c: Any, final: float, unit: str = "round") -> dict[str, Any]:
    """One table row: final test accuracy and a :class:`fl.convergence.Convergence`."""
    return {"model": name, f"{unit}s": c.last_round, "final test acc": final,
            f"plateau (mean of last {c.window} {unit}s)": c.plateau, f"slope (points/{unit})": 100 * c.slope,
            "converged": "yes" if c.converged else "NO"}


def report_convergence(ex: Example, runs: Mapping[str, Any]) -> None:
    """Print each FL run's convergence as the example's first table.

    So its analyses are read as those of converged models (or not).
    """
    ex.table("Training: convergence of the global test accuracy (fl.convergence: slope over the last 10% of "
             "rounds below 0.1 points per round)",
             [convergence_row(name, run.convergence(), run.metrics[-1]["test_accuracy"]) for name, run in runs.items()])


def report_epochs(ex: Example, name: str, records: Sequence[Mapping[str, float]]) -> None:
    """Print the convergence of central training from its per-epoch records (:func:`accuracy_tracker`)."""
    from fl.convergence import assess

    ex.table("Training: convergence of the test accuracy over epochs (fl.convergence: slope over the last 10% "
             "of epochs, at least 5, below 0.1 points per epoch)",
             [convergence_row(name, assess(records), records[-1]["test_accuracy"], unit="epoch")])


def accuracy_tracker(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor
                          ) -> tuple[list[dict[str, float]], Callable[[int, float, Mapping[str, torch.Tensor]], None]]:
    """Per-epoch test accuracy of central training, in the records :func:`fl.convergence.assess` reads.

    Returns the (growing) list of ``{"round": epoch, "test_accuracy", "train_loss"}`` records
    and the ``on_epoch(epoch, loss, state)`` callback that appends to it (``fl.pretrain``'s).
    """
    import copy

    probe = copy.deepcopy(model)
    records: list[dict[str, float]] = []

    def on_epoch(epoch: int, loss: float, state: Mapping[str, torch.Tensor]) -> None:
        probe.load_state_dict(dict(state))
        probe.eval()
        with torch.no_grad():
            accuracy = float((probe(x).argmax(1) == y).float().mean())
        records.append({"round": epoch, "test_accuracy": accuracy, "train_loss": float(loss)})

    return records, on_epoch


def connecting_level(loss: np.ndarray, cells: np.ndarray) -> float:
    """Smallest level ``c`` at which all ``cells`` (grid indices) lie in one connected component.

    Components of the sublevel set ``{loss <= c}`` (4-neighbours): ``c`` is the minimax loss of
    a grid path joining the cells. ``c`` minus the highest loss at the cells is a barrier
    measured along the best path in the plane, not only the straight line.
    """
    from landscape.geometry.basin import sublevel_components

    values = np.unique(loss[np.isfinite(loss)])
    cells = [tuple(int(i) for i in c) for c in np.asarray(cells)]
    lo = int(np.searchsorted(values, max(loss[c] for c in cells)))
    hi = len(values) - 1

    def joined(level: float) -> bool:
        labels = sublevel_components(loss, level)
        first = labels[cells[0]]
        return bool(first > 0 and all(labels[c] == first for c in cells))

    while lo < hi:  # joined() is monotone in the level
        mid = (lo + hi) // 2
        if joined(values[mid]):
            hi = mid
        else:
            lo = mid + 1
    return float(values[lo])
