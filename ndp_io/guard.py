"""Output-path checks made before anything is written: a usable file name, and never one of the inputs."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ndp_io.errors import ClobberError, OutputWriteError
from ndp_io.limits import MAX_PATH_BYTES, limit_note

NAME_MAX_DEFAULT = 255

PathLike = str | os.PathLike[str]


def _name_max(directory: Path) -> int:
    try:
        return int(os.pathconf(directory, "PC_NAME_MAX"))
    except (AttributeError, OSError, ValueError):
        return NAME_MAX_DEFAULT


def check_output_path(path: PathLike) -> Path:
    """``path`` as a :class:`Path` when a file can be created there; :class:`OutputWriteError` otherwise.

    Rejects an empty path, a name that is not a file name (``.``, ``..``, a trailing separator), a name longer
    than the file system allows (255 bytes on most), a directory that does not exist and an existing directory.
    """
    text = os.fspath(path)
    if not text or not text.strip():
        raise OutputWriteError("output path is empty")
    if "\0" in text:
        raise OutputWriteError(f"output path contains a NUL character: {shown_path(text)!r}")
    if len(os.fsencode(text)) > MAX_PATH_BYTES:
        raise OutputWriteError(
            f"cannot write {shown_path(text)}: the path is longer than {MAX_PATH_BYTES} bytes "
            f"{limit_note('MAX_PATH_BYTES')}"
        )
    target = Path(text)
    if target.name in ("", ".", "..") or text.endswith(("/", os.sep)):
        raise OutputWriteError(f"output path is not a file name: {shown_path(text)}")
    directory = target.parent
    limit = _name_max(directory) if _is_dir(directory) else NAME_MAX_DEFAULT
    if len(os.fsencode(target.name)) > limit:
        raise OutputWriteError(f"cannot write {text[:60]}...: the file name is longer than {limit} bytes")
    if not _is_dir(directory):
        raise OutputWriteError(
            f"cannot write {shown_path(text)}: directory {shown_path(str(directory))} does not exist"
        )
    if _is_dir(target):
        raise OutputWriteError(f"cannot write {shown_path(text)}: it is a directory")
    if not os.access(directory, os.W_OK | os.X_OK):  # found before the work, not after it
        raise OutputWriteError(f"cannot write {shown_path(text)}: permission denied in {shown_path(str(directory))}")
    return target


def check_output_dir(path: PathLike) -> Path:
    """``path`` as a :class:`Path` when a command can create (or fill) a directory there, checked before any work:
    no file of that name, the nearest existing ancestor a directory this process may write in, a usable length.
    :class:`OutputWriteError` otherwise."""
    text = os.fspath(path)
    if not text.strip():
        raise OutputWriteError("output directory is empty")
    if "\0" in text or len(os.fsencode(text)) > MAX_PATH_BYTES:
        raise OutputWriteError(f"cannot create {shown_path(text)}: not a usable path {limit_note('MAX_PATH_BYTES')}")
    target = Path(text)
    ancestor = target
    while not os.path.lexists(ancestor) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if ancestor == target and not _is_dir(target):
        raise OutputWriteError(f"{shown_path(text)} is a file, not a directory")
    if not _is_dir(ancestor):
        raise OutputWriteError(f"cannot create {shown_path(text)}: {shown_path(str(ancestor))} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputWriteError(f"cannot create {shown_path(text)}: permission denied in {shown_path(str(ancestor))}")
    return target


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):  # a component longer than the file system allows, ...
        return False


def shown_path(text: str, most: int = 200) -> str:
    """``text`` as shown in a one-line error: whole up to ``most`` characters, else its start and its length."""
    return text if len(text) <= most else f"{text[: most - 40]}...({len(text):,} characters)"


def _same_file(a: Path, b: Path) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)  # hard links, bind mounts, case-insensitive file systems
    except OSError:
        return False


def check_no_clobber(outputs: Iterable[PathLike | None], inputs: Iterable[PathLike | None]) -> None:
    """Raise :class:`ClobberError` when an output path is an input file, or two outputs are the same file.

    Call it before writing anything, with every file the command will write (or replace, or delete) and every
    file it reads: the model, its external-data files, feeds. ``None`` entries are ignored, as are inputs that
    do not exist (nothing to destroy).
    """
    out_paths = [Path(os.fspath(p)) for p in outputs if p is not None and os.fspath(p)]
    in_paths = [Path(os.fspath(p)) for p in inputs if p is not None and os.fspath(p)]
    in_paths = [p for p in in_paths if p.exists()]
    for position, out in enumerate(out_paths):
        for inp in in_paths:
            if _same_file(out, inp):
                raise ClobberError(f"output {out} would overwrite the input {inp}; write it elsewhere")
        for other in out_paths[position + 1 :]:
            if os.path.realpath(out) == os.path.realpath(other) or _same_file(out, other):
                raise ClobberError(f"two outputs are the same file: {out} and {other}")


def inside_folder(folder: PathLike, path: PathLike) -> Path | None:
    """``path`` resolved (symbolic links followed) when it lies inside ``folder`` (also resolved), else None.

    The containment check of every file ndp-ep reads beside a model (GenAI side files, the config, the decoder):
    a link whose target is outside the folder, a link loop or a missing target gives None, so the caller refuses
    it without opening the target."""
    try:
        base = Path(os.path.realpath(folder))
        resolved = Path(os.path.realpath(path, strict=True))
    except (OSError, RuntimeError, ValueError):
        return None
    return resolved if resolved == base or base in resolved.parents else None
