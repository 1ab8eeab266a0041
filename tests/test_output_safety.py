"""Reports and figures are written through the link-safe primitive.

Links planted in a report folder never redirect a write, and a full or read-only output folder
gives one clear line naming the path.
"""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

import figures as F  # noqa: E402
from landscape import FileWriteError  # noqa: E402
from landscape.results import PathResult  # noqa: E402

OUTSIDE = b"an unrelated file of the user\n"


@pytest.fixture
def outside(tmp_path) -> Path:
    path = tmp_path / "outside.txt"
    path.write_bytes(OUTSIDE)
    return path


def _path_result() -> PathResult:
    alphas = np.linspace(0, 1, 5)
    return PathResult(alphas=alphas, loss=1 + np.sin(np.pi * alphas), accuracy=1 - alphas / 4)


def _figures():
    return {"path.png": F.path_figure({"a": _path_result()}), "path.html": F.path_plotly({"a": _path_result()})}


def test_report_page_never_follows_planted_links(tmp_path, outside):
    """The old writer used the fixed name ``.index.html.tmp``.

    A link there overwrote the outside file and ``index.html`` became a link to it.
    """
    report = tmp_path / "report"
    report.mkdir()
    (report / ".index.html.tmp").symlink_to(outside)
    page = F.Report("t").add_text("hello")
    page.write(report / "index.html")
    assert outside.read_bytes() == OUTSIDE and not (report / "index.html").is_symlink()
    assert "hello" in (report / "index.html").read_text()
    (report / "index.html").unlink()
    (report / "index.html").symlink_to(outside)
    with pytest.raises(FileWriteError, match="index.html: is a symbolic link"):
        page.write(report / "index.html")
    assert outside.read_bytes() == OUTSIDE


@pytest.mark.parametrize("name", ["path.png", "path.html"])
def test_figures_never_follow_planted_links(tmp_path, outside, name):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).symlink_to(outside)
    with pytest.raises(FileWriteError, match=f"{name}: is a symbolic link"):
        F.save(_figures()[name], out / name)
    assert outside.read_bytes() == OUTSIDE
    stem = Path(name).stem
    for guess in (f".{stem}.tmp", f".{name}.tmp", f".{name}.tmp-{os.getpid()}"):  # fixed-name guesses
        (out / guess).symlink_to(outside)
    (out / name).unlink()
    F.save(_figures()[name], out / name)
    assert outside.read_bytes() == OUTSIDE and (out / name).stat().st_size > 1000


@pytest.mark.parametrize("code,words", [(errno.ENOSPC, "the disk is full"), (errno.EROFS, "read-only")])
@pytest.mark.parametrize("name", ["path.png", "path.html"])
def test_figures_to_a_full_or_read_only_folder_give_one_line(tmp_path, monkeypatch, code, words, name):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_bytes(b"previous figure")

    def failing(fd: int, data) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "write", failing)
    with pytest.raises(FileWriteError) as info:
        F.save(_figures()[name], out / name)
    message = str(info.value)
    assert message.startswith(f"{out / name}: cannot write ") and "bytes" in message and words in message
    assert "\n" not in message
    assert (out / name).read_bytes() == b"previous figure" and sorted(p.name for p in out.iterdir()) == [name]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    import fl

    out = tmp_path_factory.mktemp("run") / "run"
    fl.run("fedavg", dataset="digits", clients=3, rounds=1, batch_size=64, lr=0.1, seed=1, out=out, progress=False)
    return out


@pytest.mark.parametrize("planted", ["report.json", "index.html", ".index.html.tmp", "report"])
def test_landscape_report_refuses_or_avoids_planted_links(tiny_run, tmp_path, outside, planted, capsys):
    """``landscape report`` once overwrote files that links in ``report/`` pointed to."""
    from landscape_cli.main import main

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)  # a copy of the run: the report folder is made per test
    (run / "report").mkdir()
    if planted == "report":
        (run / "report").rmdir()
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (run / "report").symlink_to(elsewhere)
    else:
        (run / "report" / planted).symlink_to(outside)
    code = main(["report", "--run", str(run), "--resolution", "3", "--alphas", "3", "--no-cache"])
    err = capsys.readouterr().err
    assert outside.read_bytes() == OUTSIDE
    if planted == ".index.html.tmp":  # not a name the writer uses: the report is written
        assert code == 0, err
        assert not (run / "report" / "index.html").is_symlink() and (run / "report" / "report.json").is_file()
    else:
        assert code != 0 and "is a symbolic link" in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1
    if planted == "report":
        assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.fixture
def full_fs(tmp_path):
    """A 256 KiB tmpfs filled to the last byte (root only)."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)]).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 512):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def _cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("landscape")
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> list[Path]:
    from fl.models import build_model
    from landscape import save_state_dict

    folder = tmp_path_factory.mktemp("ckpt")
    return [save_state_dict(build_model("mlp", num_classes=10, input_shape=(1, 8, 8), seed=s).state_dict(),
                            folder / f"m{s}.pt") for s in (0, 1)]


def test_cli_cache_on_a_full_disk_fails_in_one_line_twice_and_leaves_nothing(full_fs, checkpoints, tmp_path):
    """Once: an uncaught h5py OSError, then a segmentation fault (exit 139) on the second run.

    And temporary cache files filling the rest of the disk.
    """
    args = ["path", "--module", "mlp", "--checkpoints", *checkpoints, "--data", "digits", "--alphas", 5,
            "--out", tmp_path / "out", "--cache", full_fs / "cache"]
    for _ in range(2):
        proc = _cli(args)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert lines[0].startswith(f"landscape: error: {full_fs / 'cache'}") and "the disk is full" in lines[0]
        assert "bytes" in lines[0]
        assert [p for p in full_fs.rglob("*") if ".tmp-" in p.name] == []


def test_cli_figures_to_a_read_only_out_folder_fail_in_one_line(checkpoints, tmp_path):

    if os.geteuid() != 0:
        pytest.skip("remounting needs root")
    out = tmp_path / "ro"
    out.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(out)]).returncode:
        pytest.skip("cannot mount a tmpfs")
    try:
        procs = [_cli(["path", "--module", "mlp", "--checkpoints", *checkpoints, "--data", "digits", "--alphas", 5,
                       "--out", folder, "--no-cache"]) for folder in (out, out / "new" / "sub")]
    finally:
        subprocess.run(["umount", "-l", str(out)], check=True)
    for proc in procs:  # an existing folder, and one that would have to be created
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert lines[0].startswith(f"landscape: error: {out}") and "read-only" in lines[0]


def test_default_output_folders_are_ignored_by_git():
    """What the CLI, the examples, the demo and fl write by default never shows up as untracked files."""
    from landscape_cli.output import OutputOptions

    root = Path(__file__).resolve().parents[1]
    ignored = set((root / ".gitignore").read_text().split())
    defaults = {OutputOptions().out, "examples_out", "report", "runs"}
    assert {f"{d}/" for d in defaults} <= ignored
