"""Dry runs (``dry_run=True``, ``--dry-run``): the counts of the real job, nothing written, cache hits reported.

Counts are checked against an independent count of the real job: forward calls of an instrumented
module, products of an instrumented curvature operator, optimiser steps of an instrumented SGD.
Times are measured but never asserted (they depend on the machine and its load).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

import fl
import landscape
from fl.algorithms.registry import registry
from landscape import ConfigError, Evaluator, JobEstimate
from landscape.curvature.operators import CurvatureOperator
from landscape.infra.estimate import CacheLookup, Work, combined
from landscape_cli.main import main
from tests.conftest import make_mlp

BATCH = 100  # 300 digits: three batches


class Counted(nn.Module):
    """Counts the forward calls of a wrapped model (one per batch per point in the loop strategy)."""

    calls = 0

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        return self.inner(x)


def counted(seed: int) -> Counted:
    return Counted(make_mlp(seed))


def evaluator(model: nn.Module, data, cache: Path | None = None, **options) -> Evaluator:
    """The loop strategy without the input-layer shortcut: one forward call per batch per point, nothing else."""
    return Evaluator(model, data, batch_size=BATCH, progress=False, cache=cache, strategy="loop", input_shortcut=False,
                     **options)


def snapshot(folder: Path) -> dict[str, float]:
    """Every file under ``folder`` with its modification time (empty when the folder does not exist)."""
    return {str(p): p.stat().st_mtime_ns for p in folder.rglob("*")} if folder.exists() else {}


def forward_calls(job) -> int:
    Counted.calls = 0
    job()
    return Counted.calls


def test_plane_dry_run_counts_the_real_forward_passes_and_writes_nothing(digits, tmp_path):
    a, b, c = counted(0), counted(1), counted(2)
    cache = tmp_path / "cache"
    ev = evaluator(a, digits, cache)
    est = landscape.plane(a, b, c, ev, resolution=4, dry_run=True)
    assert isinstance(est, JobEstimate) and est.job == "plane"
    assert snapshot(tmp_path) == {}  # no cache folder, no entry
    assert est.count("forward pass") == est.todo("forward pass") == 16 * 3
    assert forward_calls(lambda: landscape.plane(a, b, c, ev, resolution=4)) == est.count("forward pass")
    again = landscape.plane(a, b, c, ev, resolution=4, dry_run=True)
    assert [(x.what, x.found, x.total) for x in again.cache] == [("plane points", 16, 16)]
    assert again.todo("forward pass") == 0 and again.seconds == 0.0


def test_recompute_counts_the_batchnorm_batches(digits_images):
    from tests.conftest import make_bn_cnn

    x, y = digits_images
    a, b = Counted(make_bn_cnn(0)), Counted(make_bn_cnn(1))
    ev = evaluator(a, (x, y), bn="recompute", bn_data=(x, y), bn_batches=2)
    est = landscape.interpolate(a, b, ev, alphas=5, dry_run=True)
    calls = forward_calls(lambda: landscape.interpolate(a, b, ev, alphas=5))
    assert est.count("forward pass") == calls == 5 * (2 + 3)  # each point: its training batches, then the data


def test_group_and_path_dry_runs_count_the_real_points(digits, tmp_path):
    models = [counted(s) for s in range(4)]
    ev = evaluator(models[0], digits)
    est = landscape.group_barrier(models, ev, dry_run=True)
    assert est.count("forward pass") == forward_calls(lambda: landscape.group_barrier(models, ev)) == (4 + 1) * 3
    assert est.cache == ()  # no cache to look in
    path = landscape.interpolate(models[0], models[1], ev, alphas=7, dry_run=True)
    assert path.count("forward pass") == forward_calls(lambda: landscape.interpolate(models[0], models[1], ev,
                                                                                     alphas=7)) == 7 * 3


def test_any_point_set_job_can_be_estimated_through_the_stand_in(digits):
    from landscape.evaluation.dry_run import estimate_points

    models = [counted(s) for s in range(3)]
    ev = evaluator(models[0], digits)
    est = estimate_points("barrier_matrix", ev, lambda stand_in: landscape.barrier_matrix(models, stand_in, alphas=4))
    calls = forward_calls(lambda: landscape.barrier_matrix(models, ev, alphas=4))
    assert est.count("forward pass") == calls == 3 * 4 * 3  # three pairs of four alphas, three batches
    assert ev.points_evaluated == 12  # only the real job evaluated points


def counting_matvec(monkeypatch) -> list[int]:
    calls = [0]
    original = CurvatureOperator.matvec

    def matvec(self, v):
        calls[0] += 1
        return original(self, v)

    monkeypatch.setattr(CurvatureOperator, "matvec", matvec)
    return calls


def test_density_dry_run_counts_the_real_products(digits, tmp_path, monkeypatch):
    model = make_mlp(0)
    ev = evaluator(model, digits, tmp_path / "cache")
    est = landscape.hessian_density(model, ev, iterations=12, runs=2, dry_run=True)
    assert snapshot(tmp_path) == {}
    calls = counting_matvec(monkeypatch)
    landscape.hessian_density(model, ev, iterations=12, runs=2)
    assert est.count("Hessian-vector product") == calls[0] == 24
    again = landscape.hessian_density(model, ev, iterations=12, runs=2, dry_run=True)
    assert [(c.what, c.found) for c in again.cache] == [("hessian_density result", 1)]
    assert again.todo("Hessian-vector product") == 0


def test_eigen_dry_run_budget_is_the_products_of_an_unconverged_lanczos(digits, monkeypatch):
    model = make_mlp(0)
    ev = evaluator(model, digits)
    est = landscape.hessian_eigenvalues(model, ev, k=2, tol=0.0, max_iter=15, dry_run=True)
    calls = counting_matvec(monkeypatch)
    with pytest.warns(UserWarning, match="did not reach"):
        landscape.hessian_eigenvalues(model, ev, k=2, tol=0.0, max_iter=15)
    assert est.count("Hessian-vector product") == calls[0] == 15
    assert est.memory["solver vectors"] > 0 and any("budget" in n for n in est.notes)


def test_curve_dry_run_counts_the_real_steps_and_points(digits, monkeypatch):
    a, b = counted(0), counted(1)
    ev = evaluator(a, digits)
    est = landscape.curve(a, b, ev, train_data=digits, epochs=2, batch_size=64, points=5, dry_run=True)
    steps = [0]
    original = torch.optim.SGD.step

    def step(self, *args, **kwargs):
        steps[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.SGD, "step", step)
    calls = forward_calls(lambda: landscape.curve(a, b, ev, train_data=digits, epochs=2, batch_size=64, points=5))
    assert est.count("gradient step") == steps[0] == 2 * 5  # 300 samples in minibatches of 64
    assert est.count("forward pass") == calls - steps[0] == (5 + 5) * 3  # training calls forward once per step


def test_fl_run_dry_run_counts_the_local_steps_and_writes_no_folder(tmp_path, monkeypatch):
    from fl.algorithms import sgd

    out = tmp_path / "run"
    settings = dict(dataset="digits", clients=3, rounds=2, local_epochs=1, participation=0.67, out=out,
                    progress=False)
    est = fl.run("fedavg", dry_run=True, **settings)
    assert not out.exists()
    assert [(c.found, c.total) for c in est.cache] == [(0, 2)]
    steps = [0]
    original = sgd.sgd_step

    def counting(*args, **kwargs):
        steps[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(sgd, "sgd_step", counting)
    fl.run("fedavg", **settings)
    assert est.count("local step") == steps[0] > 0
    assert est.count("forward pass") == 3  # rounds 0, 1, 2 on a test set of one evaluation batch
    done = fl.run("fedavg", dry_run=True, **settings)
    assert [(c.found, c.total) for c in done.cache] == [(2, 2)] and done.todo("local step") == 0


@pytest.mark.parametrize("name", sorted(registry()))
def test_every_algorithm_dry_runs_without_writing(tmp_path, name):
    """The dry run runs the algorithm's round preparation (FedGuCci's anchors, IMA's window...) before timing."""
    out = tmp_path / "run"
    est = fl.run(name, dataset="digits", clients=3, rounds=2, local_epochs=1, out=out, progress=False,
                 dry_run=True)
    assert not out.exists() and not any(tmp_path.iterdir())
    assert [(c.found, c.total) for c in est.cache] == [(0, 2)]
    assert est.todo("local step") > 0 and est.seconds > 0


def test_tracked_run_dry_run_counts_the_tracked_rounds(tmp_path):
    settings = dict(dataset="digits", clients=3, rounds=3, local_epochs=1, out=tmp_path / "run", progress=False,
                    track=fl.Track(every=2, measures=("barriers", "trace"), probes=2, samples=64))
    est = fl.run("fedavg", dry_run=True, **settings)
    assert not (tmp_path / "run").exists()
    run = fl.run("fedavg", **settings)
    tracked = [m["round"] for m in run.metrics if "track_time" in m]
    assert tracked == [0, 2, 3]
    assert est.count("tracked round") == est.todo("tracked round") == len(tracked)
    assert fl.run("fedavg", dry_run=True, **settings).todo("tracked round") == 0


def test_bad_combinations_are_one_line_errors(digits):
    a, b = make_mlp(0), make_mlp(1)
    ev = evaluator(a, digits)
    for call in (lambda: landscape.random_plane(a, ev, span="auto", dry_run=True),
                 lambda: landscape.interpolate(a, b, ev, alphas="adaptive", dry_run=True),
                 lambda: landscape.interpolate(a, b, ev, align="weight", dry_run=True),
                 lambda: landscape.group_barrier([a, b], ev, align="weight", dry_run=True)):
        with pytest.raises(ConfigError, match="dry_run") as info:
            call()
        assert "\n" not in str(info.value)


def test_estimate_arithmetic_and_dict():
    one = JobEstimate("a", (Work("forward pass", 10, 4, 0.5, "5 points x 2 batches"),), {"data": 100},
                      (CacheLookup("a points", 3, 5, "k"),))
    two = JobEstimate("b", (Work("gradient step", 3, 3, 1.0),), {"data": 50, "activations": 20})
    both = combined("a then b", [one, two])
    assert (one.seconds, both.seconds, both.peak_bytes) == (2.0, 5.0, 120)
    assert json.loads(json.dumps(both.to_dict()))["work"][1]["unit"] == "gradient step"
    assert "3 of 5 stored" in str(one) and "10 forward passes" in repr(one)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from fl.models import build_model

    folder = tmp_path_factory.mktemp("ckpt")
    return [str(landscape.save_state_dict(build_model("mlp", num_classes=10, input_shape=(1, 8, 8), seed=s),
                                          folder / f"m{s}.pt")) for s in range(3)]


def test_cli_dry_run_prints_the_estimate_and_writes_nothing(checkpoints, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["--module", "mlp", "--checkpoints", *checkpoints, "--data", "digits", "--out", str(out)]
    assert main(["plane", "--resolution", "3", *args, "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "dry run of plane" in text and "9 forward passes" in text and not out.exists()
    assert main(["hessian", "--max-iter", "5", "--module", "mlp", "--checkpoints", checkpoints[0], "--data", "digits",
                 "--out", str(out), "--dry-run", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["estimates"]["m0 eigen"]["work"][0]["count"] == 5 and not out.exists()


def test_cli_dry_run_bad_combination_is_one_line(checkpoints, tmp_path, capsys):
    code = main(["plane", "--kind", "random", "--span", "auto", "--module", "mlp", "--checkpoints", *checkpoints,
                 "--data", "digits", "--out", str(tmp_path / "out"), "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "span='auto'" in err[0]


def test_fl_run_cli_dry_run(tmp_path, capsys):
    from fl.cli import main as fl_main

    out = tmp_path / "run"
    assert fl_main(["--dataset", "digits", "--rounds", "1", "--clients", "2", "--out", str(out), "--dry-run"]) == 0
    assert "dry run of fl.run" in capsys.readouterr().out and not os.path.exists(out)
