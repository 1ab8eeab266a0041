"""Link-safe atomic writes.

Links planted at the target, at temporary names and as the folder never redirect a write; a
full or read-only disk gives one clear error, leaves no temporary file and keeps the previous
file.
"""
from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest

from landscape import FileWriteError
from landscape.infra import files
from landscape.infra.files import exclusive_lock, open_lock, write_atomic, write_json, write_text

OUTSIDE = b"precious data outside the folder\n"


@pytest.fixture
def outside(tmp_path) -> Path:
    """A file outside the folder the tests write to, which must never change."""
    path = tmp_path / "outside.txt"
    path.write_bytes(OUTSIDE)
    return path


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if files.is_temporary(p.name))


def test_write_replaces_content_and_keeps_mode(tmp_path):
    target = tmp_path / "d" / "f.bin"
    write_atomic(target, b"one")
    assert target.read_bytes() == b"one"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~0o022  # the test runner's umask
    target.chmod(0o600)
    write_atomic(target, memoryview(b"two-two"))
    assert target.read_bytes() == b"two-two" and stat.S_IMODE(target.stat().st_mode) == 0o600
    write_json(tmp_path / "d" / "v.json", {"b": [1, 2.5], "a": None})
    assert json.loads((tmp_path / "d" / "v.json").read_text()) == {"b": [1, 2.5], "a": None}
    write_text(tmp_path / "d" / "t.txt", "naïve\n")
    assert (tmp_path / "d" / "t.txt").read_text(encoding="utf-8") == "naïve\n"
    assert _leftovers(tmp_path / "d") == []


def test_symlink_at_the_target_is_refused_and_the_outside_file_untouched(tmp_path, outside):
    target = tmp_path / "report.json"
    target.symlink_to(outside)
    with pytest.raises(FileWriteError, match="symbolic link") as info:
        write_text(target, "{}")
    assert str(target) in str(info.value)
    assert outside.read_bytes() == OUTSIDE and target.is_symlink()
    assert _leftovers(tmp_path) == []


def test_links_planted_at_temporary_names_are_never_followed(tmp_path, outside, monkeypatch):
    """The old writers used fixed names (``.index.html.tmp``, ``.<name>.tmp-<pid>``).

    Plant links at those and at the first random names the writer will draw: it skips them and
    writes its own file.
    """
    target = tmp_path / "index.html"
    for name in (".index.html.tmp", f".index.html.tmp-{os.getpid()}"):
        (tmp_path / name).symlink_to(outside)
    drawn = iter(["aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"])
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: next(drawn))
    for name in ("aaaaaaaaaaaa", "bbbbbbbbbbbb"):  # the writer's first two choices are taken by links
        (tmp_path / f".index.html{files.TEMP_MARKER}{name}").symlink_to(outside)
    write_text(target, "<html></html>")
    assert target.read_text() == "<html></html>" and not target.is_symlink()
    assert outside.read_bytes() == OUTSIDE


def test_a_folder_that_is_a_link_is_refused(tmp_path, outside):
    real = tmp_path / "elsewhere"
    real.mkdir()
    (tmp_path / "report").symlink_to(real)
    with pytest.raises(FileWriteError, match="report: is a symbolic link.*real folder"):
        write_text(tmp_path / "report" / "index.html", "x")
    assert list(real.iterdir()) == []


def test_a_folder_or_a_target_that_is_not_a_file_is_refused(tmp_path):
    (tmp_path / "plain").write_text("a file")
    with pytest.raises(FileWriteError, match="plain: is not a folder"):
        write_text(tmp_path / "plain" / "x.json", "{}")
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(FileWriteError, match="not a regular file"):
        write_text(tmp_path / "dir.json", "{}")


@pytest.mark.parametrize("code,words", [(errno.ENOSPC, "the disk is full"), (errno.EDQUOT, "quota"),
                                        (errno.EROFS, "read-only"), (errno.EACCES, "permission denied")])
def test_a_failing_write_gives_one_clear_error_and_keeps_the_old_file(tmp_path, monkeypatch, code, words):
    target = tmp_path / "data.bin"
    target.write_bytes(b"old content")
    real_write = os.write

    def failing_write(fd: int, data) -> int:
        if len(data) > 1000:
            raise OSError(code, os.strerror(code))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(FileWriteError) as info:
        write_atomic(target, b"x" * 2_500_000)
    message = str(info.value)
    assert message.startswith(f"{target}: cannot write 2.5 MB (2,500,000 bytes): ") and words in message
    assert "\n" not in message and "intact" in message
    assert target.read_bytes() == b"old content" and _leftovers(tmp_path) == []


@pytest.mark.parametrize("code,cause,remedy", [
    (errno.ENOSPC, "the disk is full", "free space or choose another location"),
    (errno.EDQUOT, "the disk quota is exceeded", "free space or choose another location"),
    (errno.EROFS, "the location is not writable (read-only file system)", "choose a writable location"),
    (errno.EACCES, "the location is not writable (permission denied)", "choose a writable location"),
    (errno.ENOENT, "the location accepts no new files (ENOENT", "choose another location"),
    (errno.EIO, "Input/output error (EIO)", "choose another location"),
])
def test_only_a_full_disk_is_told_to_free_space(tmp_path, monkeypatch, code, cause, remedy):
    def failing_write(fd: int, data) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(FileWriteError) as info:
        write_atomic(tmp_path / "f.bin", b"x" * 10)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'f.bin'}: cannot write 10 bytes: {cause}") and message.endswith(remedy)
    assert "\n" not in message and _leftovers(tmp_path) == []


def test_short_writes_are_completed(tmp_path, monkeypatch):
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))
    write_atomic(tmp_path / "f", bytes(range(256)) * 3)
    assert (tmp_path / "f").read_bytes() == bytes(range(256)) * 3


def test_lock_files_are_never_opened_through_links_nor_truncated(tmp_path, outside):
    lock = tmp_path / ".lock"
    lock.symlink_to(outside)
    with pytest.raises(FileWriteError, match="symbolic link"):
        open_lock(lock)
    assert outside.read_bytes() == OUTSIDE
    lock.unlink()
    os.link(outside, lock)  # a hard link is opened, but never truncated nor written
    with exclusive_lock(lock, timeout=0, busy=lambda: AssertionError("busy")):
        pass
    assert outside.read_bytes() == OUTSIDE


def test_a_held_lock_gives_the_callers_error_after_the_timeout(tmp_path):
    lock = tmp_path / "x.lock"
    with exclusive_lock(lock, timeout=0, busy=lambda: AssertionError("busy")):
        with pytest.raises(FileWriteError, match="held elsewhere"):
            with exclusive_lock(lock, timeout=0.1, busy=lambda: FileWriteError(lock, "held elsewhere")):
                pass
    with exclusive_lock(lock, timeout=0, busy=lambda: AssertionError("busy")):
        pass  # released when the holder's block ended


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_really_full_disk(tmp_path):
    import subprocess

    mnt = tmp_path / "fs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs")
    try:
        write_text(mnt / "small.txt", "small")
        with pytest.raises(FileWriteError, match="the disk is full"):
            write_atomic(mnt / "small.txt", b"\1" * 200_000)
        assert (mnt / "small.txt").read_text() == "small" and _leftovers(mnt) == []
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)
