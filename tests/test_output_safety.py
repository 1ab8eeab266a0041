"""Reports and figures are written through the link-safe primitive (issue 15 items 1 and 2):
links planted in a report folder never redirect a write, and a full or read-only output folder
gives one clear line naming the path."""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

import figures as F  # noqa: E402
from landscape import FileWriteError  # noqa: E402
from landscape.results.base import PathResult  # noqa: E402

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
    """The old writer used the fixed name ``.index.html.tmp``: a link there overwrote the outside
    file and ``index.html`` became a link to it."""
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
    """Issue 15 item 1: ``landscape report`` overwrote files that links in ``report/`` pointed to."""
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
