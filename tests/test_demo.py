"""Units of examples/demo.py.

The connectivity verdicts and the argument check (the whole demo runs in
tests/test_report_render.py; its decomposition's realisations in tests/test_realisations.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import fl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import demo  # noqa: E402
from _common import EVAL_SETS  # noqa: E402


def test_connectivity_verdicts_follow_the_claims_rule() -> None:
    rng = np.random.default_rng(0)
    fedavg = rng.uniform(0.1, 0.3, size=45)
    lower = {e: fedavg - 0.05 + rng.normal(0, 0.005, size=45) for e in EVAL_SETS}  # 5 points lower
    same = {e: fedavg + rng.normal(0, 0.001, size=45) for e in EVAL_SETS}           # within the tolerance
    pairs = {"fedavg": {e: fedavg for e in EVAL_SETS}}
    fine = dict.fromkeys(EVAL_SETS, 0.001)

    def verdicts(fedgucci, resolution=fine, converged=True):
        return [r["verdict"] for r in demo.connectivity_verdicts({**pairs, "fedgucci": fedgucci}, resolution,
                                                                 converged)]

    assert verdicts(lower) == ["reproduced"] * 3
    assert verdicts(same) == ["not reproduced"] * 3
    assert verdicts(lower, converged=False) == ["no verdict: not converged"] * 3
    coarse = {**fine, EVAL_SETS[0]: 0.5}  # both arms' means at or below it on the first set only
    assert verdicts(lower, coarse) == ["not testable", "reproduced", "reproduced"]
    rows = demo.connectivity_verdicts({**pairs, "fedgucci": lower}, fine, True)
    assert [r["pairs"] for r in rows] == [45, 45, 45]


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory) -> fl.Run:
    out = tmp_path_factory.mktemp("demo_units") / "run"
    return fl.run("fedavg", dataset="digits", model="mlp", clients=3, rounds=2, local_epochs=1, lr=0.05,
                  momentum=0.9, seed=0, out=out, save_clients="last", progress=False)


def test_resolution_is_one_sample_of_the_plateau_accuracy(fedavg_run) -> None:
    sizes = [len(d) for d in fedavg_run.client_datasets().values()]
    plateau = fedavg_run.convergence().plateau
    got = demo.barrier_resolution(fedavg_run)
    assert list(got) == list(EVAL_SETS)
    assert got[EVAL_SETS[0]] == pytest.approx(1 / (len(fedavg_run.test_dataset()) * plateau))
    assert got[EVAL_SETS[1]] == pytest.approx(1 / (sum(sizes) * plateau))
    assert got[EVAL_SETS[2]] == pytest.approx(3 / (2 * sum(sizes) * plateau))  # 3 clients


def test_demo_refuses_a_single_round_before_writing(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        demo.main(["--out", str(tmp_path / "report"), "--rounds", "1"])
    assert exc.value.code == 2
    assert "--rounds must be at least 2" in capsys.readouterr().err
    assert not (tmp_path / "report").exists()
