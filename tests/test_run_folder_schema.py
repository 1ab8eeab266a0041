"""Run-folder hardening.

No reads or writes through planted links, a diverged run is stopped and never stored as
complete, and a tampered folder gives a clear error instead of a silently different run.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil

import numpy as np
import pytest
import torch

import fl
from fl.store import RunDivergedError, RunStore
from landscape import CheckpointError, ConfigError, LandscapeError

ARGS = dict(dataset="digits", clients=4, rounds=2, batch_size=64, lr=0.1, seed=0, progress=False)


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    path = tmp_path_factory.mktemp("schema") / "run"
    fl.run("fedavg", out=path, **ARGS)
    return path


@pytest.fixture
def run_dir(original, tmp_path):
    """A fresh copy of a complete 2-round run to tamper with."""
    path = tmp_path / "run"
    shutil.copytree(original, path)
    return path


def _outside(tmp_path):
    victim = tmp_path / "outside.txt"
    victim.write_text("precious")
    return victim


def _reopen(path):
    return fl.run("fedavg", out=path, **ARGS)


def _incomplete(path, round: int = 1) -> None:
    (path / "progress.json").write_text(json.dumps({"round": round, "complete": False}))


# ------------------------------------------------------------------ item 1: links
def test_reopening_a_run_with_a_linked_lock_file_leaves_the_target_intact(run_dir, tmp_path):
    victim = _outside(tmp_path)
    (run_dir / ".lock").unlink(missing_ok=True)
    os.symlink(victim, run_dir / ".lock")
    with pytest.raises(LandscapeError, match="link"):
        _reopen(run_dir)
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("name", ["config.json", "progress.json", "metrics.jsonl", "partition.npz"])
def test_linked_run_files_are_refused_and_never_written(run_dir, tmp_path, name):
    victim = tmp_path / "outside.bin"
    shutil.copy(run_dir / name, victim)
    before = victim.read_bytes()
    (run_dir / name).unlink()
    os.symlink(victim, run_dir / name)
    if name != "progress.json":
        _incomplete(run_dir)  # a resume would rewrite metrics and progress
    with pytest.raises(CheckpointError, match="symbolic link"):
        _reopen(run_dir)
    with pytest.raises(CheckpointError, match="symbolic link"):
        fl.load_run(run_dir).metrics
    assert victim.read_bytes() == before


def test_linked_checkpoint_folder_is_refused_before_writing_into_it(run_dir, tmp_path):
    outside = tmp_path / "elsewhere"
    shutil.move(run_dir / "global", outside)
    os.symlink(outside, run_dir / "global")
    _incomplete(run_dir)
    before = sorted(p.name for p in outside.iterdir())
    with pytest.raises(CheckpointError, match="symbolic link"):
        _reopen(run_dir)
    assert sorted(p.name for p in outside.iterdir()) == before


# ------------------------------------------------------------- item 3: divergence
@pytest.mark.parametrize("option", [{"momentum": math.nan}, {"weight_decay": math.inf}, {"lr": 1e30}])
def test_non_finite_or_absurd_options_are_refused(tmp_path, option):
    with pytest.raises(ConfigError):
        fl.run("fedavg", out=tmp_path / "r", **{**ARGS, **option})
    assert not (tmp_path / "r" / "progress.json").exists()


class ExpLogits(torch.nn.Module):
    """A linear model with exponentiated logits.

    At a large learning rate they overflow to inf and the weights become NaN (a ReLU MLP only
    dies, with finite weights).
    """

    def __init__(self) -> None:
        super().__init__()
        self.flatten = torch.nn.Flatten()
        self.fc = torch.nn.Linear(64, 10)
        with torch.no_grad():
            self.fc.weight.copy_(torch.randn(10, 64, generator=torch.Generator().manual_seed(0)) / 8)
            self.fc.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.fc(self.flatten(x)))


def test_a_diverging_run_stops_naming_the_round_and_is_not_complete(tmp_path):
    path = tmp_path / "nan"
    args = {**ARGS, "lr": 100.0, "rounds": 6}
    with pytest.raises(LandscapeError, match=r"round (\d+)") as info:
        fl.run("fedavg", out=path, model=ExpLogits(), **args)
    r = int(re.search(r"round (\d+)", str(info.value)).group(1))
    assert r >= 1 and "diverged" in str(info.value)
    store = RunStore(path)
    assert store.read_progress() == r - 1 and not store.is_complete()
    run = fl.load_run(path, module=ExpLogits())
    assert [m["round"] for m in run.metrics] == list(range(r))
    assert all(torch.isfinite(t).all() for t in run.global_state(r - 1).values())
    assert not store.global_path(r).exists()


def test_check_round_finite_names_tensors_and_metrics() -> None:
    from fl.store import check_round_finite

    check_round_finite(3, {"w": torch.ones(2), "n": torch.tensor([5])}, {"test_loss": 0.5})
    with pytest.raises(RunDivergedError, match="round 3.*w"):
        check_round_finite(3, {"w": torch.tensor([1.0, math.nan])}, {"test_loss": 0.5})
    with pytest.raises(RunDivergedError, match="test_loss"):
        check_round_finite(3, {"w": torch.ones(2)}, {"test_loss": math.inf})


# ---------------------------------------------------------- item 4: damaged folders
def _rewrite_partition(path, edit) -> None:
    with np.load(path / "partition.npz") as z:
        arrays = {k: z[k] for k in z.files}
    edit(arrays)
    os.unlink(path / "partition.npz")
    np.savez(path / "partition.npz", **arrays)


@pytest.mark.parametrize("edit,message", [
    (lambda a: a.__setitem__("train_00000", np.concatenate([a["train_00000"], [-5]])), "outside the training set"),
    (lambda a: a.__setitem__("train_00001", np.concatenate([a["train_00001"], a["train_00000"][:3]])),
     "more than once"),
    (lambda a: a.__setitem__("train_00000", np.concatenate([a["train_00000"], a["train_00000"]])), "more than once"),
    (lambda a: a.__setitem__("train_00002", np.array([10**6])), "outside the training set"),
    (lambda a: [a.pop("train_00003"), a.pop("test_00003")], "3 clients, but the run has 4"),
    (lambda a: a.__setitem__("train_00001", a["train_00001"].astype(np.float64)), "integer"),
])
def test_tampered_partition_is_refused_on_resume_and_load(run_dir, edit, message):
    _rewrite_partition(run_dir, edit)
    _incomplete(run_dir)
    with pytest.raises(CheckpointError, match=message):
        _reopen(run_dir)
    with pytest.raises(CheckpointError, match=message):
        fl.load_run(run_dir).client_datasets()


@pytest.mark.parametrize("marker", [
    {"round": 2, "complete": "false"}, {"round": 1.9, "complete": False}, {"round": -3, "complete": True},
    {"round": True, "complete": False}, {"round": 3, "complete": False}, {"round": 1, "complete": True},
    {"round": 1}, {"round": 1, "complete": False, "extra": 0}, [1, False],
])
def test_invalid_progress_markers_are_refused(run_dir, marker):
    (run_dir / "progress.json").write_text(json.dumps(marker))
    with pytest.raises(CheckpointError, match="progress.json"):
        fl.load_run(run_dir).complete
    with pytest.raises(CheckpointError, match="progress.json"):
        _reopen(run_dir)


def test_infinite_progress_round_is_refused(run_dir):
    (run_dir / "progress.json").write_text('{"round": Infinity, "complete": false}')
    with pytest.raises(CheckpointError, match="integer"):
        fl.load_run(run_dir).rounds


@pytest.mark.parametrize("field,value", [
    ("test_accuracy", 5.0), ("test_loss", -1.0), ("test_loss", "low"), ("clients", [0, 0]),
    ("clients", [7]), ("lr", 0), ("time", None), ("extra", {"nested": 1}),
])
def test_damaged_metrics_records_are_refused(run_dir, field, value):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    record = json.loads(lines[1])
    record[field] = value
    lines[1] = json.dumps(record)
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(CheckpointError, match="line 2"):
        fl.load_run(run_dir).metrics


def test_non_finite_metric_constant_is_refused(run_dir):
    text = (run_dir / "metrics.jsonl").read_text().replace('"test_loss": ', '"test_loss": NaN, "x": ', 1)
    (run_dir / "metrics.jsonl").write_text(text)
    with pytest.raises(CheckpointError, match="line 1"):
        fl.load_run(run_dir).metrics


def test_config_fields_are_type_and_range_checked(run_dir):
    config = json.loads((run_dir / "config.json").read_text())
    for key, value in (("clients", "4"), ("rounds", -1), ("lr", math.inf), ("clients", 0)):
        (run_dir / "config.json").write_text(json.dumps({**config, key: value}))
        with pytest.raises((ConfigError, CheckpointError), match="config.json"):
            fl.load_run(run_dir)


@pytest.mark.parametrize("name", ["client_1.safetensors", "client_abc.safetensors", "client_00009.safetensors",
                                  "notes.txt"])
def test_unexpected_client_file_names_are_refused(run_dir, name):
    folder = run_dir / "clients" / "round_0002"
    shutil.copy(folder / "client_00001.safetensors", folder / name)
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
        fl.load_run(run_dir).client_states(2)


def test_symlinked_round_folder_is_refused(run_dir, tmp_path):
    folder = run_dir / "clients" / "round_0002"
    shutil.move(folder, tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", folder)
    with pytest.raises(CheckpointError, match="symbolic link"):
        fl.load_run(run_dir).client_states(2)
    with pytest.raises(CheckpointError, match="symbolic link"):
        _reopen(run_dir)


def test_untampered_copy_still_loads(run_dir):
    run = fl.load_run(run_dir)
    assert run.complete and [m["round"] for m in run.metrics] == [0, 1, 2]
    assert sorted(run.client_states(2)) == [0, 1, 2, 3]
    train = run.client_datasets()
    assert sum(len(d) for d in train.values()) == len(np.unique(np.concatenate(
        [np.asarray(p) for p in RunStore(run_dir).read_partition()[0]])))
