"""Hostile run folders, caches and temporary folders.

Links below the output folder, FIFOs, character devices and folders where files belong, oversized
files, cache files without a seal, a planted device-slot folder. Each is refused with one clear
line naming the file and what it is, before anything is written and without hanging (every read
that could block runs under an alarm).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest
import torch

import fl
from landscape import Cache, CacheError, CheckpointError, DataError, FileWriteError, load_state_dict
from landscape.infra.files import write_text
from landscape.infra.parallel import current_device, run_shards
from landscape.results import PathResult
from landscape_cli.datafiles import load_tensor_file
from landscape_cli.main import main

from fault_counts import tally

RUN_FILES = ("config.json", "progress.json", "metrics.jsonl", "partition.npz")
SPECIAL: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (lambda p: os.mkfifo(p), "is a FIFO (named pipe), not a regular file"),
    "chardev": (lambda p: os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 5)), "is a character device"),
    "folder": (lambda p: p.mkdir(), "is a folder, not a regular file"),
}


class Hung(BaseException):
    """Raised by the alarm: not an OSError, so no handler under test can mistake it for a refusal."""


@contextlib.contextmanager
def deadline(seconds: int = 30) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the block has not finished after ``seconds``."""
    def ring(signum, frame):
        raise Hung(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def replace_with(path: Path, kind: str) -> str:
    """Put a FIFO, a character device (/dev/zero's numbers) or a folder at ``path``; the words expected."""
    if path.exists() or path.is_symlink():
        path.unlink()
    make, words = SPECIAL[kind]
    make(path)
    return words


def cli(argv: list[str], capsys) -> tuple[int, str]:
    """Run ``landscape`` in this process under a deadline; its status and stderr."""
    with deadline(120):
        code = main(argv)
    return code, capsys.readouterr().err


def one_line(code: int, err: str) -> str:
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hostile") / "run"
    fl.run("fedavg", dataset="digits", clients=4, rounds=2, out=out, progress=False, save_clients="all")
    return out


@pytest.fixture
def run(finished_run, tmp_path) -> Path:
    copy = tmp_path / "r"
    shutil.copytree(finished_run, copy)
    return copy


def _plane_free_result() -> PathResult:
    alphas = np.linspace(0, 1, 5)
    return PathResult(alphas=alphas, loss=1 + np.sin(np.pi * alphas), accuracy=1 - alphas / 4)


# ------------------------------------------------------------- links below the output folder
def test_report_into_a_linked_report_folder_writes_nothing_there(run, tmp_path, capsys):
    """``r/report`` a link elsewhere.

    The default cache (``report/landscape_cache``) used to write about ten files there before
    ``index.html`` was refused.
    """
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / "report").symlink_to(elsewhere)
    code, err = cli(["report", "--run", str(run), "--resolution", "3", "--alphas", "3"], capsys)
    assert f"{run / 'report'}: is a symbolic link" in one_line(code, err)
    assert list(elsewhere.rglob("*")) == []
    tally("hostile files refused")


def test_writes_check_every_folder_below_the_root(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    user = tmp_path / "user"
    (user / "out").mkdir(parents=True)
    (user / "out" / "sub").symlink_to(elsewhere)
    with pytest.raises(FileWriteError, match=r"out/sub: is a symbolic link"):
        write_text(user / "out" / "sub" / "deeper" / "page.html", "x", root=user)
    with pytest.raises(FileWriteError, match=r"out/sub: is a symbolic link"):
        Cache(user / "out" / "sub" / "cache", root=user).save_result("k", _plane_free_result())
    assert list(elsewhere.rglob("*")) == []
    linked_root = tmp_path / "chosen"
    linked_root.symlink_to(elsewhere)  # the folder the user chose may be a link: it is followed
    write_text(linked_root / "new" / "page.html", "kept", root=linked_root)
    assert (elsewhere / "new" / "page.html").read_text() == "kept"
    tally("hostile files refused", 2)


# ------------------------------------------------------------------ device-slot lock folder
def _slot_folder(tmp: Path, devices: tuple[str, ...]) -> Path:
    return tmp / f"landscape-devices-{hashlib.sha256('|'.join(devices).encode()).hexdigest()[:16]}"


def _device_of(_: int) -> str | None:
    return current_device()


@pytest.mark.parametrize("plant", ["link", "other user", "world-writable"])
def test_device_slot_folder_planted_by_someone_else_is_refused(tmp_path, monkeypatch, plant):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    devices = (f"cpu:{plant}", "cpu:other")
    folder = _slot_folder(tmp, devices)
    victim = tmp_path / "victim"
    victim.mkdir()
    if plant == "link":
        folder.symlink_to(victim)
        words = "is a symbolic link"
    else:
        folder.mkdir(mode=0o700)
        if plant == "other user":
            os.chown(folder, 12345, 12345)
            words = "is owned by uid 12345"
        else:
            folder.chmod(0o777)
            words = "is writable by other users (mode 777)"
    with pytest.raises(FileWriteError, match=re.escape(words)) as info:
        run_shards(_device_of, [0, 1], "local", devices=list(devices))
    assert str(folder) in str(info.value) and "\n" not in str(info.value)
    assert list(victim.iterdir()) == [] and [p.name for p in folder.iterdir()] == []
    tally("hostile files refused")


def test_device_slot_folder_is_private(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    devices = ("cpu:private-a", "cpu:private-b")
    assert run_shards(_device_of, [0, 1], "local", devices=list(devices)) == ["cpu:private-a"] * 2
    folder = _slot_folder(tmp_path, devices)
    assert stat.S_IMODE(folder.lstat().st_mode) == 0o700 and folder.lstat().st_uid == os.getuid()
    assert [p.name for p in folder.iterdir()] == ["slot-0"] and stat.S_ISREG((folder / "slot-0").lstat().st_mode)


# ------------------------------------------------- FIFOs, devices and folders in a run folder
@pytest.mark.parametrize("kind", sorted(SPECIAL))
@pytest.mark.parametrize("name", RUN_FILES)
def test_special_file_in_a_run_folder_is_refused_not_read(run, name, kind):
    words = replace_with(run / name, kind)
    with deadline(), pytest.raises(CheckpointError) as info:
        loaded = fl.load_run(run)
        loaded.metrics  # noqa: B018 (reads metrics.jsonl)
        loaded.client_datasets()  # reads partition.npz
    message = str(info.value)
    assert message.startswith(f"{run / name}: {words}") and "\n" not in message
    tally("hostile files refused")


@pytest.mark.parametrize("command", [["report"], ["path", "--models", "client:0", "client:1"]])
@pytest.mark.parametrize("name", ["config.json", "partition.npz"])
def test_cli_on_a_run_folder_with_a_fifo_says_so(run, capsys, command, name):
    replace_with(run / name, "fifo")
    code, err = cli([command[0], "--run", str(run), *command[1:], "--out", str(run.parent / "o"), "--alphas", "3",
                     "--split", "train"], capsys)  # the training split is read from the partition
    assert f"{run / name}: is a FIFO (named pipe), not a regular file" in one_line(code, err)
    tally("hostile files refused")


@pytest.mark.parametrize("name,size,words", [("config.json", 17 << 20, "more than a JSON file can be"),
                                             ("metrics.jsonl", 257 << 20, "more than a metrics log can be")])
def test_oversized_run_files_are_refused_before_reading(run, name, size, words):
    with open(run / name, "r+b") as fh:  # sparse: nothing is written to the disk
        fh.truncate(size)
    with deadline(), pytest.raises(CheckpointError, match=re.escape(words)) as info:
        fl.load_run(run).metrics  # noqa: B018
    assert str(run / name) in str(info.value)
    tally("hostile files refused")


def test_special_checkpoint_and_data_files_are_refused(tmp_path):
    for kind in sorted(SPECIAL):
        words = replace_with(tmp_path / f"{kind}.safetensors", kind)
        expected = re.escape(words) if kind != "folder" else "is a directory"
        with deadline(), pytest.raises(CheckpointError, match=expected):
            load_state_dict(tmp_path / f"{kind}.safetensors")
        replace_with(tmp_path / f"{kind}.npz", kind)
        with deadline(), pytest.raises(DataError, match=re.escape(words)):
            load_tensor_file(tmp_path / f"{kind}.npz")
    tally("hostile files refused", 2 * len(SPECIAL))


# ---------------------------------------------------------------------------------- caches
@pytest.fixture
def cache_dir(tmp_path) -> Path:
    folder = tmp_path / "cache"
    cache = Cache(folder)
    cache.save_result("r", _plane_free_result())
    cache.add_points("p", 4, np.arange(4), np.ones(4), np.ones(4), force=True)
    return folder


@pytest.mark.parametrize("kind", sorted(SPECIAL))
def test_special_cache_marker_is_refused(cache_dir, kind):
    words = replace_with(cache_dir / "landscape-cache.json", kind)
    with deadline(), pytest.raises(CacheError, match=re.escape(words)) as info:
        Cache(cache_dir)
    assert str(cache_dir / "landscape-cache.json") in str(info.value)
    tally("hostile files refused")


@pytest.mark.parametrize("kind", sorted(SPECIAL))
def test_special_cache_entry_is_a_cache_error(cache_dir, kind):
    """A folder as an entry gave a raw IsADirectoryError (``landscape: error: 3: Is a directory``)."""
    words = replace_with(cache_dir / "result-r.h5", kind)
    with deadline(), pytest.raises(CacheError, match=re.escape(words)):
        Cache(cache_dir).load_result("r")
    replace_with(cache_dir / "points-p.h5", kind)
    with deadline(), pytest.raises(CacheError, match=re.escape(words)):
        Cache(cache_dir).points("p", 4)
    tally("hostile files refused", 2)


def test_cli_cache_that_is_a_fifo_or_has_a_fifo_marker(run, tmp_path, capsys):
    fifo = tmp_path / "cache-fifo"
    os.mkfifo(fifo)
    base = ["path", "--run", str(run), "--models", "client:0", "client:1", "--alphas", "3",
            "--out", str(tmp_path / "o")]
    code, err = cli([*base, "--cache", str(fifo)], capsys)
    assert f"{fifo}: is a FIFO (named pipe), not a regular file" in one_line(code, err)
    folder = tmp_path / "cache"
    folder.mkdir()
    os.mkfifo(folder / "landscape-cache.json")
    code, err = cli([*base, "--cache", str(folder)], capsys)
    assert "landscape-cache.json: is a FIFO (named pipe)" in one_line(code, err)
    tally("hostile files refused", 2)


def test_cli_cache_entry_that_is_a_folder(run, tmp_path, capsys):
    base = ["path", "--run", str(run), "--models", "client:0", "client:1", "--alphas", "3",
            "--out", str(tmp_path / "o"), "--cache", str(tmp_path / "c")]
    assert cli(base, capsys)[0] == 0
    entries = sorted((tmp_path / "c").glob("points-*.h5"))
    assert entries
    for entry in entries:
        replace_with(entry, "folder")
    code, err = cli(base, capsys)
    line = one_line(code, err)
    assert "points-" in line and "is a folder, not a regular file" in line and "Is a directory" not in line
    tally("hostile files refused")


def _zero_seal(path: Path) -> bytes:
    data = bytearray(path.read_bytes())
    data[:512] = bytes(512)
    path.write_bytes(bytes(data))
    return bytes(data)


def test_cache_files_without_a_seal_are_refused(cache_dir, tmp_path):
    """A format-1 file with its user block zeroed used to be parsed unchecked (byte flips gave wrong numbers).

    A sealed entry with its seal zeroed likewise.
    """
    legacy = tmp_path / "old.h5"
    shutil.copyfile(Path(__file__).parent / "data" / "cache_format1.h5", legacy)
    data = _zero_seal(legacy)
    with pytest.raises(CacheError, match="has no checksum.*delete it to recompute") as info:
        Cache(legacy)
    assert str(legacy) in str(info.value)
    flips = 0
    for offset in range(600, len(data), max(1, (len(data) - 600) // 40)):
        flipped = bytearray(data)
        flipped[offset] ^= 0xFF
        legacy.write_bytes(bytes(flipped))
        with pytest.raises(CacheError, match="has no checksum"):
            Cache(legacy)
        flips += 1
    _zero_seal(cache_dir / "result-r.h5")
    with pytest.raises(CacheError, match="result-r.h5: has no checksum"):
        Cache(cache_dir).load_result("r")
    tally("corrupt inputs tried", flips + 2)


# ------------------------------------------------------------------------- data folder
def test_a_linked_data_folder_is_followed_and_cached(tmp_path, monkeypatch):
    import fl.mnist1d as mnist1d
    from fl.datasets import load_dataset

    real = tmp_path / "bigdisk"
    real.mkdir()
    (tmp_path / "data").symlink_to(real)
    monkeypatch.setenv("LANDSCAPE_DATA", str(tmp_path / "data"))
    first = load_dataset("mnist1d")
    assert [p.name for p in real.iterdir()] == [mnist1d.cache_path(real).name]

    def no_generation():
        raise AssertionError("the cache was not used")

    monkeypatch.setattr(mnist1d, "generate", no_generation)
    again = load_dataset("mnist1d")  # read from the cache written through the user's link
    assert torch.equal(first.train_x, again.train_x)


# ------------------------------------------------------------------------- over-long numbers
HUGE_INT = "1" * 5001  # Python's int() refuses more than 4,300 digits with a ValueError


@pytest.mark.parametrize("name", ["manifest.json", "config.json", "progress.json", "metrics.jsonl"])
def test_an_integer_of_5001_digits_in_a_run_file_is_refused_on_one_line(run, name, capsys):
    """Refused as a damaged file, not with Python's ValueError advising sys.set_int_max_str_digits()."""
    text = (run / name).read_text()
    forged = re.sub(r'"(round|rounds)": ?\d+', rf'"\1": {HUGE_INT}', text, count=1)
    assert forged != text
    (run / name).write_text(forged)
    words = "an integer of 5,001 digits (Python converts at most 4,300; this toolkit never writes one)"
    with deadline(), pytest.raises(CheckpointError) as info:
        fl.load_run(run).metrics  # noqa: B018 (reads metrics.jsonl)
    message = str(info.value)
    assert message.startswith(f"{run / name}: ") and words in message and "\n" not in message
    assert "set_int_max_str_digits" not in message
    code, err = cli(["report", "--run", str(run), "--resolution", "3", "--alphas", "3"], capsys)
    assert f"{run / name}: " in one_line(code, err) and words in err
    tally("hostile files refused", 2)
