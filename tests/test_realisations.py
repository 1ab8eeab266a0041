"""``fl.realisations``: a round's client models trained again with other mini-batch orders.

Retraining with the engine's own generator tag gives back the stored client models bit for
bit (so the context is the engine's); another tag gives other models; the realisations are
kept and read back; with several of them IMA Theorem 1's variance and covariance are
estimated instead of being 0 by construction.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import fl
import landscape
from fl.realisations import realisations, retrain_clients
from landscape import ConfigError

SETTINGS = dict(dataset="digits", model="mlp", clients=3, rounds=3, local_epochs=1, lr=0.05, momentum=0.9, seed=0,
                progress=False)


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory) -> fl.Run:
    out = tmp_path_factory.mktemp("realisations") / "run"
    return fl.run("fedavg", out=out, save_clients="all", lr_decay=0.1, **SETTINGS)


def assert_equal_states(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k, state in a.items():
        assert state.keys() == b[k].keys()
        assert all(torch.equal(b[k][n], t) for n, t in state.items()), k


@pytest.mark.parametrize("round", [-1, 1, 2])
def test_retraining_with_the_engines_stream_gives_back_the_stored_client_models(fedavg_run, round) -> None:
    stored = fedavg_run.client_states(round)
    assert_equal_states(stored, retrain_clients(fedavg_run, "client", round))  # the engine's context, rebuilt
    other = retrain_clients(fedavg_run, "realisation-1", round)
    assert not any(torch.equal(other[0][n], t) for n, t in stored[0].items() if n.endswith("weight"))


def test_ima_around_fedavg_is_retrained_with_its_own_schedule(tmp_path) -> None:
    run = fl.run("ima", out=tmp_path / "ima", save_clients="all", start_round=2, window=2, **SETTINGS)
    assert_equal_states(run.client_states(3), retrain_clients(run, "client", 3))


def test_decomposition_from_several_realisations_estimates_variance_without_the_warning(fedavg_run, tmp_path,
                                                                                      monkeypatch) -> None:
    models, datasets = realisations(fedavg_run, 3, tmp_path / "realisations", round=2)
    assert [len(m) for m in models] == [3, 3, 3] and len(datasets) == 3
    stored = sorted(p.name.rsplit("-", 2)[-2:][1] for p in (tmp_path / "realisations").iterdir())
    assert stored == ["1.safetensors", "2.safetensors"]  # the stored client model is not copied
    monkeypatch.setattr("fl.realisations.retrain_clients", None)  # a second call must re-read, not retrain
    again, _ = realisations(fedavg_run, 3, tmp_path / "realisations", round=2)
    assert all(torch.equal(a[n], b[n]) for m, r in zip(models, again) for a, b in zip(m, r) for n in a)
    x, y = fedavg_run.test_dataset().tensors
    ev = landscape.Evaluator(fedavg_run.module(), (x, y), progress=False)
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


def test_refused(fedavg_run, tmp_path) -> None:
    with pytest.raises(ConfigError, match="round 0 is the initial model"):
        retrain_clients(fedavg_run, "x", 0)
    with pytest.raises(ConfigError, match="count must be at least 1"):
        realisations(fedavg_run, 0, tmp_path)
    gucci = fl.run("fedgucci", out=tmp_path / "g", save_clients="last", **{**SETTINGS, "rounds": 1})
    with pytest.raises(ConfigError, match="'fedgucci' keeps other state"):
        retrain_clients(gucci, "x")
