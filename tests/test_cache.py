"""HDF5 cache: resume after SIGKILL, no recomputation, concurrent writers, corrupt files,
result round trips, key stability."""
from __future__ import annotations

import dataclasses
import fcntl
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import landscape.results.curvature  # noqa: F401  (registers the curvature result types)
import landscape.geometry.groups  # noqa: F401  (registers GroupSizeResult)
from conftest import make_mlp
from landscape import Cache, CacheError, Evaluator, interpolate
from landscape.cache.store import make_key
from landscape.results.base import RESULT_TYPES

TESTS = Path(__file__).parent
N_POINTS = 9

WORKER = """
import os, signal, sys, time
sys.path.insert(0, {tests!r})
import torch
from conftest import make_mlp
from landscape import Cache, Evaluator, interpolate

data = torch.load({data!r}, weights_only=True)
kill_after = int(sys.argv[1])  # points to compute before SIGKILL (-1: never)
pairs = sys.argv[2:]
ev = Evaluator(make_mlp(0), (data["x"], data["y"]), device="cpu", strategy="loop", chunk_size=1,
               cache=Cache({cache!r}, flush_interval=0.0))
loop = ev._sums_loop
calls = 0

def count(vecs, coeffs):
    global calls
    calls += 1  # one point per chunk: call k evaluates point k
    if kill_after >= 0 and calls == kill_after + 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return loop(vecs, coeffs)

ev._sums_loop = count
barrier = os.environ.get("BARRIER")  # start computing together with the other workers
if barrier:
    open(os.path.join(barrier, str(os.getpid())), "w").close()
    while len(os.listdir(barrier)) < int(os.environ["WORKERS"]):
        time.sleep(0.01)
for pair in pairs:
    a, b = pair.split(",")
    interpolate(a, b, ev, alphas={n})
"""


@pytest.fixture
def setup(tmp_path, digits):
    x, y = digits
    torch.save({"x": x[:80], "y": y[:80]}, tmp_path / "data.pt")
    paths = []
    for seed in (1, 2, 3):
        path = tmp_path / f"m{seed}.pt"
        torch.save(make_mlp(seed).state_dict(), path)
        paths.append(str(path))
    cache = tmp_path / "cache.h5"
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(TESTS), data=str(tmp_path / "data.pt"), cache=str(cache), n=N_POINTS))
    return {"x": x[:80], "y": y[:80], "models": paths, "cache": cache, "script": script}


def _worker(setup, kill_after: int, *pairs: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(setup["script"]), str(kill_after), *pairs],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def _reference(setup, a: str, b: str) -> np.ndarray:
    return interpolate(a, b, Evaluator(make_mlp(0), (setup["x"], setup["y"])), alphas=N_POINTS).loss


def test_killed_run_resumes_with_only_the_missing_points(setup):
    a, b = setup["models"][:2]
    proc = _worker(setup, 4, f"{a},{b}")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -9, err  # killed by SIGKILL while computing point 5
    ev = Evaluator(make_mlp(0), (setup["x"], setup["y"]), cache=setup["cache"])
    path = interpolate(a, b, ev, alphas=N_POINTS)
    assert ev.points_evaluated == N_POINTS - 4
    np.testing.assert_allclose(path.loss, _reference(setup, a, b), rtol=0, atol=1e-6)
    again = interpolate(a, b, ev, alphas=N_POINTS)  # a repeated call computes nothing
    assert ev.points_evaluated == N_POINTS - 4
    np.testing.assert_array_equal(again.loss, path.loss)
    np.testing.assert_array_equal(again.accuracy, path.accuracy)
    fresh = Evaluator(make_mlp(0), (setup["x"], setup["y"]), cache=str(setup["cache"]))
    interpolate(a, b, fresh, alphas=N_POINTS)
    assert fresh.points_evaluated == 0
    # anything that changes the numbers changes the key: other data, other BN mode or loss
    for ev2 in (Evaluator(make_mlp(0), (setup["x"][:70], setup["y"][:70]), cache=setup["cache"]),
                Evaluator(make_mlp(0), (setup["x"], setup["y"]), loss="mse", cache=setup["cache"])):
        interpolate(a, b, ev2, alphas=N_POINTS)
        assert ev2.points_evaluated == N_POINTS
    interpolate(b, a, fresh, alphas=N_POINTS)
    assert fresh.points_evaluated == N_POINTS
    assert not list(setup["cache"].parent.glob(".cache.h5.tmp-*"))  # no temporary file left


def test_concurrent_writers_leave_a_correct_readable_file(setup):
    m1, m2, m3 = setup["models"]
    barrier = setup["cache"].parent / "barrier"
    barrier.mkdir()
    env = {"BARRIER": str(barrier), "WORKERS": "2"}
    procs = [_worker(setup, -1, f"{m1},{m2}", f"{m1},{m3}", env=env),
             _worker(setup, -1, f"{m1},{m2}", f"{m2},{m3}", env=env)]
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
    ev = Evaluator(make_mlp(0), (setup["x"], setup["y"]), cache=setup["cache"])
    for a, b in ((m1, m2), (m1, m3), (m2, m3)):
        path = interpolate(a, b, ev, alphas=N_POINTS)
        np.testing.assert_allclose(path.loss, _reference(setup, a, b), rtol=0, atol=1e-6)
    assert ev.points_evaluated == 0
    assert len(Cache(setup["cache"]).keys()["points"]) == 3


def test_a_held_lock_makes_a_second_writer_fail_clearly(tmp_path):
    cache = Cache(tmp_path / "c.h5", lock_timeout=0.3)
    fd = os.open(tmp_path / "c.h5.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(CacheError, match="another process"):
            cache.add_points("k", 3, np.array([0]), np.array([1.0]), np.array([0.5]), force=True)
    finally:
        os.close(fd)
    cache.flush()  # the queued point was kept and is written once the lock is free
    loss, acc, done = Cache(tmp_path / "c.h5").points("k", 3)
    assert done.tolist() == [True, False, False] and loss[0] == 1.0 and acc[0] == 0.5


@pytest.mark.parametrize("content", [b"not an hdf5 file at all" * 10, b"\x89HDF\r\n\x1a\n" + b"\x00" * 50])
def test_corrupt_cache_file_gives_cache_error_naming_it(tmp_path, digits, content):
    path = tmp_path / "broken.h5"
    path.write_bytes(content)
    with pytest.raises(CacheError, match="broken.h5") as info:
        Cache(path)
    assert str(path) in str(info.value) and "Move it away" in str(info.value)
    x, y = digits
    with pytest.raises(CacheError, match="broken.h5"):
        Evaluator(make_mlp(0), (x, y), cache=path)


def test_truncated_cache_file_gives_cache_error(tmp_path):
    path = tmp_path / "c.h5"
    cache = Cache(path)
    cache.add_points("k", 4, np.arange(4), np.ones(4), np.ones(4), force=True)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CacheError, match="c.h5"):
        Cache(path).points("k", 4)


def _example(cls: type, seed: int):
    """An instance of a registered result class with every field filled (arrays with a NaN)."""
    rng = np.random.default_rng(seed)
    values = {"float": float(rng.normal()), "int": int(rng.integers(1, 100)), "bool": bool(seed % 2),
              "str": f"method-{seed}", "list": ["a", f"b{seed}"], "dict": {"m": [0.5, float(seed)], "inf": np.inf}}
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name == "spec":
            continue
        if f.name in cls.array_fields:
            arr = rng.normal(size=(3, 2))
            arr[0, 1] = np.nan
            kwargs[f.name] = arr
        else:
            kwargs[f.name] = values.get(str(f.type), values["dict"])  # Mapping, dict
    return cls(**kwargs, spec={"kind": cls.__name__, "seed": seed, "grid": [1, 2], "nested": {"nan": np.nan}})


def test_every_result_class_round_trips(tmp_path):
    cache = Cache(tmp_path / "results.h5")
    assert {"Metrics", "PathResult", "GroupResult", "BarrierMatrix", "PlaneResult", "GroupSizeResult"} <= set(RESULT_TYPES)
    for name, cls in RESULT_TYPES.items():
        result = _example(cls, 3)
        cache.save_result(f"key-{name}", result)
        back = Cache(tmp_path / "results.h5").load_result(f"key-{name}")
        assert type(back) is cls and back == result, name
        assert back != _example(cls, 4), name  # equality really compares the content
    assert Cache(tmp_path / "results.h5").load_result("absent") is None
    cache.save_result("key-Metrics", _example(RESULT_TYPES["Metrics"], 5))  # replaced, not duplicated
    assert cache.load_result("key-Metrics") == _example(RESULT_TYPES["Metrics"], 5)


def test_real_results_round_trip(tmp_path, digits):
    from landscape import group_barrier, plane

    x, y = digits
    ev = Evaluator(make_mlp(0, hidden=4), (x[:50], y[:50]))
    models = [make_mlp(s, hidden=4) for s in (1, 2, 3)]
    cache = Cache(tmp_path / "r.h5")
    for i, result in enumerate([interpolate(models[0], models[1], ev, alphas=3), group_barrier(models, ev),
                                plane(*models, ev, resolution=3)]):
        cache.save_result(str(i), result)
        back = cache.load_result(str(i))
        assert back == result
        if hasattr(result, "loss_barrier"):
            assert back.loss_barrier == result.loss_barrier
    back_plane = cache.load_result("2")
    np.testing.assert_allclose(back_plane.coordinates(models[2]), back_plane.models["c"], atol=1e-9)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5)
                           | st.floats(allow_nan=False),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                           max_leaves=8)


@settings(max_examples=50, deadline=None)
@given(spec=st.dictionaries(st.text(max_size=6), json_values, min_size=1, max_size=6), seed=st.randoms())
def test_cache_key_is_stable_and_independent_of_dict_order(spec, seed):
    items = list(spec.items())
    seed.shuffle(items)
    assert make_key(spec) == make_key(dict(items)) == make_key(dict(spec))
    changed = dict(spec, __extra__=1)
    assert make_key(changed) != make_key(spec)


def test_scattered_cached_points_are_read_and_only_the_gaps_computed(tmp_path, digits):
    from landscape.space.points import PointSet

    x, y = digits
    cache = Cache(tmp_path / "c.h5", flush_interval=0.0)
    ev = Evaluator(make_mlp(0), (x[:60], y[:60]), cache=cache, chunk_size=2)
    va, vb = ev.vector(make_mlp(1)), ev.vector(make_mlp(2))
    alphas = torch.linspace(0, 1, 8, dtype=torch.float64)
    key = ev.points_key(PointSet.line(va, vb, alphas), va)
    planted = np.array([1, 2, 5])
    cache.add_points(key, 8, planted, np.full(3, -7.0), np.full(3, 0.25), force=True)
    path = interpolate(make_mlp(1), make_mlp(2), ev, alphas=alphas.numpy())
    assert ev.points_evaluated == 5
    np.testing.assert_array_equal(path.loss[planted], -7.0)  # read from the cache, not recomputed
    reference = interpolate(make_mlp(1), make_mlp(2), Evaluator(make_mlp(0), (x[:60], y[:60])), alphas=8)
    gaps = np.setdiff1d(np.arange(8), planted)
    np.testing.assert_allclose(path.loss[gaps], reference.loss[gaps], atol=1e-6)
    loss, _, done = cache.points(key, 8)
    assert done.all() and np.array_equal(loss, path.loss)
