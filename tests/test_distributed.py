"""Sharding layer: every back end gives the single-process numbers.

Failed shards are retried, only the calling process writes the cache, FL client updates run
through Ray unchanged.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from landscape import Cache, Evaluator, interpolate, plane
from landscape.evaluation.sharded import (
    EvaluatorSpec,
    evaluate_points_distributed,
    evaluate_shard,
    map_models,
    shard_ranges,
)
from landscape.infra.errors import ConfigError
from landscape.infra.parallel import Backend, ShardError, iter_shards, map_calls, run_shards, to_device, worker_device

from conftest import make_bn_cnn, make_mlp

#: Workers run at this process's intra-op thread count (conftest pins 1): the CPU's matrix
#: kernels may block their sums differently for another thread count, and the claim tested
#: here is that a shard computes every point exactly as the single process does.
PINNED_THREADS: dict = {"options": {"inner_max_num_threads": 1}}


# ---------------------------------------------------------------- worker functions
def _square(x: int) -> int:
    return x * x


def _device_and_pid(_: int) -> tuple[str, int]:
    time.sleep(0.3)  # long enough for both workers of the pool to take tasks
    return worker_device("none"), os.getpid()


def _fail_once(marker: str, how: str, shard):
    """``evaluate_shard`` that fails the first time it is called (across processes)."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return evaluate_shard(shard)
    os.close(fd)
    if how == "die":
        os._exit(3)  # the worker process dies
    raise RuntimeError("injected failure")


def _fail_at(bad_start: int, shard):
    if shard.start == bad_start:
        raise RuntimeError(f"shard starting at {bad_start} always fails")
    return evaluate_shard(shard)


# ------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def setup(digits, trained_mlps):
    """Three trained MLPs and the single-process plane through them (7x7 grid)."""
    x, y = digits
    ev = Evaluator(make_mlp(), (x, y), batch_size=128, progress=False)
    reference = plane(*trained_mlps, ev, resolution=7)
    return x, y, trained_mlps, reference


def _distributed_evaluator(x, y, backend, **options) -> Evaluator:
    """An Evaluator whose ``evaluate_points`` goes through the sharding layer."""
    cache = options.pop("cache", None)
    ev = Evaluator(make_mlp(), (x, y), batch_size=128, progress=False, cache=cache)
    ev.evaluate_points = functools.partial(evaluate_points_distributed, ev, backend=backend, **options)
    return ev


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'landscape-fl[ray]')")
    tests_dir = str(Path(__file__).parent)  # workers import this module's helper functions
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "PYTHONPATH": tests_dir}})
    yield ray
    ray.shutdown()


# ---------------------------------------------------------------------------- units
def test_shard_ranges_cover_missing_points_in_consecutive_runs():
    todo = np.array([0, 1, 2, 3, 4, 7, 8, 11])
    assert shard_ranges(todo, 2) == [(0, 2), (2, 4), (4, 5), (7, 9), (11, 12)]
    assert shard_ranges(todo, 100) == [(0, 5), (7, 9), (11, 12)]


def test_backend_rejects_bad_settings_and_maps_aliases():
    assert Backend("processes").joblib_name == "loky"
    assert Backend("local", n_jobs=4).workers == 1
    for bad in ({"n_jobs": 0}, {"retries": -1}, {"devices": ()}):
        with pytest.raises(ConfigError):
            Backend("loky", **bad)


def test_to_device_moves_nested_tensors_and_copies_modules():
    @dataclasses.dataclass
    class Box:
        state: dict
        module: nn.Module
        where: torch.device
        gen: torch.Generator

    gen = torch.Generator()
    box = Box({"w": torch.ones(2, dtype=torch.float64)}, nn.Linear(2, 2), torch.device("cpu"), gen)
    moved = to_device(box, "meta")
    assert moved.state["w"].device.type == "meta" and moved.where == torch.device("meta")
    assert moved.module.weight.device.type == "meta" and box.module.weight.device.type == "cpu"
    assert moved.gen is gen


def test_run_shards_returns_results_in_payload_order_on_every_pool():
    payloads = list(range(7))
    for backend in ("local", "loky", "threading"):
        assert run_shards(_square, payloads, backend, n_jobs=2) == [p * p for p in payloads]
    assert sorted(iter_shards(_square, payloads, "loky", n_jobs=2)) == [(p, p * p) for p in payloads]


def test_each_worker_process_claims_its_own_device():
    results = run_shards(_device_and_pid, range(6), "loky", n_jobs=2, devices=("dev-a", "dev-b"))
    by_pid: dict[int, set[str]] = {}
    for device, pid in results:
        by_pid.setdefault(pid, set()).add(device)
    assert all(len(devs) == 1 for devs in by_pid.values())  # a worker keeps its device
    claimed = [devs.pop() for devs in by_pid.values()]
    assert len(set(claimed)) == len(claimed) and set(claimed) <= {"dev-a", "dev-b"}


def test_spec_rebuilds_an_equal_evaluator_without_cache(digits_images, tmp_path):
    x, y = digits_images
    ev = Evaluator(make_bn_cnn(), (x, y), batch_size=100, bn="recompute", bn_batches=2,
                   cache=tmp_path / "c.h5", progress=False)
    rebuilt = EvaluatorSpec.from_evaluator(ev).build("cpu")
    assert rebuilt.cache is None
    assert rebuilt.fingerprint() == ev.fingerprint()
    models = [make_bn_cnn(1), make_bn_cnn(2)]
    np.testing.assert_array_equal(rebuilt.evaluate(models).loss, ev.evaluate(models).loss)


# ------------------------------------------------------------ planes on every backend
@pytest.mark.parametrize("backend", ["local", "loky"])
def test_plane_on_backend_equals_single_process(setup, backend):
    x, y, models, reference = setup
    ev = _distributed_evaluator(x, y, backend, n_jobs=2, **(PINNED_THREADS if backend == "loky" else {}))
    result = plane(*models, ev, resolution=7)
    np.testing.assert_array_equal(result.loss, reference.loss)
    np.testing.assert_array_equal(result.accuracy, reference.accuracy)
    assert ev.points_evaluated == 49


def test_bn_keep_path_through_processes_uses_the_reference_buffers(digits_images):
    x, y = digits_images
    a, b = make_bn_cnn(1), make_bn_cnn(2)
    single = interpolate(a, b, Evaluator(make_bn_cnn(), (x, y), bn="keep", progress=False), alphas=6)
    ev = Evaluator(make_bn_cnn(), (x, y), bn="keep", progress=False,
                   backend=Backend("loky", n_jobs=2, **PINNED_THREADS))  # the public option
    np.testing.assert_array_equal(interpolate(a, b, ev, alphas=6).loss, single.loss)


@pytest.mark.parametrize("how", ["raise", "die"])
def test_a_shard_that_fails_once_is_retried_with_identical_results(setup, tmp_path, monkeypatch, how):
    import landscape.evaluation.sharded as distributed

    x, y, models, reference = setup
    monkeypatch.setattr(distributed, "evaluate_shard",
                        functools.partial(_fail_once, str(tmp_path / "failed"), how))
    ev = _distributed_evaluator(x, y, "loky", n_jobs=2, retries=1, **PINNED_THREADS)
    result = plane(*models, ev, resolution=7)
    assert (tmp_path / "failed").exists()  # the failure did happen
    np.testing.assert_array_equal(result.loss, reference.loss)
    assert ev.points_evaluated == 49  # retried shards are not counted twice


def test_cache_is_written_by_the_caller_and_resumes_after_a_failed_shard(setup, tmp_path, monkeypatch):
    import landscape.evaluation.sharded as distributed

    x, y, models, reference = setup
    path = tmp_path / "cache.h5"
    monkeypatch.setattr(distributed, "evaluate_shard", functools.partial(_fail_at, 8))
    ev = _distributed_evaluator(x, y, "local", cache=path, retries=0, shard_size=8)
    with pytest.raises(ShardError, match="shard 1 of 7 failed 1 time"):
        plane(*models, ev, resolution=7)
    (key,) = Cache(path).keys()["points"]
    loss, _, done = Cache(path).points(key, 49)
    assert done.sum() == 41 and not done[8:16].any()  # every other shard was stored
    np.testing.assert_array_equal(loss[done], reference.loss.ravel()[done])

    monkeypatch.undo()
    ev = _distributed_evaluator(x, y, "loky", n_jobs=2, cache=path, **PINNED_THREADS)
    result = plane(*models, ev, resolution=7)
    assert ev.points_evaluated == 8  # only the missing shard was computed
    np.testing.assert_array_equal(result.loss, reference.loss)
    loss, _, done = Cache(path).points(key, 49)
    assert done.all()
    np.testing.assert_array_equal(loss, reference.loss.ravel())
    assert not [p for p in path.rglob("*") if ".tmp-" in p.name]  # no writer left anything behind


def test_a_shard_failing_every_time_raises_with_the_cause(setup, monkeypatch):
    import landscape.evaluation.sharded as distributed

    x, y, models, _ = setup
    monkeypatch.setattr(distributed, "evaluate_shard", functools.partial(_fail_at, 0))
    ev = _distributed_evaluator(x, y, "local", retries=2, shard_size=10)
    with pytest.raises(ShardError, match="failed 3 time.*always fails"):
        plane(*models, ev, resolution=7)


def test_curvature_at_several_models_in_worker_processes_equals_sequential(setup):
    from landscape.curvature.functions import hessian_eigenvalues

    x, y, models, _ = setup
    ev = Evaluator(make_mlp(), (x, y), batch_size=128, progress=False)
    sequential = [hessian_eigenvalues(m, ev, k=2, seed=3) for m in models]
    parallel = map_models(hessian_eigenvalues, models, ev, kwargs={"k": 2, "seed": 3}, backend="loky", n_jobs=2)
    np.testing.assert_allclose(np.stack(parallel), np.stack(sequential), rtol=1e-5)
    assert sequential[0][0] >= sequential[0][1] > 0  # top two of a trained model's Hessian


# ------------------------------------------------------------------------------ Ray
def test_plane_through_ray_equals_single_process(setup, ray_cluster):
    x, y, models, reference = setup
    ev = _distributed_evaluator(x, y, "ray", n_jobs=2)
    result = plane(*models, ev, resolution=7)
    np.testing.assert_array_equal(result.loss, reference.loss)
    np.testing.assert_array_equal(result.accuracy, reference.accuracy)


def test_a_ray_worker_that_dies_is_replaced_and_its_shard_retried(setup, ray_cluster, tmp_path, monkeypatch):
    import landscape.evaluation.sharded as distributed

    x, y, models, reference = setup
    monkeypatch.setattr(distributed, "evaluate_shard", functools.partial(_fail_once, str(tmp_path / "died"), "die"))
    ev = _distributed_evaluator(x, y, "ray", n_jobs=2, retries=1)
    result = plane(*models, ev, resolution=7)
    assert (tmp_path / "died").exists()
    np.testing.assert_array_equal(result.loss, reference.loss)
    assert ev.points_evaluated == 49


def test_fl_round_client_updates_through_ray_equal_the_sequential_round(tmp_path, ray_cluster, monkeypatch):
    import fl
    from fl.algorithms.base import Algorithm, weighted_average

    calls: list = []
    original = Algorithm.client_update

    def fresh(ctx):
        """The context with its own copy of the generator (training advances a generator)."""
        gen = torch.Generator()
        gen.set_state(ctx.generator.get_state())
        return dataclasses.replace(ctx, generator=gen)

    def recording(self, ctx):
        calls.append((self, fresh(ctx)))
        return original(self, ctx)

    monkeypatch.setattr(Algorithm, "client_update", recording)
    run = fl.run("fedavg", clients=3, rounds=1, local_epochs=1, batch_size=64, out=tmp_path / "run",
                 device="cpu", progress=False)
    monkeypatch.undo()
    assert len(calls) == 3
    alg = calls[0][0]
    stored = run.client_states(1)
    for backend, devices in (("ray", None), ("local", ("cpu",))):  # devices: contexts relocated
        updates = map_calls(alg.client_update, [(fresh(ctx),) for _, ctx in calls], backend, n_jobs=2,
                            devices=devices)
        for (_, ctx), update in zip(calls, updates):
            for name, tensor in stored[ctx.client].items():
                torch.testing.assert_close(update.state[name], tensor, rtol=0, atol=1e-5)
        fused = weighted_average([u.state for u in updates], [u.num_samples for u in updates])
        for name, tensor in run.global_state(1).items():
            torch.testing.assert_close(fused[name], tensor, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------- Dask
def test_path_through_the_current_dask_client_equals_single_process(digits, trained_mlps):
    distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed")
    x, y = digits
    single = interpolate(trained_mlps[0], trained_mlps[1],
                         Evaluator(make_mlp(), (x, y), progress=False), alphas=5)
    # in-process workers keep the test fast; a process cluster is reached the same way
    with distributed.Client(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None):
        ev = _distributed_evaluator(x, y, "dask", n_jobs=2)
        result = interpolate(trained_mlps[0], trained_mlps[1], ev, alphas=5)
    np.testing.assert_array_equal(result.loss, single.loss)


@pytest.mark.parametrize("backend", ["loky", "ray"])
def test_fl_run_on_a_parallel_backend_equals_the_sequential_run(tmp_path, backend, request):
    if backend == "ray":
        request.getfixturevalue("ray_cluster")
    import fl

    options = dict(rounds=2, clients=3, seed=5, progress=False, momentum=0.9)
    seq = fl.run("fedavg", out=tmp_path / "seq", **options)
    par = fl.run("fedavg", out=tmp_path / backend, backend=backend, n_jobs=2, **options)
    for r in (1, 2):
        a, b = seq.global_state(r), par.global_state(r)
        assert set(a) == set(b)
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-5)
    assert [m["test_accuracy"] for m in seq.metrics] == pytest.approx([m["test_accuracy"] for m in par.metrics],
                                                                       abs=1e-6)


def test_unknown_back_end_names_are_refused_before_any_work():
    from landscape import ConfigError, Evaluator

    with pytest.raises(ConfigError, match="unknown back end 'bogus'.*loky"):
        Backend(name="bogus")
    with pytest.raises(ConfigError, match="unknown back end 'bogus'"):
        Evaluator(torch.nn.Linear(2, 2), (torch.zeros(3, 2), torch.zeros(3, dtype=torch.long)), backend="bogus")
