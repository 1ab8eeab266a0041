"""Each example script runs end to end with ``--quick`` in a subprocess.

Checks: exit status 0; the printed Markdown tables carry the expected columns and every
numeric cell is a finite number (``-`` marks a value that does not apply); the same
tables are in ``tables.json``; every PNG is a real PNG and every HTML a plotly page.
Also unit tests of the shared helpers in ``examples/_common.py``.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))

from _common import connecting_level, format_table  # noqa: E402

#: Columns of the convergence table every training example prints first (fl.convergence).
CONVERGENCE = ("model", "final test acc", "converged")
#: example -> {table title prefix: columns that must be present}, figure stems written.
EXPECTED: dict[str, tuple[dict[str, tuple[str, ...]], tuple[str, ...]]] = {
    "transitivity": ({
        "Training:": CONVERGENCE,
        "Table 1": ("training", "Ind. Acc. (%)", "Fused Acc. (%)", "Acc. Barrier", "Loss Barrier", "reduction (%)"),
        "Figure 3": ("training", "group acc barrier", "common basin", "connecting level"),
        "Figure 4": ("K", "vanilla mean", "connectivity mean"),
        "Weak anchors": ("training", "Ind. Acc. (%)", "A(w_anc) (%)", "A((w_anc+w)/2) (%)", "Fused Acc. (%)",
                         "Acc. Barrier", "reduction (%)"),
    }, ("fig2a_model_anchor_paths", "fig2b_model_model_paths", "fig3_plane_vanilla", "fig3_plane_connectivity",
        "fig4_group_barrier_vs_k")),
    "fl_basin": ({
        "Training:": CONVERGENCE,
        "Training (global": ("algorithm", "final test acc (%)"),
        "Basin analysis": ("round", "common basin", "global dist to bottom", "global off-plane dist",
                           "max client-global barrier"),
        "Models in the planes": ("model", "x", "y", "test loss", "dist to bottom"),
        "FMA vs IMA": ("beta*", "FMA loss (beta=0)", "IMA loss (beta=1)"),
    }, ("fl_curves", "plane_clients_round004", "plane_global_models", "fma_ima_line")),
    "decomposition": ({
        "Training:": CONVERGENCE,
        "Theorem 1 terms over rounds, no lr decay": ("round", "bias", "train_bias", "heter_bias", "cross",
                                                     "max locality"),
        "Claims C5-C8": ("arm", "mean heter_bias / bias", "final max locality"),
        "Test error (%) of the average": ("m",),
    }, ("decomposition_no_decay", "decomposition_decay", "error_vs_averaged_models")),
    "floco_simplex": ({
        "Training:": CONVERGENCE,
        "Global test loss over the simplex": ("grid points", "mean loss", "centre loss"),
        "Clients": ("client", "local acc at alpha_k (%)", "local acc at centre (%)"),
        "Local vs global accuracy": ("algorithm", "global acc (%)", "local acc (%)"),
    }, ("simplex_global_loss", "simplex_client0_loss", "fl_curves")),
    "lss_flatness": ({
        "Training:": CONVERGENCE,
        "Flatness": ("algorithm", "lambda_1 (train)", "trace (train)", "mean client lambda_1"),
        "Soups": ("client", "soup loss", "group loss barrier", "max pairwise loss barrier"),
        "Uploaded client models": ("algorithm", "group acc barrier"),
    }, ("hessian_density", "pool_barriers", "fl_curves")),
    "merging": ({
        "Models: the pretrained MLP": ("model", "test loss", "test acc (%)", "acc 0-4 (%)", "acc 5-9 (%)"),
        "Merges of the two MNIST-1D fine-tunes": ("merge", "test loss", "test acc (%)", "loss barrier A",
                                                  "acc barrier B", "sharpness", "lambda_max"),
        "Greedy soup": ("model", "held-out acc (%)", "added"),
        "Models in the plane": ("model", "x", "y", "off-plane distance"),
        "Align first": ("merge", "test loss", "max loss barrier", "max acc barrier"),
        "Merges of the two LoRA adapters": ("merge", "test loss", "test acc (%)", "loss barrier A"),
    }, ("merging_plane", "merging_lora_paths")),
    "tracking": ({
        "Training:": CONVERGENCE,
        "Last tracked round": ("algorithm", "round", "mean_client_barrier", "group_barrier", "top_eigenvalue",
                               "trace", "sharpness", "update_distance", "update_cosine"),
        "Cost of tracking": ("algorithm", "tracked rounds", "training s", "tracking s", "added (%)"),
    }, ("tracking",)),
    "compare_algorithms": ({
        "Training:": CONVERGENCE,
        "All algorithms": ("algorithm", "final acc (%)", "client group acc barrier", "lambda_max (test)"),
    }, ("fl_curves", "client_group_barrier_vs_k")),
}

TEXT_COLUMNS = {"training", "algorithm", "model", "merge", "added", "path", "arm", "alpha_k", "common basin",
                "in basin", "converged", "global < every client", "global off bottom", "beta* at grid edge"}


def parse_tables(stdout: str) -> dict[str, list[dict[str, str]]]:
    """Markdown tables printed as ``### title`` + header + separator + rows."""
    tables: dict[str, list[dict[str, str]]] = {}
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("### ") or i + 2 >= len(lines) or not lines[i + 1].startswith("| "):
            continue
        header = [c.strip() for c in lines[i + 1].strip("|").split("|")]
        rows = []
        for row in lines[i + 3:]:
            if not row.startswith("| "):
                break
            cells = [c.strip() for c in row.strip("|").split("|")]
            assert len(cells) == len(header), f"ragged row {row!r} under {header}"
            rows.append(dict(zip(header, cells)))
        tables[line[4:]] = rows
    return tables


def check_numeric(title: str, rows: list[dict[str, str]]) -> None:
    for row in rows:
        for column, cell in row.items():
            if column in TEXT_COLUMNS or cell == "-":
                continue
            value = float(cell)  # raises on anything that is not a number
            assert math.isfinite(value), f"{title}: {column} = {cell}"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Run every example once with --quick (two at a time); {name: (stdout, out folder)}."""
    folders = {name: tmp_path_factory.mktemp(name) for name in EXPECTED}

    def run(name: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), "--quick", "--out", str(folders[name])],
                              cwd=ROOT, capture_output=True, text=True, timeout=600)

    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = dict(zip(EXPECTED, pool.map(run, EXPECTED)))
    for name, proc in procs.items():
        assert proc.returncode == 0, f"{name} failed:\n{proc.stderr[-3000:]}"
    return {name: (proc.stdout, folders[name]) for name, proc in procs.items()}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_example_outputs(outputs, name):
    stdout, out = outputs[name]
    expected_tables, stems = EXPECTED[name]
    tables = parse_tables(stdout)
    saved = json.loads((out / "tables.json").read_text())
    assert set(saved["tables"]) == set(tables)
    for prefix, columns in expected_tables.items():
        matches = [t for t in tables if t.startswith(prefix)]
        assert matches, f"{name}: no table starting with {prefix!r}; printed: {list(tables)}"
        for title in matches:
            rows = tables[title]
            assert rows, f"{name}: table {title!r} is empty"
            missing = [c for c in columns if c not in rows[0]]
            assert not missing, f"{name}: table {title!r} lacks {missing}"
            check_numeric(title, rows)
            assert len(saved["tables"][title]) == len(rows)
    for stem in stems:
        png, html = out / f"{stem}.png", out / f"{stem}.html"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"
        assert png.stat().st_size > 1000
        text = html.read_text(encoding="utf-8")
        assert "<html" in text and "Plotly.newPlot" in text, f"{html} is not a plotly page"


def test_transitivity_quick_numbers_are_consistent(outputs):
    """Table 1's reduction column equals (B_vanilla - B_conn) / B_vanilla of its own rows."""
    stdout, _ = outputs["transitivity"]
    title = next(t for t in parse_tables(stdout) if t.startswith("Table 1"))
    vanilla, conn = parse_tables(stdout)[title]
    b0, b1 = float(vanilla["Acc. Barrier"]), float(conn["Acc. Barrier"])
    assert float(conn["reduction (%)"]) == pytest.approx(100 * (b0 - b1) / b0, rel=2e-3, abs=0.05)
    assert vanilla["reduction (%)"] == "-"


def test_format_table_round_trips_through_the_parser():
    rows = [{"name": "a", "x": 1.23456, "n": 3, "flag": True, "none": None},
            {"name": "b", "x": -2.5e-5, "n": 0, "flag": False, "none": None}]
    parsed = parse_tables(format_table("demo", rows))["demo"]
    assert [r["name"] for r in parsed] == ["a", "b"]
    assert float(parsed[0]["x"]) == pytest.approx(1.235)
    assert float(parsed[1]["x"]) == pytest.approx(-2.5e-5)
    assert parsed[0]["flag"] == "yes" and parsed[1]["none"] == "-"


def test_connecting_level_is_the_minimax_path_height():
    # two valleys (0.0 and 0.1) separated by a ridge whose lowest pass is 0.7
    loss = np.array([[0.0, 0.9, 0.1],
                     [0.2, 0.7, 0.3],
                     [0.4, 0.95, 0.5]])
    cells = np.array([[0, 0], [0, 2]])
    assert connecting_level(loss, cells) == pytest.approx(0.7)
    # one valley: the level is the higher of the two points
    assert connecting_level(loss, np.array([[0, 0], [2, 0]])) == pytest.approx(0.4)
