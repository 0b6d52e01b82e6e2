"""Load an ONNX model for diffing without materialising its weights.

The ModelProto is read with ``load_external_data=False``: nodes, attributes and tensor headers are in memory,
external weight bytes stay on disk. Initializer contents are compared by (dtype, shape, content hash); the
hash is computed only when a comparison needs it, by :class:`ContentHasher`, which streams external data files
by offset/length in fixed-size chunks and hashes embedded ``raw_data`` directly::

    model.onnx ──onnx.load(load_external_data=False)──> ModelSnapshot (nodes, initializer headers, opsets)
    weights.bin ──seek(offset), read 1 MiB chunks──> blake2b digest   (only for initializers that need it)
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper

from graph_passes.errors import InvalidModelError
from graph_passes.model_check import check_text
from graph_passes.tensors import external_data_path
from ndp_ep.diff.result import NodeRef, TensorRef, shape_text
from ndp_ep.diff.sharded_ops import ShardedOpInfo, read_sharded_ops
from ndp_ep.errors import ModelLoadError

HASH_CHUNK_BYTES = 1 << 20
DIGEST_BYTES = 16


@dataclass(frozen=True)
class ExternalLocation:
    """Where an external initializer's bytes live: an absolute file path and a byte range."""

    path: Path
    offset_bytes: int
    length_bytes: int

    def __post_init__(self) -> None:
        if self.offset_bytes < 0 or self.length_bytes < 0:
            raise ModelLoadError(f"external data range for {self.path} is negative")


@dataclass(frozen=True)
class InitializerRecord(TensorRef):
    """One initializer's header (what a comparison by shape, dtype and size needs; no weight bytes), where its
    bytes live, and its position among the graph's initializers."""

    external: ExternalLocation | None
    index: int

    def __post_init__(self) -> None:
        if self.size_bytes < 0:
            raise ModelLoadError(f"initializer {self.name!r} has a negative size")

    @property
    def element_count(self) -> int:
        return math.prod(self.shape)

    def describe(self) -> str:
        return f"{self.dtype}{self.shape_text()}"


@dataclass(frozen=True)
class NodeRecord(NodeRef):
    """One node with its attributes rendered canonically (comparable strings) and its metadata_props."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: Mapping[str, str]
    metadata: Mapping[str, str]


@dataclass(frozen=True)
class ValueRecord:
    """A graph input or output: name, element type and shape (symbolic dims kept as strings)."""

    name: str
    dtype: str
    shape: tuple[str, ...] | None

    def describe(self) -> str:
        return self.dtype if self.shape is None else f"{self.dtype}{shape_text(self.shape)}"


@dataclass(frozen=True)
class ModelSnapshot:
    """Everything the diff reads from one model file; built by :func:`load_snapshot`."""

    path: Path
    ir_version: int
    producer: str
    opsets: Mapping[str, int]
    nodes: tuple[NodeRecord, ...]
    initializers: Mapping[str, InitializerRecord]
    embedded_raw: Mapping[str, bytes] = field(repr=False)
    embedded_typed: Mapping[str, TensorProto] = field(repr=False)
    inputs: tuple[ValueRecord, ...]
    outputs: tuple[ValueRecord, ...]
    functions: Mapping[str, str]
    metadata: Mapping[str, str]
    sharded_ops: Mapping[int, ShardedOpInfo] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def initializer_bytes(self) -> int:
        return sum(record.size_bytes for record in self.initializers.values())


def _dtype_name(elem_type: int) -> str:
    try:
        return helper.tensor_dtype_to_np_dtype(elem_type).name
    except (KeyError, TypeError, ValueError):
        return TensorProto.DataType.Name(elem_type).lower() if elem_type in TensorProto.DataType.values() else "?"


def _itemsize_bits(elem_type: int) -> int:
    if elem_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return 0
    packed_4bit = {getattr(TensorProto, name) for name in ("INT4", "UINT4", "FLOAT4E2M1") if hasattr(TensorProto, name)}
    if elem_type in packed_4bit:
        return 4
    try:
        return helper.tensor_dtype_to_np_dtype(elem_type).itemsize * 8
    except (KeyError, TypeError, ValueError):
        return 0


def _external_location(
    tensor: TensorProto, base_dir: Path, model_path: Path, files: dict[str, tuple[Path, int]]
) -> ExternalLocation:
    """Where an external tensor's bytes are; ``files`` caches each data file's resolved path and size."""
    entries = {entry.key: entry.value for entry in tensor.external_data}
    if "location" not in entries:
        raise ModelLoadError(f"{model_path}: initializer {tensor.name!r} is external but names no location")
    if entries["location"] not in files:
        try:  # only files inside the model's directory (no absolute path, `..` or symlink escape)
            file_path = external_data_path(base_dir, entries["location"], tensor.name)
        except InvalidModelError as exc:
            raise ModelLoadError(f"{model_path}: {exc}") from None
        files[entries["location"]] = (file_path, file_path.stat().st_size)
    file_path, file_size = files[entries["location"]]
    try:
        offset = int(entries.get("offset", "0"))
        length = int(entries["length"]) if "length" in entries else file_size - offset
    except ValueError as exc:
        raise ModelLoadError(f"{model_path}: bad external data offset/length for {tensor.name!r}") from exc
    if offset < 0 or length < 0 or offset + length > file_size:
        raise ModelLoadError(
            f"{model_path}: external data of {tensor.name!r} ({offset}+{length} bytes) is past the end of "
            f"{entries['location']!r} ({file_size} bytes)"
        )
    return ExternalLocation(file_path, offset, length)


def _attribute_text(attribute: onnx.AttributeProto) -> str:
    """A canonical, comparable rendering of an attribute value; tensors and graphs become digests."""
    kind = attribute.type
    if kind == onnx.AttributeProto.TENSOR:
        return _tensor_digest_text(attribute.t)
    if kind == onnx.AttributeProto.TENSORS:
        return "[" + ", ".join(_tensor_digest_text(t) for t in attribute.tensors) + "]"
    if kind in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        graphs = [attribute.g] if kind == onnx.AttributeProto.GRAPH else list(attribute.graphs)
        digests = [hashlib.blake2b(g.SerializeToString(), digest_size=8).hexdigest() for g in graphs]
        return f"graph#{','.join(digests)}"
    if kind == onnx.AttributeProto.SPARSE_TENSOR:
        return f"sparse#{hashlib.blake2b(attribute.sparse_tensor.SerializeToString(), digest_size=8).hexdigest()}"
    value = helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return json.dumps(value.decode("utf-8", errors="replace"))
    if isinstance(value, list):
        return json.dumps([v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v for v in value])
    return json.dumps(value)


def _tensor_digest_text(tensor: TensorProto) -> str:
    header = f"{_dtype_name(tensor.data_type)}{shape_text(tensor.dims)}"
    payload = tensor.raw_data if tensor.HasField("raw_data") else _typed_payload(tensor)
    return f"tensor {header} #{hashlib.blake2b(payload, digest_size=8).hexdigest()}"


def _typed_payload(tensor: TensorProto) -> bytes:
    """Bytes of a tensor stored in typed fields (float_data, int64_data, ...), excluding its name."""
    copy = TensorProto()
    copy.CopyFrom(tensor)
    copy.name = ""
    copy.doc_string = ""
    return copy.SerializeToString()


def _value_record(value: onnx.ValueInfoProto) -> ValueRecord:
    tensor_type = value.type.tensor_type if value.type.HasField("tensor_type") else None
    if tensor_type is None:
        return ValueRecord(value.name, value.type.WhichOneof("value") or "?", None)
    shape: tuple[str, ...] | None = None
    if tensor_type.HasField("shape"):
        shape = tuple(
            str(dim.dim_value) if dim.HasField("dim_value") else (dim.dim_param or "?") for dim in tensor_type.shape.dim
        )
    return ValueRecord(value.name, _dtype_name(tensor_type.elem_type), shape)


def load_snapshot(path: str | os.PathLike[str]) -> ModelSnapshot:
    """Read a model's structure and initializer headers; raise ModelLoadError on anything that is not ONNX."""
    model_path = Path(path)
    try:
        if not stat.S_ISREG(model_path.stat().st_mode):  # checked before opening: a FIFO would block
            raise ModelLoadError(f"{model_path}: not a regular file")
        with open(model_path, "rb"):
            pass
    except OSError as exc:  # permission denied, symlink loop, missing: said as such, not "not ONNX"
        reason = "no such file" if exc.errno == errno.ENOENT else (exc.strerror or type(exc).__name__).lower()
        raise ModelLoadError(f"{model_path}: {reason}") from None
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as exc:
        raise ModelLoadError(f"{model_path}: not a readable ONNX model ({type(exc).__name__})") from exc
    if not model.HasField("graph") or (len(model.graph.node) == 0 and len(model.graph.output) == 0):
        raise ModelLoadError(f"{model_path}: not an ONNX model (no graph)")
    try:
        check_text(model)
    except InvalidModelError as exc:
        raise ModelLoadError(f"{model_path}: {exc}") from None
    graph = model.graph
    base_dir = model_path.resolve().parent

    initializers: dict[str, InitializerRecord] = {}
    embedded_raw: dict[str, bytes] = {}
    embedded_typed: dict[str, TensorProto] = {}
    data_files: dict[str, tuple[Path, int]] = {}
    for index, tensor in enumerate(graph.initializer):
        shape = tuple(int(d) for d in tensor.dims)
        external = None
        if tensor.data_location == TensorProto.EXTERNAL:
            external = _external_location(tensor, base_dir, model_path, data_files)
            size = external.length_bytes
        elif tensor.HasField("raw_data"):
            embedded_raw[tensor.name] = tensor.raw_data
            size = len(tensor.raw_data)
        else:
            embedded_typed[tensor.name] = tensor
            size = (math.prod(shape) * _itemsize_bits(tensor.data_type) + 7) // 8
        initializers[tensor.name] = InitializerRecord(
            tensor.name, _dtype_name(tensor.data_type), shape, size, external, index
        )

    nodes = tuple(
        NodeRecord(
            index=index,
            name=node.name,
            op_type=node.op_type,
            domain=node.domain or "",
            inputs=tuple(node.input),
            outputs=tuple(node.output),
            attributes=MappingProxyType({a.name: _attribute_text(a) for a in sorted(node.attribute, key=_by_name)}),
            metadata=MappingProxyType({p.key: p.value for p in node.metadata_props}),
        )
        for index, node in enumerate(graph.node)
    )
    functions = {
        f"{function.domain}::{function.name}": hashlib.blake2b(function.SerializeToString(), digest_size=8).hexdigest()
        for function in model.functions
    }
    graph_inputs = tuple(_value_record(v) for v in graph.input if v.name not in initializers)
    return ModelSnapshot(
        path=model_path,
        ir_version=int(model.ir_version),
        producer=f"{model.producer_name} {model.producer_version}".strip(),
        opsets=MappingProxyType({(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import}),
        nodes=nodes,
        initializers=MappingProxyType(initializers),
        embedded_raw=MappingProxyType(embedded_raw),
        embedded_typed=MappingProxyType(embedded_typed),
        inputs=graph_inputs,
        outputs=tuple(_value_record(v) for v in graph.output),
        functions=MappingProxyType(functions),
        metadata=MappingProxyType({p.key: p.value for p in model.metadata_props}),
        sharded_ops=read_sharded_ops(graph.node),
    )


def _by_name(attribute: onnx.AttributeProto) -> str:
    return attribute.name


class ContentHasher:
    """Hashes initializer contents on demand and remembers the digests (one instance per diff run).

    Two external initializers that point at the same file range are identical without reading a byte.
    """

    def __init__(self) -> None:
        self._digests: dict[tuple[int, str], str] = {}
        self.bytes_read = 0

    def digest(self, snapshot: ModelSnapshot, name: str) -> str:
        key = (id(snapshot), name)
        cached = self._digests.get(key)
        if cached is not None:
            return cached
        record = snapshot.initializers[name]
        hasher = hashlib.blake2b(digest_size=DIGEST_BYTES)
        hasher.update(f"{record.dtype}{record.shape}".encode())
        if record.external is not None:
            self._hash_file_range(hasher, record.external)
        elif name in snapshot.embedded_raw:
            hasher.update(snapshot.embedded_raw[name])
        else:
            hasher.update(_typed_payload(snapshot.embedded_typed[name]))
        digest = hasher.hexdigest()
        self._digests[key] = digest
        return digest

    def same_content(self, a: ModelSnapshot, name_a: str, b: ModelSnapshot, name_b: str) -> bool:
        record_a, record_b = a.initializers[name_a], b.initializers[name_b]
        if record_a.dtype != record_b.dtype or record_a.shape != record_b.shape:
            return False
        if record_a.external is not None and record_a.external == record_b.external:
            return True
        return self.digest(a, name_a) == self.digest(b, name_b)

    def _hash_file_range(self, hasher: Any, location: ExternalLocation) -> None:
        remaining = location.length_bytes
        with open(location.path, "rb") as handle:
            handle.seek(location.offset_bytes)
            while remaining > 0:
                chunk = handle.read(min(HASH_CHUNK_BYTES, remaining))
                if not chunk:
                    raise ModelLoadError(f"{location.path}: external data ends early")
                hasher.update(chunk)
                remaining -= len(chunk)
        self.bytes_read += location.length_bytes
