"""Fault injection.

SIGKILL during plane computations and FL runs, concurrent writers, full and read-only disks,
malicious and corrupt inputs, bad data, numeric overflow.

Every test adds to ``fault_counts.COUNTS`` (kills survived, corrupt inputs tried, bad inputs
rejected); the totals of all fault modules are printed once at the end of the run.
``scripts/soak.py`` runs the kill loops with many more kills.

Kills: importing torch takes seconds, so one helper process (the "zygote") imports
everything once and forks a worker per job; the test SIGKILLs the worker at a moment drawn
from a seeded RNG once it has written something, checks that every file is readable and
holds only correct values, and finally resumes and compares with an uninterrupted run.
"""
from __future__ import annotations

import errno
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from torch import nn

import fl
from fl.partition import PartitionError, partition
from fl.store import RunStore
from landscape import (
    ArchitectureMismatchError,
    Cache,
    CacheError,
    CheckpointError,
    ConfigError,
    DataError,
    Evaluator,
    FileWriteError,
    NonFiniteWeightsError,
    ParameterSpace,
    interpolate,
    load_state_dict,
    random_plane,
    save_state_dict,
)
from landscape.results import PlaneResult

from conftest import make_bn_cnn, make_mlp
from fault_counts import COUNTS

TESTS = Path(__file__).parent

#: The plane computation the kill tests interrupt: a random plane of a small MLP on digits.
PLANE = {"resolution": 7, "span": 1.0, "seed": 5, "hidden": 8, "samples": 60}
#: The FL run the kill tests interrupt: IMA has server state (its window) to resume too.
FL_ARGS: dict[str, Any] = dict(dataset="digits", clients=4, rounds=12, participation=0.5, batch_size=64,
                               lr=0.1, seed=3, window=2, start_round=5, progress=False)
#: The same run with plain FedAvg, for tests that need any small run.
FEDAVG_ARGS = {k: v for k, v in FL_ARGS.items() if k not in ("window", "start_round")}
KILLS_PLANE = 5
KILLS_FL = 4


# ------------------------------------------------------------------------------ jobs
def plane_job(cache: str | None, sleep: float = 0.0) -> tuple[Evaluator, PlaneResult]:
    """Compute the plane (``sleep`` seconds per forward call), caching points and the result."""
    from fl.datasets import load_dataset

    bundle = load_dataset("digits")
    n = PLANE["samples"]
    template = make_mlp(0, hidden=PLANE["hidden"])
    if sleep:
        template.register_forward_pre_hook(lambda *_: time.sleep(sleep))
    store = Cache(cache, flush_interval=0.0) if cache else None
    ev = Evaluator(template, (bundle.test_x[:n], bundle.test_y[:n]), device="cpu", strategy="loop",
                   chunk_size=1, cache=store)
    result = random_plane(make_mlp(1, hidden=PLANE["hidden"]), ev, resolution=PLANE["resolution"],
                          span=PLANE["span"], seed=PLANE["seed"])
    if store is not None:
        store.save_result("plane", result)
    return ev, result


def fl_job(out: str, **extra: Any) -> fl.Run:
    """The FL run (IMA on FedAvg) into ``out``; resumes what is there."""
    return fl.run("ima", out=out, **FL_ARGS, **extra)


def points_job(cache: str, parity: int, n: int, sleep: float) -> None:
    """Write points ``parity, parity + 2, ...`` of key "k" one flush at a time (value = index)."""
    store = Cache(cache, flush_interval=0.0, lock_timeout=60.0)
    done = store.points("k", n)[2]
    for i in range(parity, n, 2):
        if not done[i]:
            store.add_points("k", n, np.array([i]), np.array([float(i)]), np.array([i / n]), force=True)
            time.sleep(sleep)


def hold_cache_lock(cache: str, flag: str) -> None:
    """Take the cache's writer lock, announce it through ``flag``, and keep it."""
    with Cache(cache).writer_lock():
        Path(flag).touch()
        time.sleep(600)


# ---------------------------------------------------------------------------- zygote
ZYGOTE = """
import json, os, sys, traceback
sys.path.insert(0, {tests!r})
import torch
torch.set_num_threads(1)
import test_faults
from fl.datasets import load_dataset
load_dataset("digits")  # scikit-learn is imported once, before any fork
print(json.dumps({{"ready": True}}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["cmd"] == "start":
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                getattr(test_faults, cmd["job"])(*cmd["args"])
            except BaseException:
                traceback.print_exc()
                sys.stderr.flush()
                code = 1
            os._exit(code)
        print(json.dumps({{"pid": pid}}), flush=True)
    else:
        _, status = os.waitpid(cmd["pid"], 0)
        print(json.dumps({{"signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0,
                          "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None}}), flush=True)
"""


class Zygote:
    """A process that has imported torch and the toolkit and forks workers on request."""

    def __init__(self, log: Path):
        self.log_path = log
        self._log = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE.format(tests=str(TESTS))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True)
        self.ready = False

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the zygote died:\n{self.log_path.read_text()}")
        return json.loads(line)

    def _ask(self, **cmd: Any) -> dict:
        if not self.ready:
            self._read()
            self.ready = True
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def start(self, job: str, *args: Any) -> int:
        return self._ask(cmd="start", job=job, args=list(args))["pid"]

    def wait(self, pid: int) -> dict:
        status = self._ask(cmd="wait", pid=pid)
        assert status["code"] in (None, 0), f"worker failed:\n{self.log_path.read_text()}"
        return status

    def close(self) -> None:
        if self.ready:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        else:  # never used (a subset of the tests ran): no need to finish its imports
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@pytest.fixture(scope="module", autouse=True)
def zygote(tmp_path_factory):
    """Started with the module's first test, so that its imports overlap the tests before the kills."""
    z = Zygote(tmp_path_factory.mktemp("zygote") / "log.txt")
    yield z
    z.close()


def _stamp(path: Path) -> tuple[int, int] | None:
    """Identity of a file's current version (files are replaced, never rewritten in place)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _kill_after_write(zygote: Zygote, watched: Path, delay: float, job: str, *args: Any) -> bool:
    """Start ``job``; once ``watched`` changes, wait ``delay`` s and SIGKILL it. True if killed."""
    before = _stamp(watched)
    pid = zygote.start(job, *args)
    deadline = time.monotonic() + 120
    while _stamp(watched) == before and _alive(pid):
        assert time.monotonic() < deadline, f"{job} wrote nothing to {watched}"
        time.sleep(0.002)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    return zygote.wait(pid)["signal"] == signal.SIGKILL


def _no_temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if ".tmp-" in p.name]


# --------------------------------------------------------------------- malicious inputs
class _Payload:
    """Unpickling this runs a shell command that creates a marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_pickle_payloads_are_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    payload = _Payload(marker)
    state = make_mlp(0).state_dict()
    files = {"zip.pt": lambda p: torch.save({**state, "x": payload}, p),
             "wrapped.pth": lambda p: torch.save({"state_dict": state, "meta": payload}, p),
             "legacy.pt": lambda p: torch.save({**state, "x": payload}, p, _use_new_zipfile_serialization=False),
             "raw-pickle.pt": lambda p: p.write_bytes(pickle.dumps({"w": payload})),
             "pickle-named.safetensors": lambda p: p.write_bytes(pickle.dumps({"w": payload})),
             "pickle.bin": lambda p: torch.save(payload, p)}
    space = ParameterSpace(make_mlp(0))
    for name, write in files.items():
        path = tmp_path / name
        write(path)
        for load in (load_state_dict, space.to_vector):
            with pytest.raises(CheckpointError) as info:
                load(path)
            assert str(path) in str(info.value), name
        COUNTS["corrupt inputs tried"] += 1
    store = RunStore(tmp_path)
    np.savez(store.partition_path, train_00000=np.array([payload], dtype=object))
    with pytest.raises(CheckpointError, match="partition.npz"):
        store.read_partition()
    COUNTS["corrupt inputs tried"] += 1
    assert not marker.exists()


# ------------------------------------------------------------------------ planted links
def test_links_planted_where_files_are_written_are_never_followed(tmp_path):
    """Every writer refuses a target that is a link and ignores links at old temporary names.

    Writers: checkpoints, cache entries, figures, report pages, JSON. The links at the
    fixed temporary names older writers used are ignored; the file the links point to
    never changes.
    """
    import figures
    from landscape.infra.files import write_json
    from landscape.results import PathResult

    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"keep")
    path_result = PathResult(alphas=np.linspace(0, 1, 3), loss=np.ones(3), accuracy=np.ones(3))
    writers: dict[str, Callable[[Path], Any]] = {
        "m.safetensors": lambda p: save_state_dict(make_mlp(0).state_dict(), p),
        "m.pt": lambda p: save_state_dict(make_mlp(0).state_dict(), p),
        "result-r.h5": lambda p: Cache(p.parent).save_result("r", path_result),
        "points-k.h5": lambda p: Cache(p.parent).add_points("k", 2, np.arange(2), np.ones(2), np.ones(2), force=True),
        "path.png": lambda p: figures.save(figures.path_figure({"a": path_result}), p),
        "path.html": lambda p: figures.save(figures.path_plotly({"a": path_result}), p),
        "index.html": lambda p: figures.Report("t").write(p),
        "report.json": lambda p: write_json(p, {"a": 1}),
    }
    for name, write in writers.items():
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        if name.endswith(".h5"):  # an existing cache folder
            Cache(folder).save_result("other", path_result)
        target = folder / name
        target.symlink_to(outside)
        with pytest.raises((FileWriteError, CacheError), match=f"{name}: is a symbolic link"):
            write(target)  # a cache entry is refused when it is read before being merged
        target.unlink()
        for fixed in (f".{name}.tmp", f".{name}.tmp-{os.getpid()}"):
            (folder / fixed).symlink_to(outside)
        write(target)
        assert target.is_file() and not target.is_symlink() and outside.read_bytes() == b"keep", name
        COUNTS["bad inputs rejected"] += 2

# ----------------------------------------------------------------------- corrupt inputs
def _mutations(data: bytes, rng: np.random.Generator, flips: int, cuts: int) -> list[tuple[str, bytes]]:
    """Single-bit flips and truncations of a file.

    Flips at random offsets and in every byte of the first 8 and last 22 bytes (length
    headers, a zip's end record), and truncations at random lengths.
    """
    out = []
    edges = [*range(8), *range(len(data) - 22, len(data))]
    for i in [*edges, *rng.choice(len(data), size=min(flips, len(data)), replace=False)]:
        bad = bytearray(data)
        bad[i] ^= 1 << int(rng.integers(8))
        out.append((f"flip@{i}", bytes(bad)))
    out += [(f"cut@{n}", data[:n]) for n in rng.choice(len(data), size=cuts, replace=False)]
    return out


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_corrupt_checkpoints_never_load_silently_wrong(tmp_path, suffix):
    state = make_bn_cnn(0).state_dict()
    data = save_state_dict(state, tmp_path / f"good{suffix}").read_bytes()
    rng = np.random.default_rng(11)
    silent = []
    for what, content in _mutations(data, rng, flips=60, cuts=15):
        path = tmp_path / f"bad{suffix}"
        path.write_bytes(content)
        try:
            loaded = load_state_dict(path)
        except CheckpointError as err:
            assert str(path) in str(err)
        else:
            if not _same_states(loaded, state):
                silent.append(what)
        COUNTS["corrupt inputs tried"] += 1
    assert silent == []  # every corruption that changes a value is detected


def test_corrupt_cache_files_never_give_silently_wrong_numbers(tmp_path):
    good = tmp_path / "good"
    cache = Cache(good)
    values = np.linspace(0.5, 2.0, 8)
    cache.add_points("k", 8, np.arange(8), values, values / 4, force=True)
    cache.save_result("r", PlaneResult(x=values[:2], y=values[:3], loss=np.ones((3, 2)), accuracy=np.ones((3, 2)),
                                       origin=values, u=values, v=values, param_mask=np.ones(8, bool),
                                       models={"a": [0.0, 1.0]}, spec={"kind": "test"}))
    expected = Cache(good).load_result("r")
    rng = np.random.default_rng(12)
    silent = []
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    for entry in ("points-k.h5", "result-r.h5"):  # one damaged entry at a time, the other intact
        data = (good / entry).read_bytes()
        for what, content in _mutations(data, rng, flips=60, cuts=5):
            path = bad / entry
            path.write_bytes(content)
            try:
                loss, acc, done = Cache(bad).points("k", 8)
                result = Cache(bad).load_result("r")
            except CacheError as err:
                assert str(path) in str(err)
            else:
                if not (np.array_equal(loss[done], values[done]) and np.array_equal(acc[done], values[done] / 4)
                        and np.isnan(loss[~done]).all() and (result is None or result == expected)):
                    silent.append(f"{entry}:{what}")
            COUNTS["corrupt inputs tried"] += 1
        path.write_bytes(data)
    assert silent == []


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("small") / "run"
    fl.run("fedavg", out=out, **dict(FEDAVG_ARGS, rounds=2))
    return out


def _copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


@pytest.mark.parametrize("target,content,match", [
    ("config.json", b"{\"algorithm\": \"fedavg\", \"rou", "corrupt JSON"),
    ("config.json", b"[1, 2]", "config.json"),
    ("config.json", b"{}", "config.json"),
    ("progress.json", b"{\"round\": ", "progress"),
    ("partition.npz", b"PK\x03\x04 truncated", "partition.npz"),
    ("global/round_0002.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": 1}", "round_0002"),
    ("global/round_0001.safetensors", b"", "round_0001"),
    ("metrics.jsonl", b"{\"round\": 0}\nnot json\n{\"round\": 2}\n", "metrics.jsonl"),
])
def test_corrupt_run_directories_name_the_file_and_problem(small_run, tmp_path, target, content, match):
    out = _copy_run(small_run, tmp_path / "run")
    (out / target).write_bytes(content)

    def read_all() -> None:
        run = fl.load_run(out)
        _ = run.metrics, run.rounds
        for r in run.rounds:
            run.global_state(r)
            run.client_states(r)
        run.client_datasets()

    with pytest.raises(CheckpointError, match=match):
        read_all()
    COUNTS["corrupt inputs tried"] += 1


def test_flipped_bytes_in_run_checkpoints_are_detected_on_resume(small_run, tmp_path):
    out = _copy_run(small_run, tmp_path / "run")
    path = out / "global" / "round_0002.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x04  # a weight's low-order bits: still a finite, plausible number
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="round_0002"):
        fl.load_run(out).global_state(2)
    (out / "progress.json").write_text(json.dumps({"round": 2, "complete": False}))
    with pytest.raises(CheckpointError, match="round_0002"):
        fl.run("fedavg", out=out, **dict(FEDAVG_ARGS, rounds=2))
    COUNTS["corrupt inputs tried"] += 2


# --------------------------------------------------------------- mismatches, NaN weights
def test_architecture_mismatch_lists_every_kind_of_key(small_run):
    run = fl.load_run(small_run)
    wrong_template = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10))
    with pytest.raises(ArchitectureMismatchError) as info:
        ParameterSpace(wrong_template).to_vector(run.checkpoint(1))
    err = info.value
    assert err.missing and err.unexpected and str(run.checkpoint(1)) in str(err)
    state = run.global_state(1)
    name = next(iter(state))
    state[name] = torch.zeros(3, 3)
    with pytest.raises(ArchitectureMismatchError) as info:
        ParameterSpace(run.module()).to_vector(state)
    assert [k for k, _, _ in info.value.wrong_shape] == [name] and not info.value.missing
    COUNTS["bad inputs rejected"] += 2


@pytest.mark.parametrize("entry,value", [("1.weight", float("nan")), ("1.running_var", float("inf")),
                                         ("0.bias", float("-inf"))])
def test_nonfinite_weights_are_reported_by_name(tmp_path, digits_images, entry, value):
    state = make_bn_cnn(0).state_dict()
    state[entry].view(-1)[0] = value
    path = save_state_dict(state, tmp_path / "bad.safetensors")
    x, y = digits_images
    ev = Evaluator(make_bn_cnn(0), (x[:20], y[:20]))
    for call in (lambda: ev.evaluate([path]), lambda: interpolate(make_bn_cnn(1), path, ev, alphas=3)):
        with pytest.raises(NonFiniteWeightsError, match=entry.replace(".", r"\.")) as info:
            call()
        assert str(path) in str(info.value)
    assert ev.points_evaluated == 0
    COUNTS["bad inputs rejected"] += 2


# -------------------------------------------------------------------------- bad data
def test_bad_data_is_rejected_before_any_work(tmp_path, digits):
    x, y = digits
    x, y = x[:40], y[:40]
    cache = tmp_path / "c.h5"
    cases: dict[str, tuple[Callable[[], Any], str]] = {
        "label too large": (lambda: (x, torch.where(y == 3, 10, y)), r"labels must lie in \[0, 9\].*\[0, 10\]"),
        "negative label": (lambda: (x, torch.where(y == 3, -1, y)), r"\[-1, 9\]"),
        "wrong input shape": (lambda: (x[:, :50], y), r"inputs of shape \(50,\)"),
        "images for a flat model": (lambda: (torch.zeros(40, 3, 8, 8), y), "cannot be applied"),
        "empty tensors": (lambda: (x[:0], y[:0]), "empty"),
        "empty list": (lambda: [], "empty|cannot use"),
        "length mismatch": (lambda: (x, y[:30]), "40 samples but targets have 30"),
        "NaN inputs": (lambda: (torch.where(x > 0.9, float("nan"), x), y), "NaN or infinite"),
        "not data": (lambda: 42, "cannot use int"),
    }
    for name, (make, match) in cases.items():
        with pytest.raises(DataError, match=match):
            Evaluator(make_mlp(0), make(), cache=cache)
        COUNTS["bad inputs rejected"] += 1
    assert not cache.exists()  # nothing was computed or written


def test_fl_partitions_leaving_a_client_empty_are_rejected_before_any_work(tmp_path):
    labels = np.repeat(np.arange(3), 4)
    with pytest.raises(PartitionError, match="min_size"):
        partition(labels, 20, "iid", seed=0)
    with pytest.raises(PartitionError, match="fewer than min_size"):
        partition(labels, 6, "dirichlet", alpha=0.01, seed=0, max_redraws=3)
    out = tmp_path / "run"
    with pytest.raises(PartitionError):
        fl.run("fedavg", out=out, **dict(FEDAVG_ARGS, clients=2000, rounds=1))
    assert [p.name for p in out.iterdir() if not p.name.startswith(".")] == []  # nothing written
    COUNTS["bad inputs rejected"] += 3


@pytest.mark.parametrize("model", [nn.Sequential(nn.Flatten(), nn.Linear(64, 5)),
                                   nn.Sequential(nn.Flatten(), nn.Linear(10, 10))])
def test_fl_model_that_does_not_fit_the_data_is_rejected_before_any_work(tmp_path, model):
    out = tmp_path / "run"
    with pytest.raises(DataError):
        fl.run("fedavg", model=model, out=out, **dict(FEDAVG_ARGS, rounds=1))
    assert not (out / "metrics.jsonl").exists()


# ----------------------------------------------------------------------------- numerics
def test_overflowing_points_are_stored_as_nonfinite_and_reported(tmp_path, digits):
    from figures import path_figure, plane_figure

    x, y = digits
    cache = tmp_path / "c.h5"
    ev = Evaluator(make_mlp(0), (x[:50], y[:50]), cache=cache)
    near = make_mlp(1).state_dict()
    far = {k: v * 1e30 for k, v in near.items()}  # finite weights whose outputs overflow float32
    path = interpolate(near, far, ev, alphas=5)
    assert np.isfinite(path.loss[0]) and path.nonfinite == 4
    assert np.isnan(path.loss_barrier)  # not a crash, not a made-up number
    again = Evaluator(make_mlp(0), (x[:50], y[:50]), cache=cache)
    np.testing.assert_array_equal(interpolate(near, far, again, alphas=5).loss, path.loss)
    assert again.points_evaluated == 0  # overflowed points are cached as computed, not redone
    plane = random_plane(make_mlp(1), ev, resolution=5, span=1e30, seed=0)
    assert 0 < plane.nonfinite < plane.loss.size and np.isfinite(plane.loss[2, 2])
    Cache(cache).save_result("plane", plane)
    assert Cache(cache).load_result("plane") == plane
    assert "4 non-finite" in path_figure(path)._suptitle.get_text()
    assert f"{plane.nonfinite} non-finite" in plane_figure(plane)._suptitle.get_text()
    COUNTS["bad inputs rejected"] += 2



# ---------------------------------------------------------------------- full / read-only
@pytest.fixture
def small_fs(tmp_path):
    """A 192 KiB tmpfs (root only): a disk that really fills up and can be remounted read-only."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; the monkeypatched disk-full tests still run")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs ({proc.stderr.strip()}); the monkeypatched tests still run")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=True)


def _remount(mnt: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(mnt)], check=True)


def test_full_disk_cache_write_fails_clearly_and_keeps_earlier_results(small_fs):
    cache = Cache(small_fs / "c")
    cache.add_points("small", 4, np.arange(4), np.arange(4.0), np.ones(4), force=True)
    big = np.random.default_rng(0).normal(size=40_000)  # 320 KB: more than the disk holds
    for _ in range(2):  # the second attempt once crashed (exit 139) after h5py failed on a full disk
        with pytest.raises(FileWriteError, match="bytes.*the disk is full") as info:
            cache.add_points("big", big.size, np.arange(big.size), big, big, force=True)
        assert str(small_fs / "c" / "points-big.h5") in str(info.value)
        assert Cache(small_fs / "c").points("small", 4)[2].all()  # the earlier entry is intact
        assert Cache(small_fs / "c").keys()["points"] == ["small"]
        assert _no_temporaries(small_fs) == []
    _remount(small_fs, "size=8m")
    cache.flush()  # space freed: the queued points are written
    assert Cache(small_fs / "c").points("big", big.size)[2].all()
    COUNTS["bad inputs rejected"] += 2


def test_full_disk_checkpoint_write_fails_clearly_and_keeps_the_old_file(small_fs):
    model = make_mlp(0, hidden=8)
    path = save_state_dict(model.state_dict(), small_fs / "m.safetensors")
    free = os.statvfs(small_fs).f_bavail * os.statvfs(small_fs).f_frsize
    (small_fs / "filler").write_bytes(b"\0" * max(0, free - 1024))
    with pytest.raises(FileWriteError, match="disk is full") as info:
        save_state_dict(make_mlp(1, hidden=64).state_dict(), path)
    assert str(path) in str(info.value)
    assert _same_states(load_state_dict(path), model.state_dict())
    assert _no_temporaries(small_fs) == []
    COUNTS["bad inputs rejected"] += 1


def test_fl_run_on_a_disk_that_fills_up_resumes_after_space_is_freed(small_fs, fl_reference):
    out = small_fs / "run"
    with pytest.raises(FileWriteError, match="disk is full"):
        fl_job(str(out))
    last = _check_run_prefix(out, fl_reference)  # what was stored reads back and is correct
    assert 0 <= last < FL_ARGS["rounds"]
    _remount(small_fs, "size=8m")
    fl_job(str(out))
    assert _check_run_prefix(out, fl_reference) == FL_ARGS["rounds"]
    assert _no_temporaries(out) == []
    COUNTS["bad inputs rejected"] += 1


def test_read_only_location_reads_work_and_writes_fail_clearly(small_fs):
    cache = Cache(small_fs / "c")
    cache.add_points("k", 2, np.arange(2), np.ones(2), np.ones(2), force=True)
    save_state_dict(make_mlp(0).state_dict(), small_fs / "m.safetensors")
    _remount(small_fs, "ro")
    assert Cache(small_fs / "c").points("k", 2)[2].all()
    assert _same_states(load_state_dict(small_fs / "m.safetensors"), make_mlp(0).state_dict())
    with pytest.raises(FileWriteError, match="not writable"):
        Cache(small_fs / "c").add_points("k", 2, np.arange(2), np.ones(2), np.ones(2), force=True)
    with pytest.raises(FileWriteError, match="not writable"):
        save_state_dict(make_mlp(1).state_dict(), small_fs / "m.safetensors")
    with pytest.raises(FileWriteError, match="not writable"):
        fl_job(str(small_fs / "run"))
    COUNTS["bad inputs rejected"] += 3


@pytest.mark.parametrize("code,message", [(errno.ENOSPC, "disk is full"), (errno.EROFS, "not writable")])
def test_failing_renames_leave_old_files_and_say_why(tmp_path, monkeypatch, code, message):
    """Without a small disk: every final rename fails as on a full or read-only disk."""
    cache = Cache(tmp_path / "c")
    cache.add_points("k", 2, np.arange(2), np.ones(2), np.ones(2), force=True)
    model_path = save_state_dict(make_mlp(0).state_dict(), tmp_path / "m.pt")
    store = RunStore(tmp_path / "run")
    store.mark(1, complete=False)
    before = {p: p.read_bytes() for p in (tmp_path / "c" / "points-k.h5", model_path, store.progress_path)}

    def failing_replace(src, dst, **dir_fds):
        raise OSError(code, os.strerror(code), str(dst))

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(FileWriteError, match=message):
        cache.add_points("k", 2, np.arange(2), np.zeros(2), np.zeros(2), force=True)
    with pytest.raises(FileWriteError, match=message):
        save_state_dict(make_mlp(1).state_dict(), model_path)
    with pytest.raises(FileWriteError, match=message):
        store.mark(2, complete=True)
    monkeypatch.undo()
    assert {p: p.read_bytes() for p in before} == before
    assert _no_temporaries(tmp_path) == []
    COUNTS["bad inputs rejected"] += 3


# ------------------------------------------------------------------------ kill: plane
def _check_plane_cache(cache: Path, reference: PlaneResult) -> int:
    """The cache is readable and every point it marks done equals the reference exactly."""
    n = PLANE["resolution"] ** 2
    if not cache.exists():
        return 0
    store = Cache(cache)
    keys = store.keys()
    if not keys["points"]:
        return 0
    assert len(keys["points"]) == 1
    loss, acc, done = store.points(keys["points"][0], n)
    np.testing.assert_array_equal(loss[done], reference.loss.ravel()[done])
    np.testing.assert_array_equal(acc[done], reference.accuracy.ravel()[done])
    assert np.isnan(loss[~done]).all()
    if keys["results"]:
        assert store.load_result("plane") == reference
    return int(done.sum())


def plane_campaign(zygote: Zygote, cache: Path, reference: PlaneResult, rng: np.random.Generator,
                   kills: int, max_delay: float = 0.15) -> tuple[int, int]:
    """Kill the plane job up to ``kills`` times, then resume it to the end and compare.

    The cache is checked after each kill, the result compared with ``reference``. Returns
    (kills, points done before the final resume).
    """
    n = PLANE["resolution"] ** 2
    done, killed = 0, 0
    for _ in range(kills):
        if not _kill_after_write(zygote, cache, float(rng.uniform(0.0, max_delay)), "plane_job", str(cache), 0.01):
            done = n  # finished before the kill
            break
        killed += 1
        now = _check_plane_cache(cache, reference)
        assert now >= done  # nothing flushed is ever lost
        done = now
    ev, resumed = plane_job(str(cache))
    assert ev.points_evaluated == n - done  # only the missing points
    assert resumed == reference  # bit-identical to the uninterrupted computation
    assert Cache(cache).load_result("plane") == reference
    assert _no_temporaries(cache.parent) == []
    return killed, done


def until_killed(target: int, campaign: Callable[[int, int], int], campaigns: int = 3) -> int:
    """Run ``campaign(kills wanted, index)`` until ``target`` kills happened; the number of kills.

    A fast machine may finish a job before all its kills.
    """
    kills = 0
    for i in range(campaigns):
        kills += campaign(target - kills, i)
        if kills >= target:
            break
    return kills


def test_plane_survives_repeated_sigkill(zygote, tmp_path):
    _, reference = plane_job(None)
    assert np.isfinite(reference.loss).all()
    rng = np.random.default_rng(2024)
    kills = until_killed(KILLS_PLANE, lambda want, i: plane_campaign(
        zygote, tmp_path / f"plane{i}", reference, rng, want)[0])
    assert kills == KILLS_PLANE
    COUNTS["kills survived"] += kills


# ------------------------------------------------------------------------ kill: FL run
def _same_states(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _strip_time(metrics: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if k != "time"} for m in metrics]


def _check_run_prefix(out: Path, reference: fl.Run) -> int:
    """The run directory reads back, and every complete round equals the reference run."""
    if not (out / "config.json").exists():
        return -1
    run = fl.load_run(out)
    assert run.config == reference.config
    rounds = run.rounds
    assert rounds == reference.rounds[:len(rounds)]
    for r in rounds:
        assert _same_states(run.global_state(r), reference.global_state(r)), r
        assert _same_states(run.algorithm_state(r), reference.algorithm_state(r)), r
        clients = run.client_states(r)
        assert clients.keys() == reference.client_states(r).keys()
        assert all(_same_states(s, reference.client_states(r)[k]) for k, s in clients.items())
    assert _strip_time(run.metrics) == _strip_time(reference.metrics[:len(rounds)])
    return rounds[-1] if rounds else -1


@pytest.fixture(scope="module")
def fl_reference(tmp_path_factory) -> fl.Run:
    return fl_job(str(tmp_path_factory.mktemp("fl") / "reference"))


def fl_campaign(zygote: Zygote, out: Path, reference: fl.Run, rng: np.random.Generator, kills: int,
                max_delay: float = 0.12) -> tuple[int, int]:
    """Kill the FL job up to ``kills`` times, then resume it to the end and compare.

    The run directory is checked after each kill, the result compared with ``reference``.
    Returns (kills, last complete round before the final resume).
    """
    last, killed = -1, 0
    for _ in range(kills):
        if not _kill_after_write(zygote, out / "progress.json", float(rng.uniform(0.0, max_delay)), "fl_job", str(out)):
            last = FL_ARGS["rounds"]  # finished before the kill
            break
        killed += 1
        now = _check_run_prefix(out, reference)
        assert now >= last  # no complete round is ever lost
        last = now
    seen: list[int] = []
    resumed = fl_job(str(out), on_round=lambda r, m: seen.append(r))
    assert seen == list(range(last + 1, FL_ARGS["rounds"] + 1))  # only the missing rounds
    assert resumed.complete and _check_run_prefix(out, reference) == FL_ARGS["rounds"]
    assert _no_temporaries(out) == []
    return killed, last


def test_fl_run_survives_repeated_sigkill(zygote, fl_reference, tmp_path):
    rng = np.random.default_rng(7)
    kills = until_killed(KILLS_FL, lambda want, i: fl_campaign(
        zygote, tmp_path / f"run{i}", fl_reference, rng, want)[0])
    assert kills == KILLS_FL
    COUNTS["kills survived"] += kills


def test_a_kill_between_the_first_two_files_leaves_a_restartable_folder(small_run, tmp_path):
    """A kill after config.json is written (first) but before the partition must not block a rerun."""
    store = RunStore(tmp_path / "run")
    store.path.mkdir()
    shutil.copy(small_run / "config.json", store.config_path)  # what the killed run had written
    assert fl.run("fedavg", out=store.path, **dict(FEDAVG_ARGS, rounds=2)).complete


# --------------------------------------------------------------------------- concurrency
def test_concurrent_cache_writers_and_a_kill_lose_nothing(zygote, tmp_path):
    cache, n = tmp_path / "shared", 40
    a = zygote.start("points_job", str(cache), 0, n, 0.01)
    b = zygote.start("points_job", str(cache), 1, n, 0.01)
    deadline = time.monotonic() + 60
    while not (cache.exists() and Cache(cache).points("k", n)[2][0::2].sum() >= 4):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(a, signal.SIGKILL)  # perhaps while it holds the lock or writes its copy
    assert zygote.wait(a)["signal"] == signal.SIGKILL
    assert zygote.wait(b)["signal"] == 0
    loss, acc, done = Cache(cache).points("k", n)
    assert done[1::2].all() and 4 <= done[0::2].sum() < n // 2  # b finished; a's flushed points kept
    np.testing.assert_array_equal(loss[done], np.flatnonzero(done).astype(float))
    np.testing.assert_array_equal(acc[done], np.flatnonzero(done) / n)
    points_job(str(cache), 0, n, 0.0)  # a resumes
    loss, acc, done = Cache(cache).points("k", n)
    assert done.all() and np.array_equal(loss, np.arange(n, dtype=float))
    assert _no_temporaries(tmp_path) == []
    COUNTS["kills survived"] += 1


def test_a_second_writer_fails_clearly_while_another_process_holds_the_lock(zygote, tmp_path):
    cache, flag = tmp_path / "c", tmp_path / "locked"
    Cache(cache).add_points("k", 3, np.array([0]), np.array([1.0]), np.array([0.5]), force=True)
    before = (cache / "points-k.h5").read_bytes()
    holder = zygote.start("hold_cache_lock", str(cache), str(flag))
    while not flag.exists():
        time.sleep(0.01)
    second = Cache(cache, lock_timeout=0.3)
    with pytest.raises(CacheError, match="another process has been writing this cache"):
        second.add_points("k", 3, np.array([1]), np.array([2.0]), np.array([0.25]), force=True)
    assert (cache / "points-k.h5").read_bytes() == before  # untouched
    os.kill(holder, signal.SIGKILL)  # the kernel releases a dead process's lock
    assert zygote.wait(holder)["signal"] == signal.SIGKILL
    second.flush()  # the queued point was kept and is written now
    loss, _, done = Cache(cache).points("k", 3)
    assert done.tolist() == [True, True, False] and loss[:2].tolist() == [1.0, 2.0]
    COUNTS["kills survived"] += 1
    COUNTS["bad inputs rejected"] += 1


def test_a_second_fl_run_into_a_busy_folder_fails_clearly_then_resumes(zygote, fl_reference, tmp_path):
    out = tmp_path / "busy"
    worker = zygote.start("fl_job", str(out))
    while _stamp(out / "progress.json") is None:
        assert _alive(worker)
        time.sleep(0.005)
    with pytest.raises(ConfigError, match="being written by another process"):
        fl_job(str(out))
    os.kill(worker, signal.SIGKILL)
    killed = zygote.wait(worker)["signal"] == signal.SIGKILL
    fl_job(str(out))
    assert _check_run_prefix(out, fl_reference) == FL_ARGS["rounds"]
    COUNTS["kills survived"] += int(killed)
    COUNTS["bad inputs rejected"] += 1
