"""ndp_io's atomic writes: permissions, one-line errors for unwritable outputs, stale temporary files."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys

import pytest

from ndp_io import (
    TEMP_SUFFIX,
    OutputWriteError,
    atomic_write,
    check_output_path,
    clean_stale_temp_files,
    new_temp_path,
    write_bytes,
    write_text,
)


def _temps(directory):
    return [p for p in directory.iterdir() if p.name.endswith(TEMP_SUFFIX)]


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_files_get_the_permissions_open_would_give(tmp_path, umask):
    previous = os.umask(umask)
    try:
        write_text(tmp_path / "report.html", "x")
        with open(tmp_path / "plain", "w") as handle:
            handle.write("x")
    finally:
        os.umask(previous)
    mode = stat.S_IMODE((tmp_path / "report.html").stat().st_mode)
    assert mode == 0o666 & ~umask == stat.S_IMODE((tmp_path / "plain").stat().st_mode)


def test_replacement_is_all_or_nothing(tmp_path):
    target = tmp_path / "t.bin"
    write_bytes(target, b"old")
    with pytest.raises(RuntimeError), atomic_write(target) as handle:
        handle.write(b"new, half written")
        raise RuntimeError("crash in the middle")
    assert target.read_bytes() == b"old"
    assert _temps(tmp_path) == []
    write_bytes(target, b"new")
    assert target.read_bytes() == b"new"


class _FailingFile:
    """A file object whose writes fail like a full disk or a file system remounted read-only."""

    def __init__(self, real, code: int) -> None:
        self.real, self.code = real, code

    def write(self, data):
        raise OSError(self.code, os.strerror(self.code))

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.mark.parametrize("where", ["write", "fsync"])
@pytest.mark.parametrize(("code", "words"), [(errno.ENOSPC, "No space left"), (errno.EROFS, "Read-only file system")])
def test_full_disk_and_read_only_fs_are_one_line_errors(tmp_path, monkeypatch, code, words, where):
    import ndp_io.atomic

    target = tmp_path / "t.bin"
    write_bytes(target, b"old")
    if where == "write":
        real_fdopen = os.fdopen
        monkeypatch.setattr(ndp_io.atomic.os, "fdopen", lambda *a, **k: _FailingFile(real_fdopen(*a, **k), code))
    else:

        def failing_fsync(fd):
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OutputWriteError, match=words) as caught:
        write_bytes(target, b"x" * 100)
    assert str(caught.value).count("\n") == 0 and str(target) in str(caught.value)
    monkeypatch.undo()
    assert target.read_bytes() == b"old" and _temps(tmp_path) == []


def test_read_only_directory_is_a_one_line_error(tmp_path, monkeypatch):
    real_open = os.open

    def refusing_open(path, flags, mode=0o777, **kwargs):
        if str(path).endswith(TEMP_SUFFIX):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, mode, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    with pytest.raises(OutputWriteError, match="Read-only"):
        write_text(tmp_path / "x.json", "{}")


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("", "empty"),
        (" ", "empty"),
        ("x" * 256, "longer than"),
        ("missing/x.json", "does not exist"),
        (".", "not a file"),
    ],
)
def test_bad_output_names_are_refused_before_writing(tmp_path, monkeypatch, name, words):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputWriteError, match=words):
        check_output_path(name)
    with pytest.raises(OutputWriteError, match=words):
        write_text(name, "x")
    assert list(tmp_path.iterdir()) == []


def test_a_255_byte_name_is_written(tmp_path):
    write_text(tmp_path / ("y" * 255), "ok")
    assert (tmp_path / ("y" * 255)).read_text() == "ok" and _temps(tmp_path) == []


def test_stale_temp_files_of_dead_processes_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    host = new_temp_path(tmp_path / "x").name.split(".")[2].split("-")[0]  # this host's tag
    other_host = "0000" if host != "0000" else "ffff"
    stale = tmp_path / f".out.onnx.{host}-{dead_pid}.0123abcd{TEMP_SUFFIX}"
    live = tmp_path / f".out.onnx.{host}-{os.getppid()}.0123abcd{TEMP_SUFFIX}"
    elsewhere = tmp_path / f".out.onnx.{other_host}-{dead_pid}.0123abcd{TEMP_SUFFIX}"
    foreign = tmp_path / f".out.onnx.{dead_pid}.notours.tmp"
    for path in (stale, live, elsewhere, foreign):
        path.write_bytes(b"x")
    assert clean_stale_temp_files(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and elsewhere.exists() and foreign.exists()


def test_temp_names_fit_any_target_name(tmp_path):
    temp = new_temp_path(tmp_path / ("z" * 255))
    assert len(temp.name) <= 255 and temp.parent == tmp_path and str(os.getpid()) in temp.name


def test_a_killed_process_s_scratch_is_removed_by_the_next_one_and_a_live_one_s_kept(tmp_path, monkeypatch):
    import tempfile

    from ndp_io.atomic import remove_scratch_directory, scratch_directory

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its id names no process now
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        stale = tmp_path / f"ndp-test-spool-pid{dead.pid}-abc"
        (stale / "records").mkdir(parents=True)
        (stale / "records" / "part.jsonl").write_text("{}\n")
        running = tmp_path / f"ndp-test-spool-pid{live.pid}-def"
        running.mkdir()
        other_prefix = tmp_path / f"ndp-other-pid{dead.pid}-ghi"
        other_prefix.mkdir()
        fresh = scratch_directory("ndp-test-spool-")
        assert not stale.exists() and running.exists() and other_prefix.exists()
        assert fresh.name.startswith(f"ndp-test-spool-pid{os.getpid()}-")
        remove_scratch_directory(fresh)
    finally:
        live.kill()
        live.wait()
