"""A block's signature: everything its numeric proof and its rewrite depend on, with the names taken out.

Two blocks with the same signature have isolated regions (:func:`graph_passes.region.isolated_region`) that are the
same graph up to value and node names — the same op types, domains and attributes (activation, quantization bits
and block size included), every input of the same shape and dtype, the same optional inputs present, the same
small constants (shape vectors, axes) — and readings (:class:`graph_passes.plan.MoEBlockPlan`) that are the same
plan up to those names: the same rule, expert count, top-k, widths, activation, layouts, column selections,
quantization, biases and router nodes. Large initializers (the expert weights, a router's matrix) enter by dtype
and dims only: a reading's validity is a property of the graph, not of the weights' values.

What sharing a proof between such blocks relies on: the rewrite is a data-independent function of the signature
(the same plan cuts any weights of those dtypes and shapes into shards the same way), and a block covered by
another's proof is checked on its own bytes (:mod:`graph_passes.shard_audit`): its shards must be exact byte
views of its own weights.
"""

from __future__ import annotations

import dataclasses
import hashlib

import onnx

from graph_passes.plan import MoEBlockPlan, MoECandidate

# initializers up to this size enter the signature by value (shape vectors, axes, small constants)
VALUE_MAX_BYTES = 1 << 16


class _Names:
    """Canonical names: each distinct name gets the next number, in order of first appearance."""

    def __init__(self) -> None:
        self.numbers: dict[str, int] = {}

    def __call__(self, name: str) -> str:
        if not name:
            return ""  # an absent optional input stays absent
        return f"%{self.numbers.setdefault(name, len(self.numbers))}"


def _attribute(attribute: onnx.AttributeProto, names: _Names) -> tuple:
    if attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        return (attribute.name, "graph", attribute.SerializeToString(deterministic=True))  # names and all
    copy = onnx.AttributeProto()
    copy.CopyFrom(attribute)
    copy.t.name = ""  # a Constant's value: its name is no part of it
    for tensor in copy.tensors:
        tensor.name = ""
    return (attribute.name, copy.SerializeToString(deterministic=True))


def _node(node: onnx.NodeProto, names: _Names) -> tuple:
    return (
        node.domain,
        node.op_type,
        tuple(names(i) for i in node.input),
        tuple(names(o) for o in node.output),
        tuple(_attribute(a, names) for a in sorted(node.attribute, key=lambda a: a.name)),
    )


def _value_type(value: onnx.ValueInfoProto) -> tuple:
    tensor = value.type.tensor_type
    return tensor.elem_type, tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor.shape.dim)


def _initializer(tensor: onnx.TensorProto, large: bool) -> tuple:
    described = (tensor.data_type, tuple(tensor.dims))
    if large or tensor.data_location == onnx.TensorProto.EXTERNAL:
        return described
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    copy.name = ""
    return (*described, hashlib.sha256(copy.SerializeToString(deterministic=True)).hexdigest())


def _canonical(value, names: _Names, nodes: dict[str, int]):
    """``value`` (a plan field) with value, initializer and node names replaced by their canonical ones."""
    if isinstance(value, onnx.NodeProto):
        return _node(value, names)
    if dataclasses.is_dataclass(value):
        return (type(value).__name__, *(_field(value, f.name, names, nodes) for f in dataclasses.fields(value)))
    if isinstance(value, tuple):
        return tuple(_canonical(v, names, nodes) for v in value)
    return value


_NAMES = {"initializer", "scales", "zero_points", "hidden_value", "expert_ids_value"}
_NAMES |= {"routing_weights_value", "output_value"}


def _field(value, field: str, names: _Names, nodes: dict[str, int]):
    item = getattr(value, field)
    if field in ("name", "notes"):
        return None
    if field == "replaced_nodes":
        return tuple(nodes.get(n, -1) for n in item)
    if field == "per_expert":
        return tuple(names(n) for n in item)
    if field in _NAMES:
        return names(item)
    return _canonical(item, names, nodes)


def block_signature(region: onnx.ModelProto, candidate: MoECandidate, large: set[str]) -> str:
    """The signature of ``candidate`` (a digest), read from its isolated ``region``; ``large``: the names of the
    initializers that enter by dtype and dims only (the expert weights; any initializer over
    :data:`VALUE_MAX_BYTES` is treated so too)."""
    names = _Names()  # numbered in node order: the order of the region's inputs follows their names
    graph = region.graph
    node_list = tuple(_node(n, names) for n in graph.node)
    inputs = tuple(sorted((names(v.name), _value_type(v)) for v in graph.input))
    positions = {n.name: position for position, n in enumerate(graph.node)}
    initializers = {t.name: t for t in graph.initializer}
    described = tuple(
        sorted(
            (names(name), _initializer(t, name in large or t.ByteSize() > VALUE_MAX_BYTES))
            for name, t in initializers.items()
        )
    )
    outputs = tuple(names(o.name) for o in graph.output)
    readings = tuple(_canonical(r, names, positions) for r in candidate.readings)
    key = repr((inputs, node_list, described, outputs, readings, candidate.structural_choice))
    return hashlib.sha256(key.encode()).hexdigest()


def expert_tensors(plan: MoEBlockPlan) -> set[str]:
    """Every initializer holding ``plan``'s experts (matrices, scales, zero points, biases)."""
    w = plan.weights
    names = {n for m in (w.up, w.down, w.gate) if m is not None for n in (m.initializer, m.scales, m.zero_points)}
    names |= {n for m in (w.up, w.down, w.gate) if m is not None for n in m.per_expert}
    names |= {b.initializer for b in (w.up_bias, w.gate_bias, w.down_bias) if b is not None}
    return names - {""}
