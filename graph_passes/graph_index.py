"""A read-only index over an ONNX graph for pattern rules: producers, consumers, constants, shapes.

Built from a ModelProto whose weights may live in external data that is *not* loaded: initializer shapes
and dtypes come from the TensorProto headers, and only small constants (shape vectors, axes, split sizes)
are ever materialised.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

import numpy as np
import onnx
from onnx import numpy_helper

SMALL_CONSTANT_ELEMENTS = 4096


class GraphIndex:
    """Producers, consumers, initializers and inferred shapes of one ``onnx.GraphProto``."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.graph = model.graph
        self.initializers: dict[str, onnx.TensorProto] = {t.name: t for t in self.graph.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        self.node_by_name: dict[str, onnx.NodeProto] = {}
        for node in self.graph.node:
            self.node_by_name[node.name] = node
            for out in node.output:
                if out:
                    self.producer[out] = node
            for inp in node.input:
                if inp:
                    self.consumers[inp].append(node)
        self.graph_outputs = {v.name for v in self.graph.output}
        self._elem_types: dict[str, int] = {}
        self._shapes = self._infer_shapes(_weightless_copy(model))
        self._concrete: dict[str, tuple[int | str | None, ...]] | None = None

    def _infer_shapes(self, model: onnx.ModelProto) -> dict[str, tuple[int | str | None, ...]]:
        shapes: dict[str, tuple[int | str | None, ...]] = {}
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        except Exception:  # shape inference is best-effort: custom ops or odd graphs may defeat it
            inferred = model
        values = list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)
        for value in values:
            if not value.type.HasField("tensor_type"):
                continue
            if value.type.tensor_type.elem_type:
                self._elem_types[value.name] = value.type.tensor_type.elem_type
            if not value.type.tensor_type.HasField("shape"):
                continue
            dims: list[int | str | None] = []
            for d in value.type.tensor_type.shape.dim:
                if d.HasField("dim_value"):
                    dims.append(d.dim_value)
                elif d.HasField("dim_param"):
                    dims.append(d.dim_param)
                else:
                    dims.append(None)
            shapes[value.name] = tuple(dims)
        for name, tensor in {t.name: t for t in model.graph.initializer}.items():
            shapes[name] = tuple(tensor.dims)
            self._elem_types[name] = tensor.data_type
        return shapes

    def concrete_size(self, value: str) -> int | None:
        """Element count of ``value`` when every symbolic input dimension is set to a distinct prime.

        Telling ``[T*K, H]`` from ``[T, H]`` needs numbers, not symbols: with T = 3*5 and K = 2 the two
        differ. None when shape inference cannot tell.
        """
        if self._concrete is None:
            self._concrete = self._concrete_shapes()
        shape = self._concrete.get(value)
        if shape is None or not all(isinstance(d, int) for d in shape):
            return None
        return math.prod(shape)

    def _concrete_shapes(self) -> dict[str, tuple[int | str | None, ...]]:
        probe = _weightless_copy(self.model)
        primes = iter((3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47))
        by_name: dict[str, int] = {}
        for value in probe.graph.input:
            if not value.type.HasField("tensor_type"):
                continue
            for dim in value.type.tensor_type.shape.dim:
                if dim.HasField("dim_value"):
                    continue
                key = dim.dim_param or f"__anonymous_{len(by_name)}"
                if key not in by_name:
                    by_name[key] = next(primes, 53)
                dim.Clear()
                dim.dim_value = by_name[key]
        saved = self._elem_types.copy()
        shapes = self._infer_shapes(probe)
        self._elem_types = saved
        return shapes

    def elem_type(self, value: str) -> int | None:
        """ONNX element type (``TensorProto.FLOAT``...) of ``value`` when known."""
        return self._elem_types.get(value)

    def shape(self, value: str) -> tuple[int | str | None, ...] | None:
        """Inferred shape of ``value`` (ints for known dims, names for symbolic ones), or None."""
        return self._shapes.get(value)

    def initializer_shape(self, value: str) -> tuple[int, ...] | None:
        tensor = self.initializers.get(value)
        return None if tensor is None else tuple(tensor.dims)

    def constant(self, value: str) -> np.ndarray | None:
        """The value of a small constant (initializer or Constant node output), else None."""
        return constant_value(value, self.initializers, self.producer)

    def attr(self, node: onnx.NodeProto, name: str, default=None):
        for attribute in node.attribute:
            if attribute.name == name:
                return onnx.helper.get_attribute_value(attribute)
        return default

    def nodes_of_type(self, op_type: str, domain: str = "") -> Iterable[onnx.NodeProto]:
        domains = ("", "ai.onnx") if domain in ("", "ai.onnx") else (domain,)
        return (n for n in self.graph.node if n.op_type == op_type and n.domain in domains)

    def downstream(self, values: Iterable[str]) -> set[str]:
        """Names of every node downstream of ``values``."""
        found: set[str] = set()
        pending = list(values)
        while pending:
            value = pending.pop()
            for user in self.consumers.get(value, []):
                if user.name not in found:
                    found.add(user.name)
                    pending.extend(user.output)
        return found

    def upstream(self, value: str, stop: set[str] | None = None) -> set[str]:
        """Names of the nodes that ``value`` depends on (stopping at values in ``stop``)."""
        stop = stop or set()
        seen: set[str] = set()
        pending = [value]
        while pending:
            current = pending.pop()
            if current in stop:
                continue
            node = self.producer.get(current)
            if node is None or node.name in seen:
                continue
            seen.add(node.name)
            pending.extend(i for i in node.input if i)
        return seen


WEIGHTLESS_MAX_BYTES = 1 << 16


def constant_value(
    value: str, initializers: Mapping[str, onnx.TensorProto], producer: Mapping[str, onnx.NodeProto]
) -> np.ndarray | None:
    """The value of a small constant ``value`` (an initializer or a standard ``Constant`` node's output, at most
    :data:`SMALL_CONSTANT_ELEMENTS` elements, bytes inline), else None."""
    tensor = initializers.get(value)
    if tensor is None:
        node = producer.get(value)
        if node is None or node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
            return None
        for attr in node.attribute:
            if attr.name == "value":
                tensor = attr.t
            elif attr.name in ("value_int", "value_ints"):
                return np.array(onnx.helper.get_attribute_value(attr), dtype=np.int64)
            elif attr.name in ("value_float", "value_floats"):
                return np.array(onnx.helper.get_attribute_value(attr), dtype=np.float32)
        if tensor is None:
            return None
    if math.prod(tensor.dims) > SMALL_CONSTANT_ELEMENTS:
        return None
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    return numpy_helper.to_array(tensor)


def _weightless_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` for shape inference: initializers over 64 KiB (or external) keep only their header.

    Shape inference needs the values of small constants (shape vectors, axes) but only the dims of
    weights; copying a model with multi-GB inline weights would double the memory it holds.
    """
    probe = onnx.ModelProto()
    graph = model.graph
    large = [
        t
        for t in graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL
        or math.prod(t.dims) > WEIGHTLESS_MAX_BYTES // 4  # ByteSize() would serialize it
    ]
    if not large:
        probe.CopyFrom(model)
        return probe
    return copy_with_stubbed_initializers(model, {t.name for t in large})


def copy_fields(source, target, skipped: tuple[str, ...]) -> None:
    """Every set field of the protobuf message ``source`` into ``target`` (of the same type), except those named
    in ``skipped`` (one field copy each: cheaper than copying the whole message and clearing fields)."""
    for descriptor, value in source.ListFields():
        if descriptor.name in skipped:
            continue
        if hasattr(value, "extend"):  # repeated field
            getattr(target, descriptor.name).extend(value)
        elif hasattr(value, "CopyFrom"):  # message field
            getattr(target, descriptor.name).CopyFrom(value)
        else:
            setattr(target, descriptor.name, value)


def copy_without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every field but ``graph.initializer`` (which stays empty)."""
    out = onnx.ModelProto()
    copy_fields(model, out, ("graph",))
    copy_fields(model.graph, out.graph, ("initializer",))
    return out


def copy_with_stubbed_initializers(model: onnx.ModelProto, stubbed: set[str]) -> onnx.ModelProto:
    """A copy of ``model`` in which the initializers named in ``stubbed`` keep only name, dtype and dims."""
    if not stubbed:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        return out
    out = copy_without_initializers(model)
    for tensor in model.graph.initializer:
        if tensor.name in stubbed:
            header = out.graph.initializer.add()
            header.name, header.data_type = tensor.name, tensor.data_type
            header.dims.extend(tensor.dims)
        else:
            out.graph.initializer.add().CopyFrom(tensor)
    return out


def live_nodes(nodes: list[onnx.NodeProto], wanted: list[str] | set[str]) -> tuple[list[onnx.NodeProto], set[str]]:
    """The nodes (in their order) needed to compute the values ``wanted``, and every value name they read.

    The list need not be topologically sorted (GenAI builder outputs are not).
    """
    producer: dict[str, int] = {}
    for position, node in enumerate(nodes):
        for o in node.output:
            if o:
                producer[o] = position
    live_values = set(wanted)
    pending = list(live_values)
    keep: set[int] = set()
    while pending:
        position = producer.get(pending.pop())
        if position is None or position in keep:
            continue
        keep.add(position)
        node = nodes[position]
        reads = {i for i in node.input if i}
        for attr in node.attribute:  # values captured by subgraphs
            if attr.type == onnx.AttributeProto.GRAPH:
                reads |= subgraph_reads(attr.g)
        pending.extend(reads - live_values)
        live_values |= reads
    return [nodes[p] for p in sorted(keep)], live_values


def subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    """Every value name a subgraph (and its nested subgraphs) reads."""
    names = {i for n in graph.node for i in n.input if i}
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                names |= subgraph_reads(attr.g)
    return names


def is_standard_op(node: onnx.NodeProto) -> bool:
    """True for an op of the default ONNX domain."""
    return node.domain in ("", "ai.onnx")


def scope_of(node_name: str) -> str:
    """``/model/layers.0/mlp/experts/Gather_1`` -> ``model.layers.0.mlp``."""
    parts = [p for p in node_name.split("/") if p]
    if "experts" in parts:
        parts = parts[: parts.index("experts")]
    elif parts:
        parts = parts[:-1]
    return ".".join(parts)


def through(index: GraphIndex, value: str, op_types: tuple[str, ...]) -> str:
    """Follow ``value`` upstream through single-input layout ops of the given types."""
    while True:
        node = index.producer.get(value)
        if node is None or node.op_type not in op_types or not is_standard_op(node):
            return value
        value = node.input[0]
