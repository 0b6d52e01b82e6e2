"""Save rewritten models: the model file and its external-data file, streamed one tensor at a time.

Graph emission lives in :mod:`graph_passes.rewrite`; this module only writes files.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from graph_passes.errors import GraphPassError
from graph_passes.graph_index import copy_without_initializers
from graph_passes.rewrite import RewrittenModel

EXTERNAL_THRESHOLD_BYTES = 1_800_000_000
COPY_CHUNK_BYTES = 64 * 2**20


def _atomic_path(target: Path) -> Path:
    handle, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(handle)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    return Path(tmp)


def save_rewritten(rewritten: RewrittenModel, path: str | Path, external: bool | None = None) -> list[Path]:
    """Write the model to ``path`` (temp file + rename). Weights are streamed one tensor at a time to
    ``<path>.data`` when ``external`` (default: when the input used external data or the weights exceed
    the 2 GB protobuf limit); returns the files written."""
    path = Path(path)
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
    if not external:
        tmp = _atomic_path(path)
        try:
            _write_embedded(rewritten, tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return [path]
    data_path = path.with_name(path.name + ".data")
    tmp_model, tmp_data = _atomic_path(path), _atomic_path(data_path)
    try:
        header = onnx.ModelProto()
        header.CopyFrom(model)
        with open(tmp_data, "wb") as data_file:
            for tensor in header.graph.initializer:
                lazy = rewritten.lazy.get(tensor.name)
                offset = data_file.tell()
                if lazy is not None:
                    data_file.write(memoryview(np.ascontiguousarray(lazy.produce(), dtype=np.float32)).cast("B"))
                elif tensor.data_location == TensorProto.EXTERNAL:
                    if store is None:
                        raise GraphPassError(f"cannot read external data of {tensor.name}")
                    src, src_offset, length = store._external(tensor)
                    if not length:
                        length = store.nbytes(tensor.name)
                    with open(src, "rb") as source:
                        source.seek(src_offset)
                        remaining = length
                        while remaining:
                            chunk = source.read(min(COPY_CHUNK_BYTES, remaining))
                            if not chunk:
                                raise GraphPassError(f"external data of {tensor.name} is truncated")
                            data_file.write(chunk)
                            remaining -= len(chunk)
                elif len(tensor.raw_data) > 1024 or (not tensor.raw_data and _np_size(tensor) > 256):
                    data_file.write(_tensor_bytes(tensor))
                else:
                    continue
                length = data_file.tell() - offset
                tensor.ClearField("raw_data")
                for field_name in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                    tensor.ClearField(field_name)
                del tensor.external_data[:]
                tensor.data_location = TensorProto.EXTERNAL
                for key, value in (("location", data_path.name), ("offset", str(offset)), ("length", str(length))):
                    entry = tensor.external_data.add()
                    entry.key, entry.value = key, value
        with open(tmp_model, "wb") as model_file:
            model_file.write(header.SerializeToString())
        os.replace(tmp_data, data_path)
        os.replace(tmp_model, path)
    finally:
        tmp_model.unlink(missing_ok=True)
        tmp_data.unlink(missing_ok=True)
    return [path, data_path]


def _write_embedded(rewritten: RewrittenModel, path: Path) -> None:
    """Write one self-contained ``.onnx`` file holding one initializer's bytes in memory at a time.

    The file is the model without initializers, followed by one ``ModelProto{graph{initializer: [t]}}``
    record per initializer. Protobuf parsers merge repeated occurrences of a message field, so the file
    reads back as a single model; the result is the same as ``onnx.save`` of the materialised model,
    up to the order of the initializers.
    """
    model, store = rewritten.model, rewritten.store
    header = copy_without_initializers(model)
    with open(path, "wb") as model_file:
        model_file.write(header.SerializeToString())
        for tensor in model.graph.initializer:
            record = onnx.ModelProto()
            written = record.graph.initializer.add()
            lazy = rewritten.lazy.get(tensor.name)
            if lazy is not None:
                written.name, written.data_type = tensor.name, TensorProto.FLOAT
                written.dims.extend(tensor.dims)
                written.raw_data = np.ascontiguousarray(lazy.produce(), dtype=np.float32).tobytes()
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


def _np_size(tensor: TensorProto) -> int:
    return int(np.prod(tensor.dims, dtype=np.int64))
