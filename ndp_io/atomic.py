"""Atomic file replacement: staged temporary files, renamed into place, removed on failure or signal; scratch
directories (:func:`temporary_directory`) removed the same way.

:func:`staged_file` is the primitive (a temporary file in the target's directory that becomes the target only
when :meth:`Staged.commit` is called); :func:`atomic_write` commits when its block ends without an error.
Writers of several files that must change together (a model and its weights) stage each and commit them in
the order that keeps every intermediate state consistent (see :mod:`graph_passes.model_io`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import signal
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ndp_io.errors import OutputWriteError
from ndp_io.guard import PathLike, check_output_path

TEMP_SUFFIX = ".ndp-tmp"
_TEMP_NAME = re.compile(r"^\..*\.(?P<host>[0-9a-f]{4})-(?P<pid>\d+)\.[0-9a-f]{8}" + re.escape(TEMP_SUFFIX) + r"$")
_TARGET_PREFIX_CHARS = 100  # keeps the temporary name under NAME_MAX whatever the target's length
# errno values that mean "this output cannot be written" rather than a bug: reported in one line
_WRITE_ERRNOS = {
    errno.ENOSPC,
    errno.EROFS,
    errno.EACCES,
    errno.EPERM,
    errno.ENAMETOOLONG,
    errno.EDQUOT,
    errno.EFBIG,
    errno.EIO,
    errno.EISDIR,
    errno.ENOTDIR,
    errno.ENOENT,
}

_live_lock = threading.Lock()
_live_temps: set[str] = set()
_live_dirs: set[str] = set()
_signal_depth = 0
_previous_handlers: dict[int, Any] = {}


@functools.cache
def _host_tag() -> str:
    """Four hex digits naming this host in temporary names: pids are only comparable on one host (and in one pid
    namespace: containers have their own host names). Computed on first use: ``hashlib`` loads OpenSSL, a cost
    every command would otherwise pay at start-up whether or not it writes a file."""
    import hashlib
    import socket

    return hashlib.blake2b(socket.gethostname().encode(), digest_size=2).hexdigest()


def _describe(exc: OSError, target: Path) -> OutputWriteError:
    reason = exc.strerror or type(exc).__name__
    return OutputWriteError(f"cannot write {target}: {reason}")


def new_temp_path(target: PathLike) -> Path:
    """A fresh hidden temporary path beside ``target`` carrying this process's id (for stale cleanup)."""
    target = Path(target)
    prefix = target.name[:_TARGET_PREFIX_CHARS]
    return target.with_name(f".{prefix}.{_host_tag()}-{os.getpid()}.{os.urandom(4).hex()}{TEMP_SUFFIX}")


def _pid_alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill(pid, 0) is not a probe on Windows: never treat a file as stale there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def clean_stale_temp_files(directory: PathLike) -> list[Path]:
    """Remove this package's temporary files in ``directory`` whose writing process no longer runs.

    Only names of the form ``.NAME.<host tag>-<pid>.<8 hex>.ndp-tmp`` written on this host are considered, so no
    other file (nor a live writer's on another machine or container sharing the directory) is ever touched;
    returns the files removed.
    """
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP_NAME.match(entry.name)
        if match is None or match["host"] != _host_tag():
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or _pid_alive(pid):
            continue
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


def _remove_live_temps() -> None:
    with _live_lock:
        names = list(_live_temps)
        folders = list(_live_dirs)
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(name)
    import shutil

    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def temporary_directory(prefix: str) -> Iterator[Path]:
    """A fresh scratch directory (``tempfile.mkdtemp``), removed with its contents when the block ends, on any
    exception, and on SIGTERM, SIGINT and SIGHUP (by the handler of :func:`remove_on_signal`, which then lets the
    signal act as before): the one place every command's scratch space (``generate``, ``demo``) is cleaned up."""
    with remove_on_signal():
        folder = scratch_directory(prefix)
        try:
            yield folder
        finally:
            remove_scratch_directory(folder)


def scratch_directory(prefix: str) -> Path:
    """A fresh scratch directory (``tempfile.mkdtemp``) that outlives a block (an object's spool): the caller
    removes it with :func:`remove_scratch_directory`; like :func:`temporary_directory`'s, it is removed on
    SIGTERM, SIGINT and SIGHUP while :func:`remove_on_signal` is active. Its name carries this process's id, so a
    later call removes what a killed process (SIGKILL, a crash: no handler ran) left under the same prefix."""
    import tempfile

    remove_stale_scratch(prefix)
    folder = tempfile.mkdtemp(prefix=f"{prefix}pid{os.getpid()}-")
    with _live_lock:
        _live_dirs.add(folder)
    return Path(folder)


def remove_stale_scratch(prefix: str) -> int:
    """Remove the :func:`scratch_directory` folders under ``prefix`` whose process is gone: real directories (not
    links) in the temporary directory, owned by this user, named ``<prefix>pid<N>-...`` where no process ``N``
    runs. A live process's (or one that cannot be told) is kept. Returns how many were removed."""
    import shutil
    import tempfile

    removed = 0
    pattern = re.compile(re.escape(prefix) + r"pid(\d+)-")
    root = Path(tempfile.gettempdir())
    try:
        names = [entry.name for entry in os.scandir(root) if entry.name.startswith(prefix)]
    except OSError:
        return 0
    for name in names:
        match = pattern.match(name)
        if match is None or int(match.group(1)) == os.getpid() or _process_alive(int(match.group(1))):
            continue
        path = root / name
        try:
            info = path.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


def _process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (or may: one this user cannot signal counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True
    return True


def remove_scratch_directory(folder: PathLike) -> None:
    """Remove a :func:`scratch_directory` with its contents (nothing if it is gone already)."""
    import shutil

    with _live_lock:
        _live_dirs.discard(str(folder))
    shutil.rmtree(folder, ignore_errors=True)


def _on_signal(signum: int, frame: Any) -> None:
    _remove_live_temps()
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    signal.signal(signum, signal.SIG_DFL)  # die of the same signal, as the default action would
    os.kill(os.getpid(), signum)


def _handled_signals() -> tuple[int, ...]:
    names = ("SIGTERM", "SIGINT", "SIGHUP")
    return tuple(getattr(signal, n) for n in names if hasattr(signal, n))


@contextlib.contextmanager
def remove_on_signal() -> Iterator[None]:
    """While active (and in the main thread), SIGTERM/SIGINT/SIGHUP first delete every live temporary file,
    then act as before (the previous handler runs, or the process dies of the signal). Re-entrant."""
    global _signal_depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _signal_depth == 0:
        for signum in _handled_signals():
            try:
                _previous_handlers[signum] = signal.signal(signum, _on_signal)
            except (ValueError, OSError):  # not allowed here (embedded interpreter)
                continue
    _signal_depth += 1
    try:
        yield
    finally:
        _signal_depth -= 1
        if _signal_depth == 0:
            for signum, previous in list(_previous_handlers.items()):
                with contextlib.suppress(ValueError, OSError, TypeError):
                    signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            _previous_handlers.clear()


def fsync_directory(directory: PathLike) -> None:
    """Make a rename in ``directory`` durable (no-op where directories cannot be opened)."""
    if os.name == "nt":
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Staged:
    """A temporary file that replaces ``target`` on :meth:`commit`; see :func:`staged_file`."""

    def __init__(self, target: Path, temp: Path, file: IO[Any]) -> None:
        self.target, self.temp, self.file = target, temp, file
        self.committed = False

    def commit(self) -> Path:
        """Flush, fsync, close and rename over the target (atomic on POSIX); returns the target."""
        try:
            if not self.file.closed:
                self.file.flush()
                os.fsync(self.file.fileno())
                self.file.close()
            os.replace(self.temp, self.target)
        except OSError as exc:
            if exc.errno in _WRITE_ERRNOS:
                raise _describe(exc, self.target) from None
            raise
        self.committed = True
        with _live_lock:
            _live_temps.discard(os.fspath(self.temp))
        fsync_directory(self.target.parent)
        return self.target


@contextlib.contextmanager
def staged_file(target: PathLike, mode: str = "wb", encoding: str | None = None) -> Iterator[Staged]:
    """Yield a :class:`Staged` temporary file for ``target``; it is deleted unless committed in the block.

    The temporary file is created with mode ``0o666`` minus the umask (what ``open`` gives), in the target's
    directory (so the rename is atomic). Stale temporary files of killed processes in that directory are
    removed first. Write errors (full disk, read-only file system, ...) become :class:`OutputWriteError`.
    """
    target = check_output_path(target)
    clean_stale_temp_files(target.parent)
    with remove_on_signal():
        while True:
            temp = new_temp_path(target)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
            try:
                fd = os.open(temp, flags, 0o666)
            except FileExistsError:
                continue
            except OSError as exc:
                raise _describe(exc, target) from None
            break
        with _live_lock:
            _live_temps.add(os.fspath(temp))
        staged: Staged | None = None
        try:
            handle = os.fdopen(fd, mode, encoding=encoding) if "b" not in mode else os.fdopen(fd, mode)
            staged = Staged(target, temp, handle)
            try:
                yield staged
            except OSError as exc:
                if exc.errno in _WRITE_ERRNOS and exc.filename in (None, os.fspath(temp)):
                    raise _describe(exc, target) from None
                raise
        finally:
            if staged is not None and not staged.file.closed:
                with contextlib.suppress(OSError):
                    staged.file.close()
            if staged is None or not staged.committed:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                with _live_lock:
                    _live_temps.discard(os.fspath(temp))


@contextlib.contextmanager
def atomic_write(target: PathLike, mode: str = "wb", encoding: str | None = None) -> Iterator[IO[Any]]:
    """``with atomic_write(path) as f: f.write(...)``: ``path`` holds the old or the complete new content."""
    with staged_file(target, mode, encoding) as staged:
        yield staged.file
        staged.commit()


def write_bytes(target: PathLike, data: bytes) -> Path:
    """Replace ``target`` atomically with ``data``; returns the target."""
    with atomic_write(target, "wb") as handle:
        handle.write(data)
    return Path(target)


def write_text(target: PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Replace ``target`` atomically with ``text``; returns the target. A character the encoding cannot hold (a
    lone surrogate: a byte of a file name that is not UTF-8, quoted in a report) is written as its ``\\uXXXX``
    escape, which JSON reads back as that character."""
    data = text.encode(encoding, errors="backslashreplace")
    with atomic_write(target, "wb") as handle:
        handle.write(data)
    return Path(target)


@contextlib.contextmanager
def directory_lock(directory: PathLike) -> Iterator[None]:
    """Exclusive advisory lock on ``directory`` (``flock`` on its descriptor; no lock file is created).

    Serialises writers that replace several files together in one directory; a no-op where ``fcntl`` is
    unavailable.
    """
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
