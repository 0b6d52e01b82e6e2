"""File-safety primitives shared by every package: atomic writes and never clobbering an input.

``ndp_io`` imports only the standard library, so ``hw_model`` (no onnx), ``graph_passes`` (no timing) and
``ndp_ep`` can all use it. What it promises:

* :func:`atomic_write` / :func:`write_bytes` / :func:`write_text`: a file is replaced by a complete new
  version or not at all. The new bytes go to a hidden temporary file in the target's directory
  (``.NAME.<host tag>-<pid>.<random>.ndp-tmp``), are flushed and fsynced, and are renamed over the target; the file gets
  the permissions a plain ``open(..., "w")`` would give (``0o666`` minus the umask). The temporary file is
  removed on any exception, on SIGINT and on SIGTERM; one left by a process killed with SIGKILL is removed
  by the next write into the same directory (its pid is no longer alive).
* :func:`check_no_clobber`: before a command writes anything, each output path is compared (by real path
  and ``os.path.samefile``) with every input file; a match raises :class:`ClobberError`.
* Writing errors (full disk, read-only file system, permission denied, a name too long, an empty name)
  raise :class:`OutputWriteError` with one line naming the path and the cause.
* :func:`available_memory_bytes`: the bound sizes read from files (``.npz`` headers) are checked against.
"""

from ndp_io.atomic import (
    TEMP_SUFFIX,
    atomic_write,
    clean_stale_temp_files,
    directory_lock,
    fsync_directory,
    new_temp_path,
    remove_on_signal,
    remove_scratch_directory,
    scratch_directory,
    staged_file,
    temporary_directory,
    write_bytes,
    write_text,
)
from ndp_io.errors import ClobberError, FileSafetyError, OutputWriteError
from ndp_io.guard import check_no_clobber, check_output_path
from ndp_io.resources import available_memory_bytes

__all__ = [
    "TEMP_SUFFIX",
    "ClobberError",
    "FileSafetyError",
    "OutputWriteError",
    "atomic_write",
    "available_memory_bytes",
    "check_no_clobber",
    "check_output_path",
    "clean_stale_temp_files",
    "directory_lock",
    "fsync_directory",
    "new_temp_path",
    "remove_on_signal",
    "remove_scratch_directory",
    "scratch_directory",
    "staged_file",
    "temporary_directory",
    "write_bytes",
    "write_text",
]
