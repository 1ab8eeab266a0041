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
from paper_claims.definitions import EVAL_SETS, GLOBAL_TEST, OWN, UNION  # noqa: F401 - re-exported
from paper_claims.measures import (  # noqa: F401 - re-exported for the examples
    average,
    barrier_resolution,
    group_barriers,
    pairwise_barrier_values,
    tensors,
)

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


def test_evaluator(run: Any, **options: Any) -> landscape.Evaluator:
    """Evaluator of the run's architecture on its global test set."""
    return landscape.Evaluator(run.module(), tensors(run.test_dataset()), progress=False, **options)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


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
