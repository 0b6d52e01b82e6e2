"""Model files: load a model safely, resolve its external data inside its folder, save rewritten models.

Graph emission lives in :mod:`graph_passes.rewrite`; this module only reads and writes files.

Loading (:func:`load_model`) never reads a byte outside the model's directory: every external-data
``location`` goes through :func:`external_data_path`, which refuses absolute paths, ``..`` components and
symbolic links that resolve out of the directory (as ``onnx.load`` does), and the model is checked
(:mod:`graph_passes.model_check`) before any work.

Saving (:func:`save_rewritten`) replaces a model and its weights as one unit::

    1. weights → a staged temp file → renamed to a data name no existing file has
       (OUT.onnx.data, or OUT.onnx.<8 hex>.data when that name is taken by the current model's weights)
    2. model (referencing only the new data name) → a staged temp file → renamed over OUT.onnx
    3. the previous data files of OUT.onnx (OUT.onnx.data / OUT.onnx.<hex>.data) are removed

A crash before step 2 leaves the old model reading its untouched old weights; after step 2 the new model
reads the new weights. Step 1 copies each byte at most once in this process (the writers:
:mod:`graph_passes.data_writers`): weights of :data:`DIRECT_MIN_BYTES` or more go past the page cache
(``O_DIRECT``) from writer threads (:class:`_DirectWriter`: aligned row blocks of an expert straight from a
mapping of the source, other row blocks read and column blocks copied into page-aligned buffers); smaller weights,
or a file system without ``O_DIRECT``, go through the page cache (:class:`_DataWriter`: contiguous byte ranges of
a source data file file to file with ``os.copy_file_range``, a column block through a reused buffer).
Temporary files are removed on errors and signals (:mod:`ndp_io`); a data file orphaned by a crash between
steps 1 and 2 is removed by the next save to the same output.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto

from graph_passes.data_writers import _DataWriter, _DirectWriter
from graph_passes.errors import GraphPassError, InvalidModelError
from graph_passes.graph_index import copy_without_initializers
from graph_passes.tensors import (
    element_count,
    external_data_files,
    external_range,
)
from ndp_io import check_output_path, directory_lock, staged_file

if TYPE_CHECKING:
    from collections.abc import Callable

    from graph_passes.rewrite import RewrittenModel

EXTERNAL_THRESHOLD_BYTES = 1_800_000_000
# weights at least this large are streamed to the disk past the page cache (:class:`_DirectWriter`)
DIRECT_MIN_BYTES = 64 * 2**20
DATA_SUFFIX = ".data"


def model_files(source: str | os.PathLike[str]) -> list[Path]:
    """A model file and every external-data file it references: the inputs an output must never replace.

    A model that cannot be read yields just its own path (loading will report the problem).
    """
    path = Path(source)
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # never open a FIFO or a device just to list files
            return [path]
        model = onnx.load(str(path), load_external_data=False)
        return [path, *external_data_files(model, path.parent)]
    except Exception:  # noqa: BLE001 - any failure here is reported by the loader itself, in one line
        return [path]


def load_external_data(model: onnx.ModelProto, base_dir: str | os.PathLike[str] | None) -> None:
    """Read every external initializer's bytes into ``model`` (in place), through :func:`external_range`."""
    for tensor in model.graph.initializer:
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        path, offset, length = external_range(tensor, base_dir)
        with open(path, "rb") as source:
            source.seek(offset)
            raw = source.read(length)
        if len(raw) != length:
            raise InvalidModelError(f"initializer {tensor.name!r}: external data ends early in {path.name}")
        del tensor.external_data[:]
        tensor.data_location = TensorProto.DEFAULT
        tensor.raw_data = raw


# -- loading -----------------------------------------------------------------------------------------------
def _read_error(path: Path, exc: OSError) -> InvalidModelError:
    from ndp_io.guard import shown_path

    path = shown_path(str(path))  # type: ignore[assignment]  # a 4,000-byte path is not shown whole
    if exc.errno == errno.ELOOP:
        return InvalidModelError(f"{path}: symbolic link loop")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return InvalidModelError(f"{path}: permission denied")
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return InvalidModelError(f"no such file: {path}")
    if exc.errno == errno.EISDIR:
        return InvalidModelError(f"not a file: {path}")
    return InvalidModelError(f"cannot read {path}: {exc.strerror or type(exc).__name__}")


def load_model(
    source: str | os.PathLike[str] | onnx.ModelProto, *, check: bool = True
) -> tuple[onnx.ModelProto, Path | None]:
    """Load a model without its external weight bytes; returns it and the directory of its data.

    A path is opened first (so "permission denied" and "symbolic link loop" are told apart from "not an
    ONNX model"), parsed, and — with ``check`` — validated by :func:`graph_passes.model_check.check_model`
    (structure, tensor headers, external-data containment and ranges) before any work. A ``ModelProto`` is
    checked too (``check=False``: the caller has just checked it itself).
    """
    from graph_passes.model_check import check_model

    if isinstance(source, onnx.ModelProto):
        if check:
            check_model(source, None)
        return source, None
    path = Path(source)
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # before opening: a FIFO would block the open forever
            raise InvalidModelError(f"not a file: {path}")
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise _read_error(path, exc) from None
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError, RuntimeWarning...: all mean "not ONNX"
        raise InvalidModelError(f"{path} is not an ONNX model ({type(exc).__name__})") from None
    if not model.graph.node and not model.graph.output:
        raise InvalidModelError(f"{path} is not an ONNX model (no graph)")
    if check:
        check_model(model, path.parent)
    return model, path.parent


# -- saving ------------------------------------------------------------------------------------------------
def _data_file_pattern(path: Path) -> re.Pattern[str]:
    return re.compile("^" + re.escape(path.name) + r"(\.[0-9a-f]{8})?" + re.escape(DATA_SUFFIX) + "$")


def owned_data_files(path: str | os.PathLike[str]) -> list[Path]:
    """Existing data files a save to ``path`` owns: ``path.data`` and ``path.<8 hex>.data``."""
    path = Path(path)
    pattern = _data_file_pattern(path)
    try:
        names = os.listdir(path.parent if str(path.parent) else ".")
    except OSError:
        return []
    return sorted(path.with_name(n) for n in names if pattern.match(n))


def output_files(path: str | os.PathLike[str]) -> list[Path]:
    """Every file saving a model to ``path`` may create, replace or delete (for no-clobber checks)."""
    path = Path(path)
    # once: an earlier save's data file is usually the default one (a repeated file reads as two outputs colliding)
    return list(dict.fromkeys([path, path.with_name(path.name + DATA_SUFFIX), *owned_data_files(path)]))


def _fresh_data_path(path: Path) -> Path:
    plain = path.with_name(path.name + DATA_SUFFIX)
    if not os.path.lexists(plain):
        return plain
    while True:
        candidate = path.with_name(f"{path.name}.{os.urandom(4).hex()}{DATA_SUFFIX}")
        if not os.path.lexists(candidate):
            return candidate


def _remove_old_data(path: Path, keep: Path | None) -> None:
    for old in owned_data_files(path):
        if keep is None or old.name != keep.name:
            with contextlib.suppress(OSError):
                old.unlink()


class CommitRefused(Exception):
    """``save_rewritten``'s ``before_commit`` said no: nothing was written (the staged files are gone)."""


def save_rewritten(
    rewritten: RewrittenModel,
    path: str | Path,
    external: bool | None = None,
    before_commit: Callable[[], bool] | None = None,
) -> list[Path]:
    """Write the model to ``path``, replacing any previous model and weights there as one unit.

    Weights are streamed one tensor at a time to a data file beside ``path`` when ``external`` (default:
    when the input used external data or the weights exceed the 2 GB protobuf limit); returns the files
    written. The sequence that keeps every intermediate state consistent is in the module docstring.
    ``before_commit`` is asked once everything is staged and before anything replaces what is at ``path``;
    False raises :class:`CommitRefused` with nothing written.
    """
    path = check_output_path(path)
    model = rewritten.model
    store = rewritten.store
    uses_external = any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer) or bool(
        store is not None and getattr(store, "has_external_data", False)
    )
    total = sum(lz.nbytes for lz in rewritten.lazy.values()) + sum(
        len(t.raw_data) for t in model.graph.initializer if t.name not in rewritten.lazy
    )
    if external is None:
        external = uses_external or total > EXTERNAL_THRESHOLD_BYTES
    with directory_lock(path.parent):
        if not external:
            with staged_file(path) as staged:
                _write_embedded(rewritten, staged.file)
                _ask(before_commit)
                staged.commit()
            _remove_old_data(path, keep=None)
            return [path]
        data_path = _fresh_data_path(path)
        check_output_path(data_path)
        with staged_file(data_path) as data, staged_file(path) as model_file:
            header = _write_external(rewritten, data.file, data_path.name, direct=total >= DIRECT_MIN_BYTES)
            _ask(before_commit)
            model_file.file.write(header.SerializeToString())  # both written before either is committed
            model_file.file.flush()
            data.commit()
            try:
                model_file.commit()
            except BaseException:  # (a full disk at the model's fsync): the new data file, a name no model
                with contextlib.suppress(OSError):  # references, goes too: the old pair, or nothing, remains
                    os.unlink(data_path)
                raise
        _remove_old_data(path, keep=data_path)
    return [path, data_path]


def _ask(before_commit: Callable[[], bool] | None) -> None:
    if before_commit is not None and not before_commit():
        raise CommitRefused("the conversion was withdrawn before it was committed")


def _write_external(rewritten: RewrittenModel, data_file, location: str, direct: bool = False) -> onnx.ModelProto:
    """Stream every large initializer's bytes to ``data_file``; returns the model header that references them.

    ``direct``: past the page cache when the file system allows it (:class:`_DirectWriter`), else through it
    (:class:`_DataWriter`).
    """
    store = rewritten.store
    header = onnx.ModelProto()
    header.CopyFrom(rewritten.model)
    writer = _DirectWriter.open(data_file) if direct else None
    with writer if writer is not None else _DataWriter(data_file) as writer:
        for tensor in header.graph.initializer:
            lazy = rewritten.lazy.get(tensor.name)
            offset = writer.position
            if lazy is not None:
                for part in lazy.parts():
                    writer.write_array(part, tensor.name)
            elif tensor.data_location == TensorProto.EXTERNAL:
                if store is None:
                    raise GraphPassError(f"cannot read external data of {tensor.name}")
                src, src_offset, length = store.external_location(tensor.name)
                writer.copy_range(Path(src), src_offset, length, tensor.name)
            elif len(tensor.raw_data) > 1024 or (not tensor.raw_data and element_count(tensor) > 256):
                writer.write_bytes(_tensor_bytes(tensor))
            else:
                continue
            length = writer.position - offset
            tensor.ClearField("raw_data")
            for field_name in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                tensor.ClearField(field_name)
            del tensor.external_data[:]
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
        writer.finish()
    return header


def _write_embedded(rewritten: RewrittenModel, model_file) -> None:
    """Write one self-contained ``.onnx`` file holding one initializer's bytes in memory at a time.

    The file is the model without initializers, followed by one ``ModelProto{graph{initializer: [t]}}``
    record per initializer. Protobuf parsers merge repeated occurrences of a message field, so the file
    reads back as a single model; the result is the same as ``onnx.save`` of the materialised model,
    up to the order of the initializers.
    """
    model, store = rewritten.model, rewritten.store
    header = copy_without_initializers(model)
    model_file.write(header.SerializeToString())
    for tensor in model.graph.initializer:
        record = onnx.ModelProto()
        written = record.graph.initializer.add()
        lazy = rewritten.lazy.get(tensor.name)
        if lazy is not None:
            written.name, written.data_type = tensor.name, lazy.data_type
            written.dims.extend(tensor.dims)
            written.raw_data = lazy.array().tobytes()
        elif tensor.data_location == TensorProto.EXTERNAL:
            if store is None:
                raise GraphPassError(f"cannot read external data of {tensor.name}")
            written.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(store.full(tensor.name))))
            written.name = tensor.name
        else:
            written.CopyFrom(tensor)
        model_file.write(record.SerializeToString())


def _tensor_bytes(tensor: TensorProto) -> bytes:
    if tensor.raw_data:
        return tensor.raw_data
    return onnx.numpy_helper.to_array(tensor).tobytes()
