"""Stand-ins for shape inference: the standard nodes that give an ONNX Runtime operator's outputs (one ONNX shape
inference does not know) their shapes and element types (:data:`STAND_INS`, used by :mod:`ndp_ep.costing`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import onnx
from onnx import TensorProto, helper

from graph_passes.graph_index import constant_value
from ndp_ep.contrib_costs import CONTRIB, LOGICAL_QUANTIZED_TYPES

STAND_IN_OPSET = 15  # the stand-ins use CastLike and Shape's start and end


_PACKED_SOURCE_OPS = ("Reshape", "Identity", "Transpose", "Squeeze", "Unsqueeze", "Flatten")


class StandInNodes:
    """The standard nodes standing in for one node: fresh names under ``prefix``, constants, shape arithmetic."""

    def __init__(self, node: onnx.NodeProto, prefix: str) -> None:
        self.node = node
        self.nodes: list[onnx.NodeProto] = []
        self.probe = ""  # a tensor whose shape carries a value the cost formula needs (NodeIo.probe)
        self._prefix = prefix

    def input(self, index: int) -> str:
        """The node's input ``index`` ("" when absent)."""
        return self.node.input[index] if index < len(self.node.input) else ""

    def output(self, index: int) -> str:
        return self.node.output[index] if index < len(self.node.output) else ""

    def add(self, op_type: str, inputs: Sequence[str], output: str = "", **attributes: Any) -> str:
        output = output or f"{self._prefix}{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], **attributes))
        return output

    def ints(self, *values: int) -> str:
        return self.add("Constant", [], value=helper.make_tensor("value", TensorProto.INT64, [len(values)], values))

    def dims(self, tensor: str, start: int, end: int | None = None) -> str:
        """``tensor``'s dims ``start:end``, as a 1-D int64 tensor (shape inference propagates its values)."""
        return self.add("Shape", [tensor], start=start, **({} if end is None else {"end": end}))

    def copy(self, index: int, source: str) -> None:
        """Output ``index`` of ``source``'s shape and element type."""
        if self.output(index) and source:
            self.add("Identity", [source], self.output(index))

    def zeros(self, output: str, parts: Sequence[str], like: str | None) -> str:
        """``output`` of the shape the dims ``parts`` concatenate to, of ``like``'s element type (float if None)."""
        shape = self.add("Concat", parts, axis=0) if len(parts) > 1 else parts[0]
        if like is None:
            return self.add("ConstantOfShape", [shape], output)
        return self.add("CastLike", [self.add("ConstantOfShape", [shape]), like], output)


class StandInGraph(NamedTuple):
    """What stand-ins may read of the skeleton: its initializers and each tensor's producer."""

    initializers: dict[str, onnx.TensorProto]
    producers: dict[str, onnx.NodeProto]
    input_types: dict[str, int]

    def stored_type(self, name: str) -> int:
        """The element type ``name`` is stored in, through reshaping ops back to an initializer or graph input
        (0: unknown)."""
        for _ in range(8):
            if name in self.initializers:
                return self.initializers[name].data_type
            if name in self.input_types:
                return self.input_types[name]
            producer = self.producers.get(name)
            if producer is None or producer.op_type not in _PACKED_SOURCE_OPS or not producer.input:
                return 0
            name = producer.input[0]
        return 0


def _same_as_input(b: StandInNodes, attributes: dict[str, Any], graph: StandInGraph) -> None:
    b.copy(0, b.input(0))


def _norm_stand_in(b: StandInNodes, attributes: dict[str, Any], graph: StandInGraph) -> None:
    """The normalized output (and a Skip norm's input + skip sum) like the input; the saved statistics (float)
    with the normalized axes of size 1."""
    x = b.input(0)
    b.copy(0, x)
    if b.node.op_type.startswith("Skip"):
        b.copy(3, x)
        statistics, axis = (1, 2), -1
    else:
        statistics, axis = (1,), int(attributes.get("axis", -1))
    if axis >= 0:  # the input's rank is not known here
        return
    for index in statistics:
        if b.output(index):
            b.zeros(b.output(index), [b.dims(x, 0, axis), b.ints(*[1] * -axis)], like=None)


def _matmul_nbits_stand_in(b: StandInNodes, attributes: dict[str, Any], graph: StandInGraph) -> None:
    a = b.input(0)
    weight = b.zeros("", [b.ints(int(attributes["K"]), int(attributes["N"]))], like=a)
    b.add("MatMul", [a, weight], b.output(0))


def _gqa_stand_in(b: StandInNodes, attributes: dict[str, Any], graph: StandInGraph) -> None:
    """Output ``(batch, sequence, num_heads * head_size)``; presents ``(batch, kv_num_heads, past + sequence,
    head_size)`` (a window cache keeps its capacity). The head size is the past cache's last dim, or the key's
    width over ``kv_num_heads``; a packed query without a past is left unsized. The probe: ``(total sequence
    length,)``, where inference propagates the value of that input (GenAI's builder takes it from the attention
    mask's shape)."""
    query, key, value, past_key, past_value = (b.input(i) for i in range(5))
    heads, kv_heads = int(attributes["num_heads"]), int(attributes["kv_num_heads"])
    if b.input(6):  # the total sequence length's value, propagated from the attention mask's shape, as a shape
        length = b.add("Cast", [b.input(6)], to=TensorProto.INT64)
        b.probe = b.zeros("", [b.add("Unsqueeze", [length, b.ints(0)])], like=None)
    if key:
        b.copy(0, query)
    elif past_key and b.output(0):
        per_head = b.zeros("", [b.dims(query, 0, 2), b.ints(heads), b.dims(past_key, 3)], like=query)
        b.add("Reshape", [per_head, b.ints(0, 0, -1)], b.output(0))
    for index, past, new in ((1, past_key, key), (2, past_value, value)):
        if not b.output(index):
            continue
        if past and attributes.get("sliding_window_cache", 0):
            b.copy(index, past)
        elif past:
            appended = b.zeros("", [b.dims(past, 0, 2), b.dims(query, 1, 2), b.dims(past, 3)], like=past)
            b.add("Concat", [past, appended], b.output(index), axis=2)
        elif new:
            split = b.add("Reshape", [new, b.ints(0, 0, kv_heads, -1)])
            b.add("Transpose", [split], b.output(index), perm=[0, 2, 1, 3])


def _gather_block_quantized_stand_in(b: StandInNodes, attributes: dict[str, Any], graph: StandInGraph) -> None:
    """Gather's shape, with the last dim unpacked (``8 / bits`` values a byte when the data is stored as uint8),
    of the scales' element type; left unsized when the data's stored type is not known."""
    data, indices, scales = b.input(0), b.input(1), b.input(2)
    stored = graph.stored_type(data)
    if stored == TensorProto.UINT8:
        pack = 8 // int(attributes.get("bits", 4))
    elif stored in LOGICAL_QUANTIZED_TYPES:
        pack = 1
    else:
        return
    gathered = b.add("Gather", [data, indices], axis=int(attributes.get("gather_axis", 0)))
    last = b.add("Mul", [b.dims(gathered, -1), b.ints(pack)])
    b.zeros(b.output(0), [b.dims(gathered, 0, -1), last], like=scales)


def _causal_conv_stand_in(b: StandInNodes, attributes: dict[str, Any], graph: StandInGraph) -> None:
    """The output like the input; the present state like the past one, or ``(batch, channels, (k - 1) *
    dilation)`` for a 1-D channels-first conv without a past."""
    x, weight, past = b.input(0), b.input(1), b.input(3)
    if not attributes.get("input_channels", 0):
        b.copy(0, x)
    if past:
        b.copy(1, past)
        return
    plain = all(not attributes.get(name, 0) for name in ("state_window", "channels_last", "state_length"))
    kernel = graph.initializers[weight].dims if weight in graph.initializers else ()
    if b.output(1) and plain and int(attributes.get("ndim", 1)) == 1 and len(kernel) == 3:
        length = (kernel[2] - 1) * int(attributes.get("dilation", 1))
        b.zeros(b.output(1), [b.dims(x, 0, 2), b.ints(length)], like=x)


def _range_stand_in(b: StandInNodes, attributes: dict[str, Any], graph: StandInGraph) -> None:
    """A Range of step 1 (the exporters' arange over a sequence length): ``limit - start`` elements of ``start``'s
    type, which ONNX's data propagation sizes (it does not evaluate Range, and a mask built from an unsized Range
    leaves every node after it unsized where the sequence length is 1). Another step: the node itself."""
    step = constant_value(b.input(2), graph.initializers, graph.producers)
    if step is None or step.size != 1 or step.reshape(-1)[0] != 1:
        b.nodes.append(b.node)
        return
    count = b.add("Cast", [b.add("Sub", [b.input(1), b.input(0)])], to=TensorProto.INT64)
    b.zeros(b.output(0), [b.add("Unsqueeze", [count, b.ints(0)])], like=b.input(0))


StandIn = Callable[[StandInNodes, dict[str, Any], StandInGraph], None]


STAND_INS: dict[tuple[str, str], StandIn] = {
    ("", "Range"): _range_stand_in,
    ("", "SimplifiedLayerNormalization"): _norm_stand_in,
    (CONTRIB, "SkipSimplifiedLayerNormalization"): _norm_stand_in,
    (CONTRIB, "SkipLayerNormalization"): _norm_stand_in,
    (CONTRIB, "RotaryEmbedding"): _same_as_input,
    (CONTRIB, "MatMulNBits"): _matmul_nbits_stand_in,
    (CONTRIB, "GroupQueryAttention"): _gqa_stand_in,
    (CONTRIB, "GatherBlockQuantized"): _gather_block_quantized_stand_in,
    (CONTRIB, "CausalConvWithState"): _causal_conv_stand_in,
    (CONTRIB, "MoE"): _same_as_input,
    (CONTRIB, "QMoE"): _same_as_input,
}
