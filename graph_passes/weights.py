"""Read initializer bytes lazily, one expert at a time, whether embedded or in external data files.

Stacked expert weights ``[E, ...]`` are contiguous per expert, so expert ``e`` of an external tensor is a
window of its data file: converting a model never needs more than one expert's bytes in memory.

Each data file is mapped once (read-only, shared) and every window is a view of that mapping, so reading
thousands of experts does not open, resolve and map the file thousands of times. A window's pages are
released from this process when the caller drops the window and every view of it (``MADV_DONTNEED``: the
file's pages stay in the page cache, only this process's references to them go), so a conversion holds
no more of the file than the windows in use, as if each were a mapping of its own.
"""

from __future__ import annotations

import math
import mmap
import threading
import weakref
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from graph_passes.errors import InvalidModelError
from graph_passes.tensors import element_count, external_data_files, external_range

SUPPORTED_WEIGHT_DTYPES = {TensorProto.FLOAT: np.float32}
INLINE_MAX_BYTES = 1 << 16
RAW_CACHE_TENSORS = 3  # gate_up, down and one bias: what producing one expert reads
MAPPED_FILES = 16  # data files kept mapped at once (each mapping holds a descriptor)


class WeightStore:
    """Lazy access to a model's initializers (``onnx.load(..., load_external_data=False)`` is enough)."""

    def __init__(self, model: onnx.ModelProto, base_dir: str | Path | None) -> None:
        """Index ``model``'s initializers; small external ones (≤ 64 KiB) are read into ``model`` itself.

        Exporters saving with ``size_threshold=0`` put even shape vectors and axes in the data file;
        graph rules need those values, and inlining them keeps every later reader simple.
        """
        self.base_dir = Path(base_dir) if base_dir is not None else None
        self.tensors = {t.name: t for t in model.graph.initializer}
        self._raw_cache: dict[str, bytes] = {}
        self._ranges: dict[str, tuple[Path, int, int]] = {}
        self._mapped: dict[Path, mmap.mmap] = {}
        self._lock = threading.Lock()  # a deferred numeric check may read experts while the writer does
        self.has_external_data = any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)
        self.data_files = external_data_files(model, self.base_dir)  # read by no-clobber checks
        for tensor in model.graph.initializer:
            if tensor.data_location == TensorProto.EXTERNAL and self.nbytes(tensor.name) <= INLINE_MAX_BYTES:
                if self.base_dir is None:
                    continue
                raw = np.ascontiguousarray(self.full(tensor.name)).tobytes()
                del tensor.external_data[:]
                tensor.data_location = TensorProto.DEFAULT
                tensor.raw_data = raw

    def dtype_supported(self, name: str) -> bool:
        return self.tensors[name].data_type in SUPPORTED_WEIGHT_DTYPES

    def nbytes(self, name: str) -> int:
        tensor = self.tensors[name]
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
        return element_count(tensor) * itemsize

    def external_location(self, name: str) -> tuple[Path, int, int]:
        """``(file, offset, length)`` of an external initializer, contained in the model's directory and checked
        against its dims (:func:`graph_passes.tensors.external_range`)."""
        return self._external(self.tensors[name])

    def _external(self, tensor: TensorProto) -> tuple[Path, int, int]:
        """:func:`external_range`, checked once per tensor: reading E experts would otherwise resolve and
        check the same path E times (a ``realpath`` and a ``stat`` per expert)."""
        found = self._ranges.get(tensor.name)
        if found is None:
            found = self._ranges[tensor.name] = external_range(tensor, self.base_dir)
        return found

    def expert(self, name: str, expert: int) -> np.ndarray:
        """``tensor[expert]`` of a stacked initializer, reading only that expert's bytes (-1: the whole tensor).

        External data comes back as a read-only view of the file's pages; copy it to modify it.
        """
        if expert < 0:
            return self.full(name)
        tensor = self.tensors[name]
        dims = tuple(tensor.dims)
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
        per_expert = math.prod(dims[1:])
        if tensor.data_location == TensorProto.EXTERNAL:
            path, offset, _ = self._external(tensor)
            nbytes = per_expert * dtype.itemsize
            window = self._window(path, offset + expert * nbytes, nbytes)
            return window.view(np.ndarray).view(dtype).reshape(dims[1:])
        raw = self._raw_bytes(tensor)
        if raw:
            start = expert * per_expert * dtype.itemsize
            flat = np.frombuffer(raw, dtype=dtype, count=per_expert, offset=start)
            return flat.reshape(dims[1:]).copy()
        return numpy_helper.to_array(tensor)[expert]

    def _raw_bytes(self, tensor: TensorProto) -> bytes:
        """``tensor.raw_data``, kept for the few most recently read tensors.

        Every access to a protobuf bytes field copies the whole field; reading E experts of a stacked
        inline tensor one by one would copy it E times.
        """
        with self._lock:
            cached = self._raw_cache.pop(tensor.name, None)
            if cached is None:
                cached = tensor.raw_data
                while len(self._raw_cache) >= RAW_CACHE_TENSORS:
                    self._raw_cache.pop(next(iter(self._raw_cache)))
            self._raw_cache[tensor.name] = cached
            return cached

    def full(self, name: str) -> np.ndarray:
        tensor = self.tensors[name]
        if tensor.data_location == TensorProto.EXTERNAL:
            path, offset, nbytes = self._external(tensor)
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
            return np.array(self._window(path, offset, nbytes).view(np.ndarray).view(dtype)).reshape(tuple(tensor.dims))
        return numpy_helper.to_array(tensor)

    def _window(self, path: Path, start: int, nbytes: int) -> np.memmap:
        """Bytes ``start:start + nbytes`` of ``path`` (a range :meth:`_external` checked), read-only.

        An ``np.memmap`` over the file's one mapping whose ``filename`` and ``offset`` are its own, so that
        :func:`graph_passes.data_writers.file_range_of` finds the file range of any C-contiguous view of it (and the
        writer copies it file to file). NumPy stops collapsing a view's ``base`` at a different array type, so
        every view made from the window keeps it alive; its pages are released once the last one is dropped.
        """
        if not nbytes:
            return np.ndarray.__new__(np.memmap, (0,), np.uint8)  # nothing to map (or release)
        with self._lock:
            mapping = self._mapped.pop(path, None)
            if mapping is None:
                while len(self._mapped) >= MAPPED_FILES:  # one file per tensor: a few descriptors, not thousands
                    self._mapped.pop(next(iter(self._mapped)))  # unmapped when its last window is dropped
                with open(path, "rb") as file:
                    mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            self._mapped[path] = mapping  # most recently used last
        if start + nbytes > len(mapping):  # the file shrank after its ranges were checked
            raise InvalidModelError(f"external data file {path.name} is truncated (needs {start + nbytes} bytes)")
        window = np.ndarray.__new__(np.memmap, (nbytes,), np.uint8, buffer=mapping, offset=start)
        window._mmap, window.filename, window.offset, window.mode = mapping, path, start, "r"
        first = start - start % mmap.PAGESIZE
        last = min(-(-(start + nbytes) // mmap.PAGESIZE) * mmap.PAGESIZE, len(mapping))
        weakref.finalize(window, _release, mapping, first, last - first).atexit = False  # nothing to release then
        return window


def _release(mapping: mmap.mmap, start: int, length: int) -> None:
    """Drop this process's references to ``length`` bytes of ``mapping``'s pages from ``start`` (page-aligned); a
    later read maps them again from the page cache. Best effort: where ``madvise`` is missing, they stay mapped."""
    if not mapping.closed and hasattr(mapping, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        mapping.madvise(mmap.MADV_DONTNEED, start, length)
