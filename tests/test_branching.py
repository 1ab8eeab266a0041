"""``fl.branch``: IMA's rounds before ``start_round`` copied from a stored FedAvg run.

The branched run must be the run ``fl.run`` trains from round 1, file for file (global
models, server states with IMA's window, client checkpoints, metrics but their times,
configuration), also when it is interrupted and resumed; every set-up whose copied rounds
could differ from trained ones is refused before anything is written.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import fl
from landscape import ConfigError

SETTINGS = dict(recipe="ima-mnist1d", rounds=7, clients=6, local_epochs=1, seed=3, save_clients="all")
IMA = dict(start_round=5, window=3)


class Stop(Exception):
    """Raised from ``on_round`` to interrupt a run."""


def stop_after(last: int):
    """An ``on_round`` callback that interrupts the run after round ``last``."""
    def on_round(r: int, _: dict) -> None:
        if r == last:
            raise Stop
    return on_round


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, fl.Run]:
    """FedAvg, and IMA trained from round 1, in the same setting."""
    d = tmp_path_factory.mktemp("branch")
    return {"fedavg": fl.run("fedavg", out=d / "fedavg", progress=False, **SETTINGS),
            "ima": fl.run("ima", out=d / "ima", progress=False, **SETTINGS, **IMA)}


def records(run: fl.Run) -> list[dict]:
    """The metrics records without their wall times."""
    return [{k: v for k, v in m.items() if k != "time"} for m in run.metrics]


def assert_same_files(a: Path, b: Path) -> None:
    """Every checkpoint, server state and the configuration of run folder ``a`` equal ``b``'s, byte for byte."""
    files = sorted(p.relative_to(a) for p in a.rglob("*.safetensors"))
    assert files == sorted(p.relative_to(b) for p in b.rglob("*.safetensors"))
    assert len(files) > 20
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    assert json.loads((a / "config.json").read_text()) == json.loads((b / "config.json").read_text())


@pytest.mark.parametrize("through", [None, 1, 0])
def test_branch_equals_the_run_trained_from_round_one(runs, tmp_path, through):
    branched = fl.branch(runs["fedavg"], "ima", through=through, out=tmp_path / "b", progress=False, **SETTINGS, **IMA)
    assert_same_files(runs["ima"].path, branched.path)
    assert records(branched) == records(runs["ima"])
    last = 4 if through is None else through
    assert branched.metrics[last]["time"] == runs["fedavg"].metrics[last]["time"]  # copied, not trained
    # the window rebuilt for round 4 is IMA's own: the global models of rounds 2..4
    assert branched.algorithm_state(4)["ima.rounds"].tolist() == [2, 3, 4]


def test_interrupted_branch_resumes_to_the_same_run(runs, tmp_path):
    with pytest.raises(Stop):
        fl.branch(runs["fedavg"], "ima", out=tmp_path / "b", progress=False, on_round=stop_after(6),
                  **SETTINGS, **IMA)
    assert fl.load_run(tmp_path / "b").rounds[-1] == 6
    resumed = fl.branch(runs["fedavg"], "ima", out=tmp_path / "b", progress=False, **SETTINGS, **IMA)
    assert_same_files(runs["ima"].path, resumed.path)


def test_ima_around_another_base(tmp_path):
    settings = {**SETTINGS, "mu": 0.1}
    source = fl.run("fedprox", out=tmp_path / "prox", progress=False, **settings)
    whole = fl.run("fedprox", out=tmp_path / "whole", progress=False, ima=IMA, **settings)
    branched = fl.branch(source, "fedprox", out=tmp_path / "b", progress=False, ima=IMA, **settings)
    assert_same_files(whole.path, branched.path)


@pytest.mark.parametrize("through, settings, source, message", [
    (5, {}, "fedavg", "through round 4 only"),
    (-1, {}, "fedavg", "must be in 0..4"),
    (4, {"lr": 0.02}, "fedavg", "setting 'lr' is 0.02 here but 0.01"),
    (4, {"seed": 4}, "fedavg", "setting 'seed'"),
    (4, {"mu": 0.1, "algorithm": "fedprox", "ima": IMA}, "fedavg", "trains as 'fedprox'"),
])
def test_refused_before_anything_is_written(runs, tmp_path, through, settings, source, message):
    kwargs = {**SETTINGS, **settings}
    algorithm = kwargs.pop("algorithm", "ima")
    extra = {} if "ima" in kwargs else IMA
    with pytest.raises(ConfigError, match=message):
        fl.branch(runs[source], algorithm, through=through, out=tmp_path / "b", progress=False, **kwargs, **extra)
    assert fl.load_run(tmp_path / "b").rounds == []


def test_a_continuation_equals_the_longer_run_trained_from_round_one(runs, tmp_path):
    longer = {**SETTINGS, "rounds": 10}
    whole = fl.run("fedavg", out=tmp_path / "whole", progress=False, **longer)
    continued = fl.branch(runs["fedavg"], "fedavg", out=tmp_path / "continued", progress=False, **longer)
    assert_same_files(whole.path, continued.path)
    assert records(continued) == records(whole)
    assert continued.metrics[7]["time"] == runs["fedavg"].metrics[7]["time"]  # copied, not trained
    assert continued.metrics[8]["time"] != runs["fedavg"].metrics[7]["time"]


def test_an_algorithm_without_a_base_and_a_short_source(runs, tmp_path):
    with pytest.raises(ConfigError, match="needs it complete and more than its 7 rounds, got rounds=7"):
        fl.branch(runs["fedavg"], "fedavg", out=tmp_path / "a", progress=False, **SETTINGS)
    with pytest.raises(ConfigError, match="trains as no other algorithm"):
        fl.branch(runs["fedavg"], "fedprox", mu=0.1, out=tmp_path / "p", progress=False, **SETTINGS)
    with pytest.raises(Stop):
        fl.run("fedavg", out=tmp_path / "short", progress=False, on_round=stop_after(2), **SETTINGS)
    with pytest.raises(ConfigError, match="stores rounds up to 2; through=4 needs round 4"):
        fl.branch(tmp_path / "short", "ima", out=tmp_path / "b", progress=False, **SETTINGS, **IMA)
