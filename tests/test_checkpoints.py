"""Checkpoint loading: every supported form, refusal of pickled code, corrupt files, mismatches."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from landscape import (
    ArchitectureMismatchError,
    CheckpointError,
    NonFiniteWeightsError,
    ParameterSpace,
    load_state_dict,
    save_state_dict,
)

from conftest import make_bn_cnn, make_mlp


@pytest.fixture
def model() -> nn.Module:
    return make_bn_cnn(3)


def _forms(model: nn.Module, tmp: Path) -> dict[str, object]:
    state = model.state_dict()
    torch.save(state, tmp / "plain.pt")
    torch.save(state, tmp / "plain.pth")
    torch.save({"state_dict": state, "epoch": 7, "name": "run"}, tmp / "wrapped.pt")
    torch.save({"model_state_dict": state, "optimizer": {"lr": 0.1}}, tmp / "wrapped2.pt")
    torch.save(nn.DataParallel(model).state_dict(), tmp / "dataparallel.pt")
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "w.safetensors"))
    names = ("plain.pt", "plain.pth", "wrapped.pt", "wrapped2.pt", "dataparallel.pt", "w.safetensors")
    forms: dict[str, object] = {name: tmp / name for name in names}
    forms["str path"] = str(tmp / "plain.pt")
    forms["module"] = model
    forms["state_dict"] = state
    forms["dataparallel state_dict"] = nn.DataParallel(model).state_dict()
    return forms


def test_every_supported_form_gives_the_same_vector(model, tmp_path):
    space = ParameterSpace(make_bn_cnn(0))
    expected = space.to_vector(model)
    for name, form in _forms(model, tmp_path).items():
        assert torch.equal(space.to_vector(form), expected), name


def test_save_state_dict_round_trips_atomically(model, tmp_path):
    for suffix in (".pt", ".safetensors"):
        path = save_state_dict(model.state_dict(), tmp_path / "sub" / f"m{suffix}")
        loaded = load_state_dict(path)
        assert loaded.keys() == model.state_dict().keys()
        assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["m.pt", "m.safetensors"]  # no temp files


def test_pickled_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"

    class Payload:
        def __reduce__(self):  # unpickling this would run a shell command creating the marker
            return (os.system, (f"touch {marker}",))

    torch.save({"weight": torch.zeros(2), "x": Payload()}, evil)
    assert evil.exists() and not marker.exists()
    with pytest.raises(CheckpointError, match="refusing to unpickle") as info:
        load_state_dict(evil)
    assert str(evil) in str(info.value)
    space = ParameterSpace(nn.Linear(2, 1))
    with pytest.raises(CheckpointError):
        space.to_vector(evil)
    assert not marker.exists()


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_truncated_and_garbage_files(model, tmp_path, suffix):
    good = save_state_dict(model.state_dict(), tmp_path / f"good{suffix}")
    data = good.read_bytes()
    for name, content in (("half", data[: len(data) // 2]), ("tail", data[:-20]), ("garbage", os.urandom(300))):
        bad = tmp_path / f"{name}{suffix}"
        bad.write_bytes(content)
        with pytest.raises(CheckpointError) as info:
            load_state_dict(bad)
        assert str(bad) in str(info.value), name
    empty = tmp_path / f"empty{suffix}"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty"):
        load_state_dict(empty)
    with pytest.raises(CheckpointError, match="not found"):
        load_state_dict(tmp_path / f"missing{suffix}")
    with pytest.raises(CheckpointError, match="directory"):
        load_state_dict(tmp_path)


def test_non_state_dict_payloads(tmp_path):
    torch.save([torch.zeros(2)], tmp_path / "list.pt")
    torch.save({"epoch": 3}, tmp_path / "meta.pt")
    for name in ("list.pt", "meta.pt"):
        with pytest.raises(CheckpointError, match="does not hold a state_dict"):
            load_state_dict(tmp_path / name)


def test_architecture_mismatch_in_a_file_is_precise(tmp_path):
    state = make_mlp(0, hidden=16).state_dict()
    state["3.weight"] = torch.zeros(10, 12)
    del state["3.bias"]
    state["4.weight"] = torch.zeros(3)
    path = save_state_dict(state, tmp_path / "wrong.safetensors")
    with pytest.raises(ArchitectureMismatchError) as info:
        ParameterSpace(make_mlp(0, hidden=16)).to_vector(path)
    err = info.value
    assert (err.missing, err.unexpected, err.wrong_shape) == (
        ["3.bias"], ["4.weight"], [("3.weight", (10, 16), (10, 12))])
    assert str(path) in str(err)


def test_nan_weights_in_a_file(tmp_path):
    state = make_mlp(0).state_dict()
    state["1.weight"][3, 4] = float("nan")
    path = save_state_dict(state, tmp_path / "nan.pt")
    with pytest.raises(NonFiniteWeightsError, match=r"1\.weight") as info:
        ParameterSpace(make_mlp(0)).to_vector(path)
    assert str(path) in str(info.value)
