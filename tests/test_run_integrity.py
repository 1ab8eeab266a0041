"""Run folders and data caches refuse silently wrong content that they hold the data to catch.

A deleted client checkpoint, checkpoints without or with another digest, a swapped partition,
another run's or swapped models, edited metrics or configuration (the run manifest), an edited
MNIST-1D cache, and run files in a folder that holds no run.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import fl
from fl import mnist1d
from fl.datasets import load_dataset
from fl.manifest import json_digest
from landscape import CheckpointError, ConfigError, DataError, save_state_dict
from landscape.space.checkpoints import load_state_dict
from landscape_cli.main import main

from fault_counts import tally

ARGS = dict(dataset="digits", clients=4, rounds=2, progress=False, save_clients="all")


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 2-round FedAvg run with every client model saved."""
    out = tmp_path_factory.mktemp("integrity") / "run"
    fl.run("fedavg", out=out, **ARGS)
    return out


@pytest.fixture(scope="module")
def other(tmp_path_factory) -> Path:
    """Another run of the same configuration but another seed."""
    out = tmp_path_factory.mktemp("integrity_other") / "run"
    fl.run("fedavg", out=out, **dict(ARGS, seed=1))
    return out


@pytest.fixture
def run_dir(finished, tmp_path) -> Path:
    """A fresh copy of the finished run to tamper with."""
    return Path(shutil.copytree(finished, tmp_path / "run", ignore=shutil.ignore_patterns(".lock")))


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (but the writer's lock file) with its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def incomplete(folder: Path, round: int = 2) -> None:
    """Mark the run as stopped after ``round`` (so that fl.run resumes it)."""
    (folder / "progress.json").write_text(json.dumps({"round": round, "complete": False}))


def reseal(folder: Path, edit: Callable[[dict], None]) -> None:
    """Edit manifest.json and recompute its own digest (what a careful forger would do)."""
    path = folder / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    data.pop("digest")
    data["digest"] = json_digest(data)
    path.write_text(json.dumps(data))


def cli(args: list, capsys) -> tuple[int, str]:
    """Run ``landscape`` in-process; returns the exit code and stderr."""
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


def swap(a: Path, b: Path) -> None:
    """Exchange the contents of two files."""
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)


# ------------------------------------------------------------ a deleted client checkpoint
def test_a_deleted_client_checkpoint_is_refused_not_a_smaller_group(run_dir, tmp_path, capsys):
    missing = run_dir / "clients" / "round_0002" / "client_00003.safetensors"
    missing.unlink()
    before = snapshot(run_dir)
    with pytest.raises(CheckpointError, match=r"client_00003\.safetensors: is missing.*client 3's model of round 2"):
        fl.load_run(run_dir)
    for command in (["group", "--run", run_dir, "--models", "clients", "--out", tmp_path / "g", "--json",
                     "--no-figures", "--no-cache"],
                    ["report", "--run", run_dir, "--out", tmp_path / "r", "--resolution", 3, "--alphas", 3]):
        code, err = cli(command, capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("landscape: error:"), err
        assert "client_00003.safetensors: is missing" in lines[0]
    # a forger who also drops the file from the manifest: metrics.jsonl and save_clients still name it
    reseal(run_dir, lambda m: m["checkpoints"].pop("clients/round_0002/client_00003.safetensors"))
    run = fl.load_run(run_dir)
    with pytest.raises(CheckpointError, match=r"client_00003\.safetensors: is missing: metrics.jsonl lists client 3"):
        run.client_states(2)
    assert sorted(run.client_states(1)) == [0, 1, 2, 3]  # the intact round still reads
    assert snapshot(run_dir) == {**before, "manifest.json": (run_dir / "manifest.json").read_bytes()}
    assert not (tmp_path / "g").exists() and not (tmp_path / "r").exists()
    tally("hostile files refused", 4)


# ------------------------------------------------------ checkpoints without their digest
def test_sealing_a_folder_with_an_unsealable_checkpoint_writes_nothing(run_dir):
    """fl.seal_run checks every file before it writes the manifest once.

    A refused seal leaves the folder as it was, and sealing again after the file is restored
    works.
    """
    (run_dir / "manifest.json").unlink()
    path = run_dir / "global/round_0002.safetensors"
    original = path.read_bytes()
    save_file({k: v * 1.01 for k, v in load_state_dict(path).items()}, str(path))
    before = snapshot(run_dir)
    with pytest.raises(CheckpointError, match=r"round_0002\.safetensors: carries no SHA-256.*cannot be sealed"):
        fl.seal_run(run_dir)
    assert snapshot(run_dir) == before and not (run_dir / "manifest.json").exists()
    path.write_bytes(original)
    fl.seal_run(run_dir)
    assert fl.load_run(run_dir).rounds == [0, 1, 2]
    tally("hostile files refused", 1)


@pytest.mark.parametrize("target", ["global/round_0002.safetensors", "clients/round_0002/client_00001.safetensors"])
@pytest.mark.parametrize("how,message", [("save_file", "carries no SHA-256"),
                                         ("save_state_dict", "another model was put in its place")])
def test_a_re_saved_checkpoint_is_refused_on_load_and_resume(run_dir, target, how, message):
    path = run_dir / target
    scaled = {k: v * 1.01 for k, v in load_state_dict(path).items()}
    if how == "save_file":
        save_file(scaled, str(path))  # safetensors without landscape's digest
    else:
        save_state_dict(scaled, path)  # with a digest of its own, valid but not the run's
    with pytest.raises(CheckpointError, match=rf"{target}: .*{message}"):
        fl.load_run(run_dir)
    incomplete(run_dir)
    before = snapshot(run_dir)
    with pytest.raises(CheckpointError, match=rf"{target}: .*{message}"):
        fl.run("fedavg", out=run_dir, **ARGS)
    assert snapshot(run_dir) == before
    tally("hostile files refused", 2)


def test_a_checkpoint_replaced_after_the_run_was_opened_is_refused_when_read(run_dir):
    run = fl.load_run(run_dir)
    path = run_dir / "global" / "round_0001.safetensors"
    save_file({k: v * 1.01 for k, v in load_state_dict(path).items()}, str(path))
    with pytest.raises(CheckpointError, match=r"round_0001\.safetensors: carries no SHA-256"):
        run.global_state(1)
    shutil.copy(run_dir / "global" / "round_0002.safetensors", path)
    with pytest.raises(CheckpointError, match=r"round_0001\.safetensors: is not the checkpoint recorded here"):
        run.global_state(1)
    tally("hostile files refused", 2)


# ---------------------------------------------------------------- a swapped partition
@pytest.mark.parametrize("forged_manifest", [False, True])
def test_a_swapped_partition_is_refused_on_resume_and_load(run_dir, forged_manifest):
    with np.load(run_dir / "partition.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["train_00000"], arrays["train_00001"] = arrays["train_00001"], arrays["train_00000"]
    (run_dir / "partition.npz").unlink()
    np.savez(run_dir / "partition.npz", **arrays)
    if forged_manifest:  # the partition digest of the manifest updated too: the seed still decides
        from fl.manifest import partition_digest

        train = [arrays[f"train_{k:05d}"] for k in range(4)]
        test = [arrays[f"test_{k:05d}"] for k in range(4)]
        reseal(run_dir, lambda m: m.update(partition=partition_digest(train, test)))
    incomplete(run_dir, 1)
    before = snapshot(run_dir)
    expected = r"partition\.npz: client 0's training indices differ from the partition drawn from the run's seed"
    with pytest.raises(CheckpointError, match=expected):
        fl.run("fedavg", out=run_dir, **ARGS)
    with pytest.raises(CheckpointError, match=expected):
        fl.load_run(run_dir).client_datasets()
    assert snapshot(run_dir) == before
    tally("hostile files refused", 2)


# ---------------------------------------------------------------------- the manifest
def _other_global(run_dir: Path, other: Path) -> None:
    shutil.copy(other / "global" / "round_0002.safetensors", run_dir / "global" / "round_0002.safetensors")


def _swap_rounds(run_dir: Path, other: Path) -> None:
    swap(run_dir / "global" / "round_0001.safetensors", run_dir / "global" / "round_0002.safetensors")


def _swap_clients(run_dir: Path, other: Path) -> None:
    folder = run_dir / "clients" / "round_0002"
    swap(folder / "client_00000.safetensors", folder / "client_00001.safetensors")


def _edit_accuracy(run_dir: Path, other: Path) -> None:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    record = json.loads(lines[2])
    record["test_accuracy"] = 0.999  # valid for the schema, but not what the run measured
    lines[2] = json.dumps(record, sort_keys=True)
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _edit_config(run_dir: Path, other: Path) -> None:
    config = json.loads((run_dir / "config.json").read_text())
    config["weight_decay"] = 0.001
    (run_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _plant_state(run_dir: Path, other: Path) -> None:
    save_state_dict({"anchor": torch.ones(3)}, run_dir / "state" / "round_0001.safetensors")


def _drop_manifest(run_dir: Path, other: Path) -> None:
    (run_dir / "manifest.json").unlink()


def _damage_manifest(run_dir: Path, other: Path) -> None:
    text = (run_dir / "manifest.json").read_text()
    (run_dir / "manifest.json").write_text(text.replace('"round": 2', '"round": 1', 1))


@pytest.mark.parametrize("attack,message", [
    (_other_global, r"global/round_0002\.safetensors: is not the global model of round 2 recorded in the run's "
                    r"manifest: another model was put in its place"),
    (_swap_rounds, r"global/round_0001\.safetensors: is not the global model of round 1 .* it holds the model "
                   r"recorded as global/round_0002\.safetensors \(files swapped\?\)"),
    (_swap_clients, r"client_00000\.safetensors: is not client 0's model of round 2 .* recorded as "
                    r"clients/round_0002/client_00001\.safetensors"),
    (_edit_accuracy, r"metrics\.jsonl: the record of round 2 differs from the one recorded in the run's manifest"),
    (_edit_config, r"config\.json: differs from the configuration recorded in the run's manifest"),
    (_plant_state, r"state/round_0001\.safetensors: is not listed in the run's manifest"),
    (_drop_manifest, r"manifest\.json: missing"),
    (_damage_manifest, r"manifest\.json: (is damaged|is not a run manifest)"),
], ids=lambda v: v.__name__.strip("_") if callable(v) else None)
def test_a_folder_that_differs_from_its_manifest_is_refused_on_load_and_resume(run_dir, other, attack, message):
    attack(run_dir, other)
    with pytest.raises(CheckpointError, match=message):
        fl.load_run(run_dir)
    requested = dict(ARGS, weight_decay=0.001) if attack is _edit_config else ARGS
    for marker in ("complete", "incomplete"):
        if marker == "incomplete":
            incomplete(run_dir)
        before = snapshot(run_dir)
        with pytest.raises(CheckpointError, match=message):
            fl.run("fedavg", out=run_dir, **requested)
        assert snapshot(run_dir) == before
        assert attack is not _drop_manifest or not (run_dir / ".lock").exists()  # refused before locking
    tally("hostile files refused", 3)


@pytest.mark.parametrize("name", ["manifest.json", "global/round_0001.safetensors"])
def test_a_fifo_in_place_of_the_manifest_or_a_checkpoint_is_refused_not_read(run_dir, name):
    (run_dir / name).unlink()
    os.mkfifo(run_dir / name)
    # a read that blocks on the FIFO fails the test instead of hanging the suite
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: pytest.fail(f"{name}: read blocked for 30 s"))
    signal.alarm(30)
    try:
        with pytest.raises(CheckpointError, match=rf"{name}: is a FIFO \(named pipe\), not a regular file"):
            fl.load_run(run_dir)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    tally("hostile files refused", 1)


def test_a_run_killed_after_its_manifest_resumes_to_the_uninterrupted_result(run_dir, finished):
    incomplete(run_dir, 1)  # killed after round 2's manifest, before its progress mark
    seen: list[int] = []
    resumed = fl.run("fedavg", out=run_dir, on_round=lambda r, m: seen.append(r), **ARGS)
    reference = fl.load_run(finished)
    assert seen == [2] and resumed.complete
    for r in (0, 1, 2):
        ref = reference.global_state(r)
        assert all(torch.equal(t, ref[k]) for k, t in resumed.global_state(r).items())
    assert json.loads((run_dir / "manifest.json").read_text())["round"] == 2
    assert [m["test_accuracy"] for m in fl.load_run(run_dir).metrics] == \
        [m["test_accuracy"] for m in reference.metrics]
    tally("kills survived", 1)


# ------------------------------------------------------------ folders without a run
@pytest.mark.parametrize("files", [
    {"partition.npz": b"PK\x03\x04 the user's own partition"},
    {"metrics.jsonl": b'{"round": 0}\n'},
    {"global/round_0000.safetensors": b"weights"},
    {"progress.json": b'{"round": 0, "complete": false}', "manifest.json": b"{}"},
])
def test_run_files_without_a_configuration_are_refused_and_left_alone(tmp_path, files):
    out = tmp_path / "mine"
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    with pytest.raises(ConfigError, match=r"is not an FL run directory .*but no config\.json\); nothing was changed"):
        fl.run("fedavg", out=out, **ARGS)
    assert snapshot(out) == files and not (out / ".lock").exists()
    assert sorted(p.name for p in out.iterdir()) == sorted({name.split("/")[0] for name in files})
    tally("bad inputs rejected", 1)


def test_a_configuration_that_is_not_a_run_is_refused_and_left_alone(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.json").write_text('{"learning_rate": 0.1}')
    (out / "partition.npz").write_bytes(b"my partition")
    before = snapshot(out)
    with pytest.raises(CheckpointError, match=r"config\.json: is not a run configuration"):
        fl.run("fedavg", out=out, **ARGS)
    assert snapshot(out) == before and not (out / ".lock").exists()
    tally("bad inputs rejected", 1)


# ---------------------------------------------------------------- the MNIST-1D cache
@pytest.fixture(scope="module")
def generated() -> dict[str, np.ndarray]:
    return mnist1d.generate()


def test_an_edited_mnist1d_cache_with_a_recomputed_digest_is_regenerated(tmp_path, generated):
    shifted = {k: v.copy() for k, v in generated.items()}
    shifted["y"] = (shifted["y"] + 1) % 10
    path = mnist1d.cache_path(tmp_path)
    np.savez(path, digest=np.array(mnist1d.digest(shifted)), **shifted)  # self-consistent, but wrong
    with pytest.warns(UserWarning, match=r"not the MNIST-1D data of the mnist1d generator.*regenerating"):
        bundle = load_dataset("mnist1d", root=tmp_path)
    np.testing.assert_array_equal(bundle.train_y.numpy(), generated["y"])
    with np.load(path, allow_pickle=False) as npz:  # rewritten with the generator's data
        np.testing.assert_array_equal(npz["y"], generated["y"])
    assert mnist1d.matches_generator(generated)
    tally("corrupt inputs tried", 1)


@pytest.mark.parametrize("edit", ["labels of one signal", "inputs x 1.001", "inputs + 1e-3", "one input + 0.5"])
def test_edited_mnist1d_inputs_or_labels_do_not_match_the_generator(generated, edit):
    edited = {k: v.copy() for k, v in generated.items()}
    if edit == "labels of one signal":
        edited["y_test"][7] = (edited["y_test"][7] + 3) % 10
    elif edit == "inputs x 1.001":
        edited["x"] *= np.float32(1.001)
    elif edit == "inputs + 1e-3":
        edited["x_test"] += np.float32(1e-3)
    else:
        edited["x"][123, 0, 17] += np.float32(0.5)
    assert not mnist1d.matches_generator(edited)
    tally("corrupt inputs tried", 1)


def test_the_fingerprint_tolerates_one_float32_rounding_per_value(generated):
    """Another CPU's float64 kernels may round the generator's inputs differently in the last float32 bit.

    One ulp on every value, in a random direction, still matches.
    """
    rng = np.random.default_rng(0)
    nudged = {k: v.copy() for k, v in generated.items()}
    for key in ("x", "x_test"):
        direction = np.where(rng.random(nudged[key].shape) < 0.5, -np.inf, np.inf).astype(np.float32)
        nudged[key] = np.nextafter(nudged[key], direction)
        assert np.any(nudged[key] != generated[key])
    assert mnist1d.matches_generator(nudged)


def test_a_generator_that_gives_other_data_is_refused(tmp_path, generated, monkeypatch):
    other_data = {k: v.copy() for k, v in generated.items()}
    other_data["x"][0, 0, 0] += 1.0
    monkeypatch.setattr(mnist1d, "generate", lambda draw=None: other_data)
    with pytest.raises(DataError, match=r"generated data that differ from the recorded fingerprint"):
        load_dataset("mnist1d", root=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing cached
    tally("bad inputs rejected", 1)
