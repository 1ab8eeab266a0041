"""Units of examples/demo.py.

The decomposition's realisations, the connectivity verdicts and the argument check (the whole
demo runs in tests/test_report_render.py).
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import fl
import landscape

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import demo  # noqa: E402
from _common import EVAL_SETS, tensors  # noqa: E402


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory) -> fl.Run:
    out = tmp_path_factory.mktemp("demo_units") / "run"
    return fl.run("fedavg", dataset="digits", model="mlp", clients=3, rounds=2, local_epochs=1, lr=0.05,
                  momentum=0.9, seed=0, out=out, save_clients="last", progress=False)


def test_retraining_with_the_engines_stream_gives_back_the_stored_client_models(fedavg_run) -> None:
    stored = fedavg_run.client_states(-1)
    again = demo.retrain_clients(fedavg_run, "client")
    assert sorted(again) == sorted(stored) == [0, 1, 2]
    for k, state in stored.items():
        assert state.keys() == again[k].keys()
        assert all(torch.equal(again[k][n], t) for n, t in state.items()), k  # the engine's context, rebuilt
    other = demo.retrain_clients(fedavg_run, "realisation-1")
    assert not any(torch.equal(other[0][n], t) for n, t in stored[0].items() if n.endswith("weight"))


def test_decomposition_from_several_realisations_estimates_variance_without_the_warning(fedavg_run, tmp_path,
                                                                                      monkeypatch) -> None:
    models, datasets = demo.realisations(fedavg_run, 3, tmp_path / "realisations")
    assert [len(m) for m in models] == [3, 3, 3] and len(datasets) == 3
    stored = sorted(p.name.rsplit("-", 1)[-1] for p in (tmp_path / "realisations").iterdir())
    assert stored == ["1.safetensors", "2.safetensors"]  # the stored client model is not copied
    monkeypatch.setattr(demo, "retrain_clients", None)  # a second call must re-read, not retrain
    again, _ = demo.realisations(fedavg_run, 3, tmp_path / "realisations")
    assert all(torch.equal(a[n], b[n]) for m, r in zip(models, again) for a, b in zip(m, r) for n in a)
    ev = landscape.Evaluator(fedavg_run.module(), tensors(fedavg_run.test_dataset()), progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dec = landscape.decompose(models, datasets, ev)
    assert not [w for w in caught if "one realization" in str(w.message)]
    assert dec.realizations == 3
    assert dec.variance > 1e-6 and np.isfinite(dec.covariance) and dec.covariance != 0.0
    assert dec.wens_loss == pytest.approx(dec.bias + dec.variance + dec.covariance, rel=1e-9)
    with pytest.warns(UserWarning, match="one realization per client"):  # the stored models alone
        single = landscape.decompose([m[0] for m in models], datasets, ev)
    assert single.variance == 0.0 and single.covariance == 0.0


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
    assert verdicts(lower, converged=False) == [demo.NOT_CONVERGED] * 3
    coarse = {**fine, EVAL_SETS[0]: 0.5}  # both arms' means at or below it on the first set only
    assert verdicts(lower, coarse) == ["not testable", "reproduced", "reproduced"]
    rows = demo.connectivity_verdicts({**pairs, "fedgucci": lower}, fine, True)
    assert [r["pairs"] for r in rows] == [45, 45, 45]


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
