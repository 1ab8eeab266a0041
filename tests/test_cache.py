"""HDF5 cache: resume after SIGKILL, no recomputation, concurrent writers, corrupt files.

Also result round trips, key stability, one file per entry (cost independent of the
number of entries), links never followed, format-1 files read and upgraded.
"""
from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import landscape.geometry.groups  # noqa: F401  (registers GroupSizeResult)
import landscape.results.curvature  # noqa: F401  (registers the curvature result types)
from landscape import Cache, CacheError, Evaluator, FileWriteError, interpolate
from landscape.cache.store import make_key
from landscape.results.base import RESULT_TYPES

from conftest import FLOAT64_UNIT_ROUNDOFF, float32_tolerance, make_mlp

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
loop = ev.loop.sums
calls = 0

def count(vecs, coeffs, index=None):
    global calls
    calls += 1  # one point per chunk: call k evaluates point k
    if kill_after >= 0 and calls == kill_after + 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return loop(vecs, coeffs, index)

ev.loop.sums = count
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
    cache = tmp_path / "cache"
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
    np.testing.assert_array_equal(path.loss, _reference(setup, a, b))  # resumed: the uninterrupted code path
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
    assert [p for p in setup["cache"].iterdir() if ".tmp-" in p.name] == []  # no temporary file left


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
        np.testing.assert_array_equal(path.loss, _reference(setup, a, b))  # the same code path, read back
    assert ev.points_evaluated == 0
    assert len(Cache(setup["cache"]).keys()["points"]) == 3


def test_a_held_lock_makes_a_second_writer_fail_clearly(tmp_path):
    cache = Cache(tmp_path / "c", lock_timeout=0.3)
    cache.path.mkdir()
    fd = os.open(cache.lock_path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(CacheError, match="another process"):
            cache.add_points("k", 3, np.array([0]), np.array([1.0]), np.array([0.5]), force=True)
    finally:
        os.close(fd)
    cache.flush()  # the queued point was kept and is written once the lock is free
    loss, acc, done = Cache(tmp_path / "c").points("k", 3)
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


def test_truncated_or_flipped_entry_gives_cache_error_naming_it(tmp_path):
    cache = Cache(tmp_path / "c")
    cache.add_points("k", 4, np.arange(4), np.ones(4), np.ones(4), force=True)
    entry = tmp_path / "c" / "points-k.h5"
    data = entry.read_bytes()
    entry.write_bytes(data[: len(data) // 2])
    with pytest.raises(CacheError, match=str(entry)):
        Cache(tmp_path / "c").points("k", 4)
    flipped = bytearray(data)
    flipped[-100] ^= 4
    entry.write_bytes(bytes(flipped))
    with pytest.raises(CacheError, match="does not match the SHA-256"):
        Cache(tmp_path / "c").points("k", 4)
    with pytest.raises(CacheError, match="does not match the SHA-256"):  # and is never silently overwritten
        cache.add_points("k", 4, np.arange(1), np.ones(1), np.ones(1), force=True)


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
    cache = Cache(tmp_path / "results")
    expected = {"Metrics", "PathResult", "GroupResult", "BarrierMatrix", "PlaneResult", "GroupSizeResult"}
    assert expected <= set(RESULT_TYPES)
    for name, cls in RESULT_TYPES.entries().items():
        result = _example(cls, 3)
        cache.save_result(f"key-{name}", result)
        back = Cache(tmp_path / "results").load_result(f"key-{name}")
        assert type(back) is cls and back == result, name
        assert back != _example(cls, 4), name  # equality really compares the content
    assert Cache(tmp_path / "results").load_result("absent") is None
    cache.save_result("key-Metrics", _example(RESULT_TYPES.get("Metrics"), 5))  # replaced, not duplicated
    assert cache.load_result("key-Metrics") == _example(RESULT_TYPES.get("Metrics"), 5)


def test_real_results_round_trip(tmp_path, digits):
    from landscape import group_barrier, plane

    x, y = digits
    ev = Evaluator(make_mlp(0, hidden=4), (x[:50], y[:50]))
    models = [make_mlp(s, hidden=4) for s in (1, 2, 3)]
    cache = Cache(tmp_path / "r")
    for i, result in enumerate([interpolate(models[0], models[1], ev, alphas=3), group_barrier(models, ev),
                                plane(*models, ev, resolution=3)]):
        cache.save_result(str(i), result)
        back = cache.load_result(str(i))
        assert back == result
        if hasattr(result, "loss_barrier"):
            assert back.loss_barrier == result.loss_barrier
    back_plane = cache.load_result("2")
    coords = back_plane.models["c"]
    # float64 dot products over the 310 parameters, in another order than when the plane was built
    tol = float32_tolerance(310, unit=FLOAT64_UNIT_ROUNDOFF)
    np.testing.assert_allclose(back_plane.coordinates(models[2]), coords, rtol=tol, atol=tol * np.abs(coords).max())


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5)
                           | st.floats(allow_nan=False),
                           lambda inner: (st.lists(inner, max_size=3)
                                          | st.dictionaries(st.text(max_size=4), inner, max_size=3)),
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
    cache = Cache(tmp_path / "c", flush_interval=0.0)
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
    np.testing.assert_array_equal(path.loss[gaps], reference.loss[gaps])  # the gaps take the whole set's code path
    loss, _, done = cache.points(key, 8)
    assert done.all() and np.array_equal(loss, path.loss)


# ------------------------------------------------------------------ one file per entry
def _plane_result(seed: int, size: int = 5):
    from landscape.results import PlaneResult

    rng = np.random.default_rng(seed)
    grid = np.linspace(-1, 1, size)
    return PlaneResult(x=grid, y=grid, loss=rng.random((size, size)), accuracy=rng.random((size, size)),
                       origin=rng.normal(size=6), u=rng.normal(size=6), v=rng.normal(size=6),
                       param_mask=np.ones(6, bool), models={"a": [0.0, 1.0]}, spec={"seed": seed})


def test_each_entry_is_read_and_written_without_touching_the_others(tmp_path):
    """Reads and writes of one entry never open another.

    With every other entry file destroyed, entry 0 still reads, updates and is replaced (the
    format-1 file re-hashed all of them).
    """
    cache = Cache(tmp_path / "c", flush_interval=0.0)
    for i in range(12):
        cache.save_result(f"r{i}", _plane_result(i))
        cache.add_points(f"p{i}", 5, np.arange(2), np.full(2, float(i)), np.full(2, 0.5))
    for path in (tmp_path / "c").glob("*.h5"):
        if path.name not in ("result-r0.h5", "points-p0.h5"):
            path.write_bytes(b"destroyed")
    again = Cache(tmp_path / "c", flush_interval=0.0)
    assert again.load_result("r0") == _plane_result(0)
    again.add_points("p0", 5, np.array([4]), np.array([7.0]), np.array([0.25]))
    loss, acc, done = Cache(tmp_path / "c").points("p0", 5)
    assert done.tolist() == [True, True, False, False, True] and loss[4] == 7.0 and acc[4] == 0.25
    again.save_result("r0", _plane_result(100))
    assert Cache(tmp_path / "c").load_result("r0") == _plane_result(100)
    assert len(again.keys()["results"]) == 12 and len(again.keys()["points"]) == 12
    with pytest.raises(CacheError, match="result-r3.h5"):
        again.load_result("r3")


@pytest.mark.parametrize("key", ["a/b", ".", "..", "spaces and ünïcödé", "%2F", "x" * 40, "-", "points-k.h5"])
def test_any_key_maps_to_one_file_in_the_folder(tmp_path, key):
    cache = Cache(tmp_path / "c")
    cache.add_points(key, 3, np.array([1]), np.array([2.0]), np.array([0.5]), force=True)
    cache.save_result(key, _plane_result(1))
    assert sorted(p.name for p in (tmp_path / "c").iterdir() if p.suffix == ".h5") == sorted(
        f"{kind}-{quote(key, safe='')}.h5" for kind in ("points", "result"))
    assert Cache(tmp_path / "c").keys() == {"points": [key], "results": [key]}
    assert Cache(tmp_path / "c").points(key, 3)[0][1] == 2.0
    assert Cache(tmp_path / "c").load_result(key) == _plane_result(1)
    assert not list(tmp_path.glob("*.h5"))  # nothing outside the folder


def test_an_entry_renamed_by_hand_is_not_read_as_another_key(tmp_path):
    cache = Cache(tmp_path / "c")
    cache.save_result("a", _plane_result(1))
    (tmp_path / "c" / "result-a.h5").rename(tmp_path / "c" / "result-b.h5")
    with pytest.raises(CacheError, match="holds entry result/a, not result/b"):
        cache.load_result("b")


def test_a_folder_that_is_not_a_cache_is_refused(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("mine")
    with pytest.raises(CacheError, match="not a landscape cache"):
        Cache(tmp_path / "docs")
    (tmp_path / "empty").mkdir()
    Cache(tmp_path / "empty").save_result("r", _plane_result(2))  # an empty folder becomes a cache
    assert Cache(tmp_path / "empty").load_result("r") == _plane_result(2)


def test_links_in_the_cache_folder_are_never_written_through(tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"keep me")
    cache = Cache(tmp_path / "c")
    cache.save_result("r", _plane_result(1))
    (tmp_path / "c" / "result-s.h5").symlink_to(outside)
    with pytest.raises(FileWriteError, match="result-s.h5: is a symbolic link"):
        cache.save_result("s", _plane_result(2))
    (tmp_path / "c" / ".lock").unlink()
    (tmp_path / "c" / ".lock").symlink_to(outside)
    with pytest.raises(FileWriteError, match=r"\.lock: is a symbolic link"):
        Cache(tmp_path / "c").save_result("r", _plane_result(3))
    (tmp_path / "linked").symlink_to(tmp_path / "c")  # a cache folder that is a link: read, never written
    assert Cache(tmp_path / "linked").load_result("r") == _plane_result(1)
    with pytest.raises(FileWriteError, match="linked: is a symbolic link"):
        Cache(tmp_path / "linked").save_result("t", _plane_result(4))
    assert outside.read_bytes() == b"keep me"


def test_a_full_disk_leaves_no_temporary_file_and_a_later_write_works(tmp_path, monkeypatch):
    """Once: an uncaught h5py error, then a segmentation fault on the next run, and temporary files filling the disk.

    Now: one clear error, nothing left, the next write works.
    """
    cache = Cache(tmp_path / "c", flush_interval=0.0)
    cache.add_points("k", 4, np.arange(2), np.ones(2), np.ones(2))
    before = (tmp_path / "c" / "points-k.h5").read_bytes()
    real_write = os.write

    def full(fd: int, data) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    for _ in range(2):  # a second attempt fails as cleanly as the first
        with pytest.raises(FileWriteError, match=r"points-k\.h5: cannot write .*bytes.*: the disk is full"):
            cache.add_points("k", 4, np.arange(2, 4), np.zeros(2), np.zeros(2))
    monkeypatch.setattr(os, "write", real_write)
    assert (tmp_path / "c" / "points-k.h5").read_bytes() == before
    assert [p.name for p in (tmp_path / "c").iterdir() if ".tmp-" in p.name] == []
    cache.flush()  # space freed: the queued points are written
    loss, _, done = Cache(tmp_path / "c").points("k", 4)
    assert done.all() and loss.tolist() == [1.0, 1.0, 0.0, 0.0]


# ------------------------------------------------------------------ format 1 (one file)
FORMAT1 = TESTS / "data" / "cache_format1.h5"  # written by the format-1 cache (commit 872fe39)


def _format1_plane():
    from landscape.results import PlaneResult

    values = np.linspace(0.5, 2.0, 8)
    return PlaneResult(x=values[:2], y=values[:3], loss=np.ones((3, 2)), accuracy=np.ones((3, 2)), origin=values,
                       u=values, v=values, param_mask=np.ones(8, bool), models={"a": [0.0, 1.0]},
                       spec={"kind": "legacy"})


def test_a_format1_file_is_read_and_writes_say_how_to_upgrade(tmp_path):
    old = tmp_path / "old.h5"
    old.write_bytes(FORMAT1.read_bytes())
    cache = Cache(old)
    values = np.linspace(0.5, 2.0, 8)
    loss, acc, done = cache.points("k", 8)
    assert np.flatnonzero(done).tolist() == [0, 1, 2, 5]
    np.testing.assert_array_equal(loss[done], values[done])
    np.testing.assert_array_equal(acc[done], values[done] / 4)
    assert cache.load_result("r") == _format1_plane()
    assert cache.keys() == {"points": ["k", "other"], "results": ["r"]}
    with pytest.raises(CacheError, match="python -m landscape.cache.upgrade"):
        cache.add_points("k", 8, np.array([3]), np.ones(1), np.ones(1), force=True)
    assert old.read_bytes() == FORMAT1.read_bytes()
    flipped = bytearray(FORMAT1.read_bytes())
    flipped[9000] ^= 1
    old.write_bytes(bytes(flipped))
    with pytest.raises(CacheError, match="does not match the SHA-256"):
        Cache(old)


def test_format1_upgrade_copies_every_entry(tmp_path):
    new = tmp_path / "new"
    proc = subprocess.run([sys.executable, "-m", "landscape.cache.upgrade", str(FORMAT1), str(new)],
                          capture_output=True, text=True, cwd=TESTS.parent)
    assert proc.returncode == 0, proc.stderr
    assert "copied 3 entries" in proc.stdout
    old, cache = Cache(FORMAT1), Cache(new)
    assert cache.legacy is None and cache.keys() == old.keys()
    for key, n in (("k", 8), ("other", 3)):
        for a, b in zip(cache.points(key, n), old.points(key, n)):
            np.testing.assert_array_equal(a, b)
    assert cache.load_result("r") == _format1_plane()
    cache.add_points("k", 8, np.array([3]), np.array([9.0]), np.array([1.0]), force=True)  # now extensible
    assert Cache(new).points("k", 8)[2].sum() == 5
