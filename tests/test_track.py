"""Landscape tracking during training (``fl.run(..., track=fl.Track())``, ``Run.track()``).

The recorded measures are the analysis core's own functions applied to the stored checkpoints on
the recorded evaluation set, so they are recomputed here from a finished run's files and must be
equal (the same code path on the same float32 values); the update spread is recomputed
independently in numpy. A resumed run continues tracking without recomputing stored rounds.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import fl
import landscape
from fl.config import config_digest
from fl.datasets import load_dataset
from fl.tracker import update_spread
from fl.tracking import Track, evaluation_indices
from landscape.infra.errors import ConfigError

SETTINGS = dict(dataset="digits", clients=4, rounds=3, local_epochs=1, seed=2, device="cpu", save_clients="all")
TRACK = Track(every=2, samples=96, points=3, iterations=5, probes=3, steps=2)


@pytest.fixture(scope="module")
def tracked(tmp_path_factory) -> fl.Run:
    torch.set_num_threads(1)
    return fl.run("fedavg", out=tmp_path_factory.mktemp("track") / "run", progress=False, track=TRACK, **SETTINGS)


def _evaluator(run: fl.Run) -> landscape.Evaluator:
    bundle = load_dataset("digits")
    idx = torch.as_tensor(run.track().samples)
    return landscape.Evaluator(run.module(), (bundle.train_x[idx], bundle.train_y[idx]), device="cpu",
                               progress=False, strategy="loop")


def test_tracked_rounds_and_the_recorded_evaluation_set(tracked: fl.Run) -> None:
    table = tracked.track()
    assert table["round"].tolist() == [0, 2, 3]  # round 0, multiples of every, the last round
    parts = tracked.store.read_partition()[0]
    assert np.array_equal(table.samples, evaluation_indices(parts, TRACK.samples, TRACK.seed))
    assert len(table.samples) == TRACK.samples and np.unique(table.samples).size == TRACK.samples
    assert np.isnan(table.client_barrier[0]).all() and np.isnan(table["group_barrier"][0])  # no clients at round 0
    assert np.isfinite(table["top_eigenvalue"]).all() and np.isfinite(table["trace"]).all()
    assert tracked.config["track"] == TRACK.to_dict()
    assert "track_time" not in tracked.metrics[1]  # round 1 is not tracked


def test_recorded_measures_equal_those_computed_from_the_checkpoints(tracked: fl.Run) -> None:
    table, ev = tracked.track(), _evaluator(tracked)
    for i, r in enumerate(table["round"]):
        w = tracked.global_state(r)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            top = landscape.hessian_eigenvalues(w, ev, k=1, max_iter=TRACK.iterations, seed=TRACK.seed)[0]
            trace = landscape.hessian_trace(w, ev, method="hutchinson", max_iter=TRACK.probes,
                                            min_samples=TRACK.probes, seed=TRACK.seed)
        sharp = landscape.sharpness(w, ev, rho=TRACK.rho, steps=TRACK.steps, restarts=1, seed=TRACK.seed, bound=False)
        assert table["top_eigenvalue"][i] == float(top)
        assert (table["trace"][i], table["trace_stderr"][i]) == (trace.value, trace.stderr)
        assert table["sharpness"][i] == sharp.value
        if r == 0:
            continue
        clients = tracked.client_states(r)
        for k, state in clients.items():
            path = landscape.interpolate(state, w, ev, alphas=TRACK.points)
            assert table.client_barrier[i, k] == path.loss_barrier
            assert table.client_accuracy_barrier[i, k] == path.accuracy_barrier
        group = landscape.group_barrier(list(clients.values()), ev)
        assert (table["group_barrier"][i], table["group_accuracy_barrier"][i]) == (group.loss_barrier,
                                                                                  group.accuracy_barrier)
        previous = tracked.global_state(r - 1)
        names = [n for n, _ in tracked.module().named_parameters()]
        d = np.stack([np.concatenate([(s[n].double() - previous[n].double()).numpy().ravel() for n in names])
                      for s in clients.values()])
        assert np.isclose(table["update_distance"][i], np.linalg.norm(d - d.mean(0), axis=1).mean(), rtol=1e-12)
        u = d / np.linalg.norm(d, axis=1, keepdims=True)
        cos = (u @ u.T)[np.triu_indices(len(d), 1)]
        assert np.isclose(table["update_cosine"][i], cos.mean(), rtol=1e-12)


def test_update_spread_of_orthogonal_updates() -> None:
    base = {"w": torch.zeros(2)}
    out = update_spread([{"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([0.0, 1.0])}], base, ["w"])
    assert out == pytest.approx({"update_distance": np.sqrt(0.5), "update_cosine": 0.0})
    same = update_spread([{"w": torch.tensor([2.0, 2.0])}, {"w": torch.tensor([1.0, 1.0])}], base, ["w"])
    assert same["update_cosine"] == pytest.approx(1.0) and same["update_distance"] == pytest.approx(np.sqrt(0.5))
    assert update_spread([{"w": torch.ones(2)}], base, ["w"])["update_cosine"] is None  # one client: no pair


def test_table_columns_and_pandas(tracked: fl.Run) -> None:
    table = tracked.track()
    assert len(table) == 3 and table.columns[0] == "round"
    assert np.allclose(table["mean_client_barrier"][1:], np.nanmean(table.client_barrier[1:], axis=1))
    with pytest.raises(KeyError, match="no column 'nope'"):
        table["nope"]
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install pandas"):
            table.to_pandas()
    else:
        frame = table.to_pandas()
        assert list(frame.index) == [0, 2, 3] and np.array_equal(frame["trace"].to_numpy(), table["trace"])


def test_resume_continues_tracking_without_recomputing(tracked: fl.Run, tmp_path: Path) -> None:
    def stop_after_2(r: int, metrics: dict) -> None:
        if r == 2:
            raise KeyboardInterrupt

    out = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        fl.run("fedavg", out=out, progress=False, track=TRACK, on_round=stop_after_2, **SETTINGS)
    before = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    resumed = fl.run("fedavg", out=out, progress=False, track=TRACK, **SETTINGS)
    assert resumed.metrics[:3] == before  # stored tracked rounds kept as they were (their times too)
    a, b = resumed.track(), tracked.track()
    for name in [*a.columns[1:], "client_barrier", "client_accuracy_barrier", "samples"]:
        if name != "time":
            assert np.array_equal(a[name], b[name], equal_nan=True), name


def test_a_changed_track_on_resume_is_refused(tracked: fl.Run) -> None:
    with pytest.raises(ConfigError, match="another configuration.*track") as info:
        fl.run("fedavg", out=tracked.path, progress=False, track=Track(every=3), **SETTINGS)
    assert "\n" not in str(info.value)


def test_track_settings_are_part_of_the_configuration_digest() -> None:
    plain, _ = fl.api.build_config("fedavg", dataset="digits")
    given, _ = fl.api.build_config("fedavg", dataset="digits", track={"every": 10})
    default, _ = fl.api.build_config("fedavg", dataset="digits", track=True)
    assert "track" in plain and plain["track"] is None
    assert config_digest(plain) == config_digest({k: v for k, v in plain.items() if k != "track"})  # old runs keep
    assert given == default and config_digest(given) != config_digest(plain)
    assert config_digest(fl.api.build_config("fedavg", dataset="digits", track=Track(every=3))[0]) != \
        config_digest(given)


@pytest.mark.parametrize(("make", "match"), [
    (lambda: Track(every=0), "every must be >= 1"),
    (lambda: Track(measures=["trase"]), "unknown Track measure 'trase'.*did you mean 'trace'"),
    (lambda: Track(measures=[]), "measures is empty"),
    (lambda: Track(measures=["trace", "trace"]), "names a measure twice"),
    (lambda: Track(rho=float("nan")), "rho must be a finite number"),
    (lambda: fl.api.build_config("fedavg", track={"evry": 2}), "unknown track option 'evry'.*every"),
    (lambda: fl.api.build_config("fedavg", track=5), "track must be an fl.Track"),
    (lambda: fl.api.build_config("fedavg", track="{not json"), "track must be JSON text"),
])
def test_bad_track_arguments_are_one_line_errors(make, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        make()
    assert "\n" not in str(info.value)


def test_an_untracked_run_has_no_table(tmp_path: Path) -> None:
    run = fl.run("fedavg", out=tmp_path / "plain", progress=False, **{**SETTINGS, "rounds": 1})
    with pytest.raises(ConfigError, match="not tracked"):
        run.track()


def test_the_report_of_a_tracked_run_shows_the_tracking(tracked: fl.Run, tmp_path: Path, capsys) -> None:
    from landscape_cli.main import main

    code = main(["report", "--run", str(tracked.path), "--out", str(tmp_path / "report"), "--resolution", "3",
                 "--alphas", "3", "--models", "client:0", "client:1", "global"])
    capsys.readouterr()
    page = (tmp_path / "report" / "index.html").read_text()
    assert code == 0 and "Landscape during training" in page and "Measured at rounds 0, 2, 3" in page
