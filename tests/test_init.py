"""Runs started from given weights (``fl.run(..., init=...)``) and central pretraining (``fl.pretrain``)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

import fl
from fl.cli import main as fl_run_main
from fl.config import config_digest
from fl.datasets import load_dataset
from fl.initial import InitMismatchError
from fl.models import build_model
from fl.pretrain import pretraining_data
from fl.recipes import Recipe
from landscape import (
    ArchitectureMismatchError,
    CheckpointError,
    ConfigError,
    FileWriteError,
    NonFiniteWeightsError,
    TrainingDivergedError,
    load_state_dict,
    save_state_dict,
)

from fault_counts import tally
from test_hostile_files import SPECIAL, deadline

DIGITS = {"dataset": "digits", "clients": 4, "rounds": 1, "progress": False, "save_clients": "none"}


def digits_weights(seed: int) -> dict[str, torch.Tensor]:
    """Weights of the digits model (``mlp``) from a seed other than any run's."""
    return build_model("mlp", num_classes=10, input_shape=(1, 8, 8), seed=seed).state_dict()


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_state_dict(digits_weights(101), tmp_path_factory.mktemp("init") / "pretrained.safetensors")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> fl.Run:
    return fl.run("fedavg", out=tmp_path_factory.mktemp("init") / "run", **{**DIGITS, "rounds": 2})


@pytest.fixture(scope="module")
def pretrained_mnist1d(tmp_path_factory) -> Path:
    return fl.pretrain(dataset="mnist1d", model="mnist1d_mlp", epochs=5, seed=0, progress=False,
                       out=tmp_path_factory.mktemp("pretrain") / "mlp.safetensors")


# ----------------------------------------------------------------------------- starting weights
def test_round_zero_is_the_checkpoint_bit_for_bit(checkpoint, tmp_path):
    run = fl.run("fedavg", init=checkpoint, out=tmp_path / "run", **DIGITS)
    assert_same(run.global_state(0), load_state_dict(checkpoint))
    assert_same(run.module().state_dict(), load_state_dict(checkpoint))  # the run's initial model
    assert run.config["init"] == str(checkpoint) and len(run.config["init_digest"]) == 16
    random_start = fl.run("fedavg", out=tmp_path / "random", **DIGITS)
    assert not torch.equal(random_start.global_state(0)["classifier.weight"],
                           run.global_state(0)["classifier.weight"])
    assert fl.load_run(tmp_path / "run").config["init_digest"] == run.config["init_digest"]


def test_finished_run_folder_gives_its_last_global_model(finished_run, tmp_path):
    run = fl.run("fedavg", init=finished_run.path, out=tmp_path / "run", **DIGITS)
    assert_same(run.global_state(0), finished_run.global_state(-1))
    assert finished_run.rounds[-1] == 2


def test_other_contents_at_the_same_path_never_resume_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "weights.safetensors"
    save_state_dict(digits_weights(1), path)
    first = fl.run("fedavg", init=path, **DIGITS)  # default folder runs/<...>-<config digest>
    save_state_dict(digits_weights(2), path)  # other weights at the same path
    second = fl.run("fedavg", init=path, **DIGITS)
    assert first.config["init_digest"] != second.config["init_digest"]
    assert config_digest(first.config) != config_digest(second.config) and first.path != second.path
    assert first.path.name.endswith(config_digest(first.config))
    with pytest.raises(ConfigError, match="holds a run with another configuration .*init_digest"):
        fl.run("fedavg", init=path, out=first.path, **DIGITS)
    moved = shutil.copyfile(path, tmp_path / "moved.safetensors")  # the same weights elsewhere: the same run
    assert fl.run("fedavg", init=moved, out=second.path, **DIGITS).config["init"] == str(path)
    tally("bad inputs rejected", 1)


def test_recipe_can_set_init(checkpoint, tmp_path, monkeypatch):
    recipe = Recipe("digits-pretrained", "test", {**{k: v for k, v in DIGITS.items() if k != "progress"},
                                                  "init": str(checkpoint)})
    monkeypatch.setitem(fl.resolve.RECIPES, recipe.name, recipe)
    run = fl.run(recipe=recipe.name, out=tmp_path / "run", progress=False)
    assert run.config["recipe"] == recipe.name and run.config["init"] == str(checkpoint)
    assert_same(run.global_state(0), load_state_dict(checkpoint))


def test_fl_run_command_line_has_init(checkpoint, tmp_path, capsys):
    args = ["--dataset", "digits", "--clients", "4", "--rounds", "1", "--no-progress"]
    assert fl_run_main([*args, "--init", str(checkpoint), "--out", str(tmp_path / "run")]) == 0
    assert_same(fl.load_run(tmp_path / "run").global_state(0), load_state_dict(checkpoint))
    capsys.readouterr()
    assert fl_run_main([*args, "--init", str(tmp_path / "absent.safetensors"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fl-run: error: ") and "init checkpoint not found" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()
    tally("bad inputs rejected", 1)


# ----------------------------------------------------------------------------- refused inputs
def _unfinished_run(folder: Path) -> Path:
    """A run stopped after round 1 of 3 (as a kill leaves it)."""
    class Stop(Exception):
        pass

    def stop(round: int, record: dict) -> None:
        raise Stop

    with pytest.raises(Stop):
        fl.run("fedavg", out=folder, on_round=stop, **{**DIGITS, "rounds": 3})
    return folder


def _weights_file(folder: Path, change: str) -> Path:
    state = dict(digits_weights(3))
    if change == "extra":
        state["head.scale"] = torch.ones(3)
    elif change == "missing":
        del state["features.3.weight"]
    elif change == "shape":
        state["features.3.weight"] = torch.zeros(64, 32)
    elif change == "nan":
        state["classifier.bias"] = state["classifier.bias"].clone()
        state["classifier.bias"][4] = float("nan")
    elif change == "integer":
        state["classifier.bias"] = torch.zeros(10, dtype=torch.int64)
    return save_state_dict(state, folder / f"{change}.safetensors")


BAD = {  # case -> (make the init value in a folder, error class, distinctive part of the message)
    "missing file": (lambda d: d / "absent.safetensors", CheckpointError, "init checkpoint not found"),
    "folder without a run": (lambda d: d, CheckpointError, "is a folder but not an FL run folder"),
    "unfinished run": (lambda d: _unfinished_run(d / "unfinished"), CheckpointError,
                       "holds an unfinished run (rounds 0..1 of 3 stored)"),
    "text file": (lambda d: Path(shutil.copyfile(__file__, d / "notes.safetensors")), CheckpointError,
                  "is not a checkpoint: it is a text file"),
    "extra tensor": (lambda d: _weights_file(d, "extra"), InitMismatchError,
                     "the checkpoint's head.scale (shape (3,)) is not in the model"),
    "missing tensor": (lambda d: _weights_file(d, "missing"), InitMismatchError,
                       "the model's features.3.weight (shape (64, 64)) is not in the checkpoint"),
    "wrong shape": (lambda d: _weights_file(d, "shape"), InitMismatchError,
                    "features.3.weight has shape (64, 32) in the checkpoint but (64, 64) in the model"),
    "NaN weight": (lambda d: _weights_file(d, "nan"), NonFiniteWeightsError,
                   "has NaN or infinite values in [classifier.bias]"),
    "integer weight": (lambda d: _weights_file(d, "integer"), CheckpointError,
                       "classifier.bias is torch.int64 in the init checkpoint but torch.float32 in the model"),
    "empty path": (lambda d: "  ", ConfigError, "init is an empty path"),
    "not a path": (lambda d: 5, ConfigError, "init must be"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_init_is_refused_before_anything_is_written(case, tmp_path):
    make, cls, words = BAD[case]
    value = make(tmp_path)
    with pytest.raises(cls) as info:
        fl.run("fedavg", init=value, out=tmp_path / "out", **DIGITS)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()
    if cls is InitMismatchError:
        assert isinstance(info.value, ArchitectureMismatchError)
    tally("bad inputs rejected", 1)


def test_pickled_objects_are_not_unpickled(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2), "hook": Recipe("x", "y")}, path)  # an arbitrary object beside a tensor
    with pytest.raises(CheckpointError, match="refusing to unpickle"):
        fl.run("fedavg", init=path, out=tmp_path / "out", **DIGITS)
    assert not (tmp_path / "out").exists()
    tally("hostile files refused", 1)


@pytest.mark.parametrize("kind", ["fifo", "chardev"])
def test_special_files_are_refused_unread(kind, tmp_path):
    make, words = SPECIAL[kind]
    path = tmp_path / "weights.safetensors"
    make(path)
    with deadline(60), pytest.raises(CheckpointError) as info:
        fl.run("fedavg", init=path, out=tmp_path / "out", **DIGITS)
    assert words in str(info.value) and not (tmp_path / "out").exists()
    tally("hostile files refused", 1)


# ----------------------------------------------------------------------------- pretraining
def test_pretraining_is_deterministic(pretrained_mnist1d, tmp_path):
    again = fl.pretrain(dataset="mnist1d", model="mnist1d_mlp", epochs=5, seed=0, progress=False,
                        out=tmp_path / "again.safetensors")
    assert again.read_bytes() == pretrained_mnist1d.read_bytes()
    assert_same(load_state_dict(again), load_state_dict(pretrained_mnist1d))
    other = fl.pretrain(dataset="mnist1d", model="mnist1d_mlp", epochs=5, seed=1, progress=False,
                        out=tmp_path / "other.safetensors")
    assert not torch.equal(load_state_dict(other)["linear1.weight"], load_state_dict(again)["linear1.weight"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.safetensors", "other.safetensors"]  # no temporaries


def test_pretraining_data_share_no_signal_with_the_federation():
    pre = pretraining_data("mnist1d")
    fed = load_dataset("mnist1d")
    assert pre.train_x.shape == (5000, 1, 40) and set(pre.train_y.tolist()) == set(range(10))
    seen = {bytes(row) for x in (fed.train_x, fed.test_x) for row in x.reshape(len(x), -1).numpy()}
    assert not any(bytes(row) in seen for row in pre.train_x.reshape(5000, -1).numpy())
    # not merely bit-level differences: the closest federation signal is far away
    pre_flat, fed_flat = pre.train_x.reshape(5000, -1), torch.cat([fed.train_x, fed.test_x]).reshape(5000, -1)
    assert float(torch.cdist(pre_flat[:500], fed_flat).min()) > 1.0


def test_pretrained_start_beats_a_random_start_after_one_round(pretrained_mnist1d, tmp_path):
    settings = {"dataset": "mnist1d", "model": "mnist1d_mlp", "clients": 4, "rounds": 1, "local_epochs": 1,
                "alpha": 0.5, "progress": False, "save_clients": "none"}
    random_start = fl.run("fedavg", out=tmp_path / "random", **settings)
    pretrained = fl.run("fedavg", init=pretrained_mnist1d, out=tmp_path / "pretrained", **settings)
    # measured: about 0.50 against 0.22 after round 1 (0.60 against 0.10 at round 0)
    assert pretrained.metrics[1]["test_accuracy"] > random_start.metrics[1]["test_accuracy"] + 0.15
    assert pretrained.metrics[0]["test_accuracy"] > 0.4


@pytest.mark.parametrize("arguments, cls, words", [
    ({"dataset": "digits"}, ConfigError, "pretraining data exist for mnist1d only"),
    ({"epochs": 0}, ConfigError, "pretrain option epochs"),
    ({"lr": float("nan")}, ConfigError, "pretrain option lr"),
    ({"out": "weights.txt"}, ConfigError, "a checkpoint is written as .safetensors, .pt or .pth"),
    ({"lr": 100.0, "model": "mnist1d_mlp"}, TrainingDivergedError, "pretraining diverged in epoch 0"),
])
def test_pretrain_refuses_bad_arguments(arguments, cls, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(cls, match=words.replace(".", r"\.")):
        fl.pretrain(**{"dataset": "mnist1d", "epochs": 1, "out": tmp_path / "w.safetensors", **arguments},
                    progress=False)
    assert list(tmp_path.iterdir()) == []
    tally("bad inputs rejected", 1)


def test_pretrain_never_writes_through_a_link(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("not yours")
    link = tmp_path / "w.safetensors"
    os.symlink(target, link)
    with pytest.raises(FileWriteError, match="is a symbolic link"):
        fl.pretrain(dataset="mnist1d", model="mnist1d_mlp", epochs=1, out=link, progress=False)
    assert target.read_text() == "not yours" and link.is_symlink()
    tally("hostile files refused", 1)
