"""The run directory.

load_run round trip, datasets rebuilt from the stored partition, selective client
checkpoints, progress marker and metrics truncation, safe formats.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import fl
from fl.store import RunStore
from landscape.infra.errors import CheckpointError, ConfigError
from landscape.space.checkpoints import load_state_dict

TINY = dict(dataset="digits", clients=4, rounds=2, batch_size=64, lr=0.1, progress=False)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    path = tmp_path_factory.mktemp("run")
    return fl.run("fedavg", participation=0.5, out=path, **TINY), path


def test_load_run_round_trip(stored):
    run, path = stored
    again = fl.load_run(path)
    assert again.config == run.config == json.loads((path / "config.json").read_text())
    assert again.config["num_classes"] == 10 and again.config["input_shape"] == [1, 8, 8]
    assert again.rounds == [0, 1, 2] and again.complete
    assert [m["round"] for m in again.metrics] == [0, 1, 2]
    for m in again.metrics:
        assert 0 <= m["test_accuracy"] <= 1 and m["test_loss"] > 0 and m["time"] >= 0
    assert all("train_loss" in m and len(m["clients"]) == 2 for m in again.metrics[1:])
    module = again.module()
    module.load_state_dict(again.global_state(), strict=True)  # plain nn.Module loads it
    for r in again.rounds:
        state = again.global_state(r)
        assert all(torch.equal(state[k], run.global_state(r)[k]) for k in state)
    assert torch.equal(again.global_state(-1)["classifier.weight"], again.global_state(2)["classifier.weight"])
    assert again.checkpoint(1) == path / "global" / "round_0001.safetensors"
    assert set(again.client_states(1)) == set(again.metrics[1]["clients"]) and again.client_states(0) == {}
    with pytest.raises(ConfigError, match="round 7 is not stored"):
        again.global_state(7)


def test_initial_model_matches_module(stored):
    run, _ = stored
    fresh = run.module().state_dict()
    assert all(torch.equal(fresh[k], v) for k, v in run.global_state(0).items())


def test_datasets_follow_stored_partition(stored):
    run, path = stored
    parts = run.client_datasets()
    test = run.test_dataset()
    from fl.datasets import load_dataset

    bundle = load_dataset("digits")
    assert sum(len(d) for d in parts.values()) == len(bundle.train_y)
    assert len(test) == len(bundle.test_y)
    with np.load(path / "partition.npz", allow_pickle=False) as z:
        indices = np.concatenate([z[f"train_{k:05d}"] for k in range(4)])
        assert sorted(indices.tolist()) == list(range(len(bundle.train_y)))  # disjoint and complete
        x0 = bundle.train_x[torch.as_tensor(z["train_00000"])]
    assert torch.equal(parts[0].tensors[0], x0)
    # the labels are skewed (Dirichlet alpha = 0.5): client label histograms differ
    hists = [np.bincount(d.tensors[1].numpy(), minlength=10) for d in parts.values()]
    assert len({tuple(h) for h in hists}) == 4
    assert all(len(d) == 0 for d in run.client_test_datasets().values())


def test_local_test_split_is_held_out(tmp_path):
    run = fl.run("fedavg", local_test_fraction=0.25, out=tmp_path, **dict(TINY, rounds=1))
    _, test = RunStore(tmp_path).read_partition()
    train, _ = RunStore(tmp_path).read_partition()
    for tr, te in zip(train, test):
        assert len(te) == int(np.floor(0.25 * (len(tr) + len(te)))) and not set(tr) & set(te)
    sizes = {k: len(d) for k, d in run.client_datasets().items()}
    assert sum(sizes.values()) + sum(len(d) for d in run.client_test_datasets().values()) == 1437


@pytest.mark.parametrize("mode,expected", [("last", {3}), ("none", set()), ([1, 3], {1, 3})])
def test_save_clients_modes(tmp_path, mode, expected):
    run = fl.run("fedavg", save_clients=mode, out=tmp_path, **dict(TINY, rounds=3, clients=3))
    for r in (1, 2, 3):
        if r in expected:
            assert set(run.client_states(r)) == {0, 1, 2}
        else:
            with pytest.raises(CheckpointError, match=f"round {r} were not stored"):
                run.client_states(r)


def test_checkpoints_are_safetensors_readable_by_landscape(stored):
    run, path = stored
    files = sorted((path / "global").glob("*.safetensors")) + sorted((path / "clients").rglob("*.safetensors"))
    assert len(files) == 3 + 4 and not list(path.rglob("*.pt")) and not list(path.rglob("*.tmp*"))
    state = load_state_dict(files[-1])
    run.module().load_state_dict(state)


def test_progress_marker_and_metrics_truncation(tmp_path):
    store = RunStore(tmp_path)
    assert store.read_progress() is None and store.read_metrics() == []
    for r in range(3):
        store.append_metrics({"round": r, "test_loss": float(r)})
    store.mark(1, complete=False)
    assert store.read_progress() == 1 and not store.is_complete()
    with open(store.metrics_path, "a") as fh:
        fh.write('{"round": 3, "test_lo')  # a line cut by a crash
    assert [m["round"] for m in store.read_metrics()] == [0, 1]
    store.truncate_metrics(1)
    assert store.metrics_path.read_text().count("\n") == 2
    store.mark(2, complete=True)
    assert store.is_complete()
    (tmp_path / "progress.json").write_text("{garbage")
    with pytest.raises(CheckpointError, match="progress"):
        store.read_progress()


def test_client_state_files_round_trip_and_prune(tmp_path):
    store = RunStore(tmp_path)
    states = {0: {"m.weight": torch.ones(2, 2)}, 3: {"m.weight": torch.zeros(2, 2), "p": torch.arange(3)}}
    store.write_client_states(1, states)
    store.write_client_states(2, states)
    store.prune_client_states(2)
    assert not store.client_state_path(1).exists()
    back = store.read_client_states(2)
    assert set(back) == {0, 3} and torch.equal(back[3]["p"], torch.arange(3))
    assert store.read_client_states(5) == {}


def test_partition_round_trip(tmp_path):
    store = RunStore(tmp_path)
    train = [np.array([3, 1]), np.array([0, 2, 4])]
    test = [np.array([5]), np.zeros(0, np.int64)]
    store.write_partition(train, test)
    tr, te = store.read_partition()
    assert [t.tolist() for t in tr] == [[3, 1], [0, 2, 4]] and [t.tolist() for t in te] == [[5], []]


def test_load_run_errors(tmp_path):
    with pytest.raises(CheckpointError, match="not an FL run directory"):
        fl.load_run(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt JSON"):
        fl.load_run(tmp_path)


def test_writer_lock(tmp_path):
    store = RunStore(tmp_path)
    with store.lock():
        with pytest.raises(ConfigError, match="another process"):
            with RunStore(tmp_path).lock():
                pass
    with store.lock():  # released
        pass
