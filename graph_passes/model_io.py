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
reads the new weights. Step 1 copies each byte at most once in this process: weights of
:data:`DIRECT_MIN_BYTES` or more go past the page cache (``O_DIRECT``) from writer threads
(:class:`_DirectWriter`: aligned row blocks of an expert straight from a mapping of the source, other row
blocks read and column blocks copied into page-aligned buffers); smaller weights, or a file system without
``O_DIRECT``, go through the page cache (:class:`_DataWriter`: contiguous byte ranges of a source data file
file to file with ``os.copy_file_range``, a column block through a reused buffer).
Temporary files are removed on errors and signals (:mod:`ndp_io`); a data file orphaned by a crash between
steps 1 and 2 is removed by the next save to the same output.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto

from graph_passes.errors import GraphPassError, InvalidModelError
from graph_passes.graph_index import copy_without_initializers
from graph_passes.tensors import (
    element_count,
    external_data_files,
    external_range,
)
from ndp_io import check_output_path, directory_lock, staged_file

if TYPE_CHECKING:
    import mmap
    import queue
    from collections.abc import Callable

    from graph_passes.rewrite import RewrittenModel

EXTERNAL_THRESHOLD_BYTES = 1_800_000_000
COPY_CHUNK_BYTES = 64 * 2**20
# weights at least this large are streamed to the disk past the page cache (:class:`_DirectWriter`)
DIRECT_MIN_BYTES = 64 * 2**20
DIRECT_CHUNK_BYTES = 4 * 2**20  # one write to the disk; a multiple of DIRECT_ALIGN
DIRECT_WRITERS = 8  # writes in flight: one stream of 4 MiB writes leaves a virtio disk half idle
DIRECT_ALIGN = 4096  # file offsets and lengths of direct writes (a multiple of every logical block size)
MAP_WINDOW_BYTES = 16 * 2**20  # source mapped this much at a time for direct writes from it
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


def file_range_of(view: np.ndarray) -> tuple[Path, int, int] | None:
    """``(file, offset, length)`` of the bytes of a C-contiguous view of an ``np.memmap`` (None otherwise)."""
    if not view.flags.c_contiguous or not view.nbytes:
        return None
    base = view.base
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    if base is None or base.filename is None:
        return None
    start = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return Path(base.filename), int(base.offset) + start, view.nbytes


class _DataWriter:
    """Appends tensor bytes to an open data file through the page cache, with as little copying in this process
    as it can.

    * a C-contiguous view of a memory-mapped source file (a row block of an expert, a whole tensor): copied
      file to file by the kernel (``os.copy_file_range``), never mapped or read here;
    * any other C-contiguous array: written from its own memory;
    * a strided view (a column block): copied once into a scratch buffer reused by every tensor, then written.

    Where ``copy_file_range`` is missing or refused (another file system on an old kernel, ...) ranges are read
    and written in chunks of :data:`COPY_CHUNK_BYTES`.
    """

    def __init__(self, data_file) -> None:
        self.file = data_file
        self.scratch = np.empty(0, np.uint8)
        self.sources: dict[Path, int] = {}
        self.kernel_copy = hasattr(os, "copy_file_range")

    def __enter__(self) -> _DataWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        for fd in self.sources.values():
            os.close(fd)
        self.sources.clear()

    @property
    def position(self) -> int:
        """Where the next byte goes in the data file."""
        return self.file.tell()

    def finish(self) -> None:
        """Nothing is held back: every byte is in the file already."""

    def write_bytes(self, data: bytes | memoryview) -> None:
        self.file.write(data)

    def write_array(self, array: np.ndarray, name: str) -> None:
        found = file_range_of(array)
        if found is not None:
            self.copy_range(*found, name)
            return
        if not array.flags.c_contiguous:
            if self.scratch.nbytes < array.nbytes:
                self.scratch = np.empty(array.nbytes, np.uint8)
            from graph_passes.expert_math import copy_blocked  # with the block plans: not needed to read a model

            staged = self.scratch[: array.nbytes].view(array.dtype).reshape(array.shape)
            array = copy_blocked(array, staged)
        self.file.write(memoryview(array.reshape(-1).view(np.uint8)))

    def copy_range(self, path: Path, offset: int, length: int, name: str) -> None:
        """Append ``length`` bytes of ``path`` from ``offset``; a short source is a :class:`GraphPassError`."""
        source = _source_fd(self.sources, path)
        self.file.flush()
        position = self.file.tell()
        copied = 0
        while self.kernel_copy and copied < length:
            try:
                count = os.copy_file_range(
                    source, self.file.fileno(), length - copied, offset + copied, position + copied
                )
            except OSError as exc:
                if exc.errno not in _NO_KERNEL_COPY_ERRNOS:
                    raise
                self.kernel_copy = False
                break
            if not count:
                raise GraphPassError(f"external data of {name} is truncated")
            copied += count
        self.file.seek(position + copied)
        while copied < length:
            chunk = os.pread(source, min(COPY_CHUNK_BYTES, length - copied), offset + copied)
            if not chunk:
                raise GraphPassError(f"external data of {name} is truncated")
            self.file.write(chunk)
            copied += len(chunk)


def _source_fd(sources: dict[Path, int], path: Path) -> int:
    """A read-only descriptor of ``path``, opened once per writer."""
    source = sources.get(path)
    if source is None:
        source = sources[path] = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    return source


class _Chunk:
    """One page-aligned buffer of :class:`_DirectWriter`, the file offset it goes to, and the copies that fill
    it (made by the writer thread that then writes it)."""

    def __init__(self, size: int) -> None:
        import mmap  # the writers' modules are imported on use: reading a model needs neither

        self.memory = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT needs
        self.view = memoryview(self.memory)
        self.offset = 0
        self.fill = 0
        self.copies: list[tuple] = []
        self.mapped: tuple[mmap.mmap, int, str] | None = None  # (mapping, offset in it, tensor): written from it

    def region(self, start: int, count: int) -> memoryview:
        return self.view[start : start + count]


class _DirectWriter:
    """Appends tensor bytes to a data file past the page cache (``O_DIRECT``), with several writer threads.

    Writing gigabytes through the page cache costs a page allocation and a copy per 4 KiB, and the final fsync
    then waits for all of it to reach the disk; on a small or busy machine (reclaim, a VM whose host takes freed
    memory back) that CPU cost, not the disk, sets the pace. Here the byte stream is laid out in
    :data:`DIRECT_CHUNK_BYTES` page-aligned buffers (:class:`_Chunk`). The caller's thread only decides what goes
    where; each full buffer is handed to one of :data:`DIRECT_WRITERS` threads, which fills it and writes it
    straight to the disk (``os.preadv``, numpy copies and ``os.pwrite`` release the GIL, so the threads fill
    and write in parallel while the caller lays out the next buffers):

    * a contiguous range of a source file (a row block of an expert, an untouched external tensor) is written
      from a read-only mapping of the source (no copy in this process: the disk reads the source's cached
      pages, :data:`MAP_WINDOW_BYTES` of it mapped at a time) when its source offset and its place in the data
      file are :data:`DIRECT_ALIGN`-aligned, and is read into the buffer (``os.preadv``) otherwise or where the
      source cannot be mapped;
    * a strided view (a column block of a mapped expert) is copied into the buffer, whole rows at a time
      (``copy_blocked``), with no intermediate copy; a row that straddles two buffers is copied by the caller;
    * bytes and other arrays are copied in by the caller.

    The last, partial buffer is written at :meth:`finish`: its aligned part direct, the rest (under
    :data:`DIRECT_ALIGN` bytes) through the page cache. A file system that refuses a direct write (``EINVAL``)
    gets the same writes through the page cache from then on; one that refuses ``O_DIRECT`` outright is detected
    by :meth:`open`, which then returns None (the caller uses :class:`_DataWriter`). The first error of a writer
    thread (a write error, a truncated source) is raised in the caller's thread at the next buffer or at
    :meth:`finish`.
    """

    def __init__(self, data_file, fd: int, flags: int, chunk_bytes: int, writers: int) -> None:
        import queue

        self.file, self.fd, self.flags = data_file, fd, flags
        self.chunk_bytes = chunk_bytes
        self.position = data_file.tell()  # where the next byte goes (aligned: see open)
        self.sources: dict[Path, int] = {}
        self.sizes: dict[int, int] = {}  # of the source files, by descriptor
        self.windows: dict[int, tuple[mmap.mmap, int, int]] = {}  # each source's current mapping: (it, start, end)
        self.free: queue.Queue[_Chunk] = queue.Queue()
        for _ in range(2 * writers):
            self.free.put(_Chunk(chunk_bytes))
        self.todo: queue.Queue[tuple[_Chunk, int] | None] = queue.Queue()
        self.failure: BaseException | None = None
        self.abort = False
        self.direct = True
        self.lock = threading.Lock()
        self.chunk: _Chunk | None = None
        self.threads = [threading.Thread(target=self._drain, name="ndp-ep-write", daemon=True) for _ in range(writers)]
        for thread in self.threads:
            thread.start()

    @classmethod
    def open(cls, data_file, chunk_bytes: int | None = None, writers: int | None = None) -> _DirectWriter | None:
        """A direct writer appending to ``data_file`` (flushed first), or None where ``O_DIRECT`` is not
        available (another OS, a file system such as tmpfs, an unaligned start). ``chunk_bytes`` and ``writers``
        default to :data:`DIRECT_CHUNK_BYTES` and :data:`DIRECT_WRITERS`."""
        chunk_bytes = DIRECT_CHUNK_BYTES if chunk_bytes is None else chunk_bytes
        writers = DIRECT_WRITERS if writers is None else writers
        if not hasattr(os, "O_DIRECT") or chunk_bytes <= 0 or chunk_bytes % DIRECT_ALIGN or writers < 1:
            return None
        import fcntl

        data_file.flush()
        if data_file.tell() % DIRECT_ALIGN:
            return None
        fd = data_file.fileno()
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)
        except OSError:
            return None
        return cls(data_file, fd, flags, chunk_bytes, writers)

    def __enter__(self) -> _DirectWriter:
        return self

    def __exit__(self, exc_type, *exc_info) -> None:
        if exc_type is not None:
            self.abort = True  # an error on the way: what is still queued is not worth writing
        self._stop()
        self.windows.clear()  # unmapped once no writer thread holds them
        for source in self.sources.values():
            os.close(source)
        self.sources.clear()
        self._buffered()

    # -- the caller's side ------------------------------------------------------------------------------------
    def write_bytes(self, data: bytes | memoryview) -> None:
        data = memoryview(data).cast("B")
        done = 0
        while done < len(data):
            chunk = self._chunk()
            count = min(self.chunk_bytes - chunk.fill, len(data) - done)
            chunk.region(chunk.fill, count)[:] = data[done : done + count]
            self._advance(count)
            done += count

    def write_array(self, array: np.ndarray, name: str) -> None:
        found = file_range_of(array)
        if found is not None:
            self.copy_range(*found, name)
            return
        if array.flags.c_contiguous:
            self.write_bytes(memoryview(array.reshape(-1).view(np.uint8)))
            return
        if array.ndim != 2:
            self.write_bytes(memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8)))
            return
        rows, row_bytes = array.shape[0], array.shape[1] * array.dtype.itemsize
        row = 0
        while row < rows:
            chunk = self._chunk()
            count = min(rows - row, (self.chunk_bytes - chunk.fill) // row_bytes) if row_bytes else rows - row
            if count == 0:  # less than a row left in this buffer: that row goes in two pieces
                self.write_bytes(memoryview(np.ascontiguousarray(array[row]).view(np.uint8)))
                row += 1
                continue
            chunk.copies.append((_fill_rows, array[row : row + count], chunk.fill))
            self._advance(count * row_bytes)
            row += count

    def copy_range(self, path: Path, offset: int, length: int, name: str) -> None:
        """Append ``length`` bytes of ``path`` from ``offset``; a short source is a :class:`GraphPassError` (raised
        here or at a later call: the bytes are read by a writer thread)."""
        source = _source_fd(self.sources, path)
        copied = 0
        while copied < length:
            count = self._mappable(offset + copied, length - copied)
            window = self._window(source, offset + copied, count) if count else None
            if window is not None:
                self._submit_mapped(window, offset + copied, count, name)
                copied += count
                continue
            chunk = self._chunk()
            count = min(self.chunk_bytes - chunk.fill, length - copied)
            chunk.copies.append((_fill_from_file, (source, offset + copied, count, name), chunk.fill))
            self._advance(count)
            copied += count

    def _mappable(self, source_offset: int, length: int) -> int:
        """How many of ``length`` bytes from ``source_offset`` can go to the disk straight from a mapping of the
        source (0: none; at most one buffer's worth at a time)."""
        import mmap

        if not self.direct or self.position % DIRECT_ALIGN or source_offset % max(DIRECT_ALIGN, mmap.PAGESIZE):
            return 0
        return min(length - length % DIRECT_ALIGN, self.chunk_bytes)

    def _window(self, source: int, source_offset: int, length: int) -> tuple[mmap.mmap, int] | None:
        """A read-only mapping of ``source`` holding ``length`` bytes from ``source_offset``, and the file offset it
        starts at; consecutive ranges share one :data:`MAP_WINDOW_BYTES` window, so the source is mapped and
        unmapped once per window, not once per range (an unmapping interrupts every CPU running one of this
        process's threads). None where the source cannot be mapped or is too short (it is read instead)."""
        current = self.windows.get(source)
        if current is not None and current[1] <= source_offset and source_offset + length <= current[2]:
            return current[0], current[1]
        size = self.sizes.get(source)
        if size is None:
            size = self.sizes[source] = os.fstat(source).st_size
        start = source_offset - source_offset % MAP_WINDOW_BYTES
        if source_offset + length > start + MAP_WINDOW_BYTES:
            start = source_offset  # a range crossing a window boundary starts its own (aligned: see _mappable)
        end = min(max(start + MAP_WINDOW_BYTES, source_offset + length), size)
        if source_offset + length > end:
            return None
        import mmap

        try:
            mapping = mmap.mmap(source, end - start, access=mmap.ACCESS_READ, offset=start)
        except (OSError, ValueError):
            return None
        self.windows[source] = (mapping, start, end)  # the writer threads hold it too while they write from it
        return mapping, start

    def _submit_mapped(self, window: tuple[mmap.mmap, int], source_offset: int, length: int, name: str) -> None:
        if self.chunk is not None:  # what is laid out before it goes first, as a shorter (still aligned) write
            chunk, self.chunk = self.chunk, None
            self.todo.put((chunk, chunk.fill))
        item = self._free_chunk()  # a buffer's place in the queue: no more mappings in flight than buffers
        mapping, start = window
        item.offset, item.fill, item.mapped = self.position, length, (mapping, source_offset - start, name)
        self.position += length
        self.todo.put((item, length))

    def finish(self) -> None:
        """Write what is still buffered and wait for every write; raises the first error of a writer thread."""
        chunk, self.chunk = self.chunk, None
        tail = b""
        if chunk is not None:
            _fill(chunk)
            aligned = chunk.fill - chunk.fill % DIRECT_ALIGN
            tail = bytes(chunk.view[aligned : chunk.fill])
            if aligned:
                self.todo.put((chunk, aligned))
        self._stop()
        self._buffered()
        if tail:
            _pwrite_all(self.fd, tail, self.position - len(tail))
        self.file.seek(self.position)

    # -- buffers ------------------------------------------------------------------------------------------------
    def _chunk(self) -> _Chunk:
        """The buffer being laid out (a free one when the last one is full)."""
        if self.chunk is None:
            chunk = self._free_chunk()
            chunk.offset, chunk.fill = self.position, 0
            self.chunk = chunk
        return self.chunk

    def _free_chunk(self) -> _Chunk:
        """A buffer no writer thread holds (waits for one); raises a writer thread's error instead."""
        chunk = self.free.get()
        if self.failure is not None:
            self.free.put(chunk)
            raise self.failure
        return chunk

    def _advance(self, count: int) -> None:
        chunk = self.chunk
        chunk.fill += count
        self.position += count
        if chunk.fill == self.chunk_bytes:
            self.chunk = None
            self.todo.put((chunk, chunk.fill))

    def _stop(self) -> None:
        """Let every writer thread finish what is queued, then end it; raises the first error of one."""
        for _ in self.threads:
            self.todo.put(None)
        for thread in self.threads:
            thread.join()
        self.threads = []
        if self.failure is not None and not self.abort:
            failure, self.failure = self.failure, None
            raise failure

    def _buffered(self) -> None:
        """Back to writes through the page cache (the descriptor's flags as they were)."""
        with self.lock:
            if self.direct:
                import fcntl

                fcntl.fcntl(self.fd, fcntl.F_SETFL, self.flags)
                self.direct = False

    # -- writer threads -----------------------------------------------------------------------------------------
    def _drain(self) -> None:
        while True:
            item = self.todo.get()
            if item is None:
                return
            chunk, length = item
            try:
                if self.abort or self.failure is not None:
                    pass
                elif chunk.mapped is not None:
                    self._write_mapped(chunk, length)
                else:
                    _fill(chunk)
                    self._write(chunk.region(0, length), chunk.offset)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                if self.failure is None:
                    self.failure = exc
            finally:
                chunk.copies.clear()  # drops the source views (and their mappings) the buffer was filled from
                chunk.mapped = None
                self.free.put(chunk)

    def _write_mapped(self, chunk: _Chunk, length: int) -> None:
        mapping, start, name = chunk.mapped
        view = memoryview(mapping)[start : start + length]
        try:
            self._write(view, chunk.offset)
        except OSError as exc:
            if exc.errno == errno.EFAULT:  # the source shrank under its mapping
                raise GraphPassError(f"external data of {name} is truncated") from None
            raise
        finally:
            view.release()

    def _write(self, data: memoryview, offset: int) -> None:
        try:
            _pwrite_all(self.fd, data, offset)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            # the file system takes O_DIRECT but not these writes (or another thread just found so): through the
            # page cache from now on; an EINVAL there too is a real error
            self._buffered()
            _pwrite_all(self.fd, data, offset)


def _fill(chunk: _Chunk) -> None:
    """Make the copies laid out for ``chunk``, in order."""
    for copy, source, start in chunk.copies:
        copy(chunk, source, start)
    chunk.copies.clear()


def _fill_rows(chunk: _Chunk, rows: np.ndarray, start: int) -> None:
    from graph_passes.expert_math import copy_blocked  # with the block plans: not needed to read a model

    target = np.frombuffer(chunk.memory, np.uint8, rows.nbytes, start).view(rows.dtype).reshape(rows.shape)
    copy_blocked(rows, target)


def _fill_from_file(chunk: _Chunk, source: tuple[int, int, int, str], start: int) -> None:
    fd, offset, length, name = source
    done = 0
    while done < length:
        count = os.preadv(fd, [chunk.region(start + done, length - done)], offset + done)
        if not count:
            raise GraphPassError(f"external data of {name} is truncated")
        done += count


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


# errors that mean "this kernel or file-system pair cannot copy_file_range": fall back to read + write
_NO_KERNEL_COPY_ERRNOS = {
    errno.EXDEV,
    errno.ENOSYS,
    errno.EOPNOTSUPP,
    errno.EINVAL,
    errno.EPERM,
    getattr(errno, "ENOTSUP", errno.EOPNOTSUPP),
}


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
