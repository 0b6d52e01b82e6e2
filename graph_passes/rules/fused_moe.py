"""Detection rule for ONNX Runtime's fused ``com.microsoft.MoE`` / ``QMoE`` contrib ops (GenAI model builder output).

The fused op takes the router *logits* and does softmax, top-k and the optional renormalisation inside::

    x[..,H] ──────────────────────────────────────┐
    logits[T,E] ─────────────────────────── com.microsoft.MoE(k, activation_type, normalize_routing_weights,
    fc1 [E, F*I, H], fc1_bias [E, F*I]            swiglu_fusion, activation_alpha/beta, swiglu_limit) ─ y
    fc2 [E, H, I],   fc2_bias [E, H]              (F = 2 for fused swiglu: interleaved rows, even = gate)
    fc3 [E, I, H],   fc3_bias [E, I]   (optional: separate "up" projection, act(fc1 x) * fc3 x)

Since the rewritten model keeps the router as ordinary ONNX ops, the plan for a fused node carries the router
nodes the rewriter must insert (:func:`fused_moe_router_nodes`)::

    logits ─ Softmax(axis=-1) ─ TopK(k) ─┬─ values ─[ReduceSum(keepdims) ─ Div]─ routing_weights[T,K]
                                         └─ indices ─────────────────────────── expert_ids[T,K] (int64)

Semantics (ONNX Runtime 1.32 CPU kernel and op schema; checked numerically by sample_models/build_fused_moe.py):
``gelu`` is the tanh approximation; ``geglu`` (CUDA only in stock ONNX Runtime, whose CPU kernels refuse it at
session creation) computes ``gelu_tanh(gate) * up`` with gate/up interleaved (``swiglu_fusion=1``) or concatenated
(2) in fc1, ignoring alpha, beta and limit; ``swiglu`` computes ``g = min(h_even, limit)``, ``l = clip(h_odd, ±limit)``,
``g * sigmoid(alpha * g) * (l + beta)``; attribute defaults are the schema's (alpha 1, beta 0, no limit).
``QMoE`` holds block-quantized int4/int8 experts (inputs ``fc1, fc1_scales, fc1_bias, fc2, fc2_scales, fc2_bias,
fc3…, fc1_zero_points, fc2_zero_points, fc3_zero_points``; :mod:`graph_passes.quant` describes the layout); the
plan keeps them quantized; an input width that is not a multiple of ``block_size`` has a partial last block
(``ceil(width / block_size)`` scales a row), as ONNX Runtime GenAI's builder writes for e.g. Gemma-4's expert width
704 in blocks of 128. Float weights keep their dtype (float32, float16, bfloat16).
Anything the plan vocabulary cannot express exactly (chunked swiglu, sparse mixer, limit after activation,
per-row quantization, MXFP4/NVFP4, identity experts, weights that are not initializers) is skipped with the
reason.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import onnx
from onnx import helper

from graph_passes import quant
from graph_passes.activations import SWIGLU_ALPHA, SWIGLU_BETA, SWIGLU_LIMIT
from graph_passes.graph_index import GraphIndex
from graph_passes.plan import ExpertWeights, MoEBlockPlan, Skip, StackedBias, StackedMatrix
from graph_passes.rules import default_rule
from graph_passes.sharded_op import FLOAT_WEIGHT_DTYPE_OF_ONNX

MS_DOMAIN = "com.microsoft"

# com.microsoft.MoE attribute defaults, from the ONNX Runtime 1.32 op schema
DEFAULT_K = 1
DEFAULT_ACTIVATION = "relu"
DEFAULT_ALPHA = 1.0
DEFAULT_BETA = 0.0
DEFAULT_SWIGLU_FUSION = 0

PLAIN_ACTIVATION_OF = {"relu": "relu", "gelu": "gelu_tanh", "silu": "silu"}
# activations whose gate and up projections are fused in fc1 (2 * inter_size rows, laid out per swiglu_fusion)
FUSED_GATED_ACTIVATIONS = ("swiglu", "geglu")
# geglu's gate/up rows per swiglu_fusion (op schema: 1 interleaved [g0, l0, g1, l1, ...], 2 concatenated [g | l])
GEGLU_GATE_UP_ROWS = {1: ("even", "odd"), 2: ("first_half", "second_half")}
# an fc3 input gates the activated fc1 output; only SiLU has a matching plan activation
GATED_ACTIVATION_OF_FC3 = {"silu": "silu_glu"}


@dataclass(frozen=True)
class FusedMoEBlockPlan(MoEBlockPlan):
    """A plan whose ``expert_ids_value`` / ``routing_weights_value`` are produced by ``router_nodes``.

    The rewriter must add ``router_nodes`` to the graph (before the sharded expert op) when it rewrites the
    block; the fused op computed the router internally, so these values do not exist in the original graph.
    """

    router_nodes: tuple[onnx.NodeProto, ...] = ()


def block_name_of(node: onnx.NodeProto, ordinal: int) -> str:
    """A readable block name from the node name (``/model/layers.0/moe/QMoE`` -> ``model.layers.0.moe``)."""
    name = re.sub(r"/Q?MoE(_\d+)?$", "", node.name.strip("/")) if node.name else ""
    name = re.sub(r"[^A-Za-z0-9_.]+", ".", name).strip(".")
    return name or f"moe{ordinal}"


def fused_moe_router_nodes(
    logits_value: str, top_k: int, normalize: bool, prefix: str, in_float32: bool = False
) -> tuple[list[onnx.NodeProto], str, str, str]:
    """The ordinary ONNX ops reproducing the fused op's internal router.

    Returns ``(nodes, expert_ids_value, routing_weights_value, k_initializer_name)``; the caller must also add
    an int64 initializer ``[top_k]`` named ``k_initializer_name`` (see :func:`fused_moe_router_initializers`).
    The nodes only reference ``logits_value`` and new values named ``{prefix}/router/...``. With
    ``in_float32`` the logits are cast to float32 first (ONNX Runtime's CPU TopK has no bfloat16 kernel); the
    routing weights are then float32, which the sharded op accepts.
    """
    probs = f"{prefix}/router/probs"
    values = f"{prefix}/router/topk_values"
    ids = f"{prefix}/router/expert_ids"
    k_name = f"{prefix}/router/k"
    nodes = []
    if in_float32:
        cast = f"{prefix}/router/logits_float32"
        nodes.append(helper.make_node("Cast", [logits_value], [cast], name=f"{prefix}/router/Cast", to=1))
        logits_value = cast
    nodes += [
        helper.make_node("Softmax", [logits_value], [probs], name=f"{prefix}/router/Softmax", axis=-1),
        helper.make_node(
            "TopK", [probs, k_name], [values, ids], name=f"{prefix}/router/TopK", axis=-1, largest=1, sorted=1
        ),
    ]
    weights = values
    if normalize:
        total = f"{prefix}/router/topk_sum"
        weights = f"{prefix}/router/routing_weights"
        axes = f"{prefix}/router/sum_axes"
        nodes += [
            helper.make_node("ReduceSum", [values, axes], [total], name=f"{prefix}/router/ReduceSum", keepdims=1),
            helper.make_node("Div", [values, total], [weights], name=f"{prefix}/router/Div"),
        ]
    return nodes, ids, weights, k_name


def fused_moe_router_initializers(top_k: int, normalize: bool, prefix: str) -> list[onnx.TensorProto]:
    """The small constant initializers the router nodes of :func:`fused_moe_router_nodes` read."""
    tensors = [helper.make_tensor(f"{prefix}/router/k", onnx.TensorProto.INT64, [1], [top_k])]
    if normalize:
        tensors.append(helper.make_tensor(f"{prefix}/router/sum_axes", onnx.TensorProto.INT64, [1], [-1]))
    return tensors


def router_as_constant_nodes(top_k: int, normalize: bool, prefix: str) -> list[onnx.NodeProto]:
    """The router constants as ``Constant`` nodes (for rewriters that prefer nodes to initializers)."""
    return [
        helper.make_node("Constant", [], [t.name], name=f"{t.name}/Constant", value=t)
        for t in fused_moe_router_initializers(top_k, normalize, prefix)
    ]


QUANT_DTYPE_OF_BITS = {8: "int8", 4: "int4"}
# input positions of the two fused ops: (x, logits, fc1, fc1_scales, fc1_bias, fc2, fc2_scales, fc2_bias,
# fc3, fc3_scales, fc3_bias, fc1_zero_points, fc2_zero_points, fc3_zero_points); -1: the op has no such input
_MOE_INPUTS = (0, 1, 2, -1, 3, 4, -1, 5, 6, -1, 7, -1, -1, -1)
_QMOE_INPUTS = tuple(range(14))
_INPUT_NAMES = (
    "x",
    "logits",
    "fc1",
    "fc1_scales",
    "fc1_bias",
    "fc2",
    "fc2_scales",
    "fc2_bias",
    "fc3",
    "fc3_scales",
    "fc3_bias",
    "fc1_zero_points",
    "fc2_zero_points",
    "fc3_zero_points",
)


@dataclass(frozen=True)
class _FusedInputs:
    """The named inputs of one MoE / QMoE node ('' where absent)."""

    values: dict[str, str]

    def __getitem__(self, key: str) -> str:
        return self.values[key]


def _named_inputs(node: onnx.NodeProto, positions: tuple[int, ...]) -> _FusedInputs:
    values = {}
    for name, position in zip(_INPUT_NAMES, positions, strict=True):
        values[name] = node.input[position] if 0 <= position < len(node.input) else ""
    return _FusedInputs(values)


@dataclass(frozen=True)
class _FusedShape:
    """The expert shape and precision a fused node's weights establish."""

    num_experts: int
    hidden: int
    ffn: int
    fc1_rows: int
    weight_dtype: str
    bits: int = 0
    block_size: int = 0


def _cuda_qmoe_layout(fc1: tuple[int, ...], fc2: tuple[int, ...], per_byte: int) -> bool:
    """True when the packed shapes only fit the CUDA layout: fc1 ``[E, H, F/p]`` and fc2 ``[E, I, H/p]``
    (F = I or 2I) and not the CPU layout fc1 ``[E, F, H/p]``, fc2 ``[E, H, I/p]``."""
    hidden, ffn = fc2[2] * per_byte, fc2[1]
    cuda = fc1[1] == hidden and fc1[2] * per_byte in (ffn, 2 * ffn)
    cpu_hidden, cpu_ffn = fc2[1], fc2[2] * per_byte
    cpu = fc1[2] * per_byte == cpu_hidden and fc1[1] in (cpu_ffn, 2 * cpu_ffn)
    return cuda and not cpu


def _text_attr(index: GraphIndex, node: onnx.NodeProto, name: str, default: str) -> str:
    value = index.attr(node, name, default)
    return value.decode() if isinstance(value, bytes) else value


@default_rule(order=10)
class FusedMoERule:
    """Turns each ``com.microsoft.MoE`` / ``QMoE`` node into a :class:`FusedMoEBlockPlan` (or a :class:`Skip`).

    Stages: inputs and attributes understood → shapes and precision → quantization tensors and biases fit →
    weights and activation read → router nodes planned. Each stage returns its value or a skip reason.
    """

    name = "fused_moe"

    def find(self, index: GraphIndex) -> list[MoEBlockPlan | Skip]:
        results: list[MoEBlockPlan | Skip] = []
        fused = [n for n in index.graph.node if n.domain == MS_DOMAIN and n.op_type in ("MoE", "QMoE")]
        for ordinal, node in enumerate(fused):
            outcome = self._plan(index, node, ordinal)
            if isinstance(outcome, str):
                where = node.name or block_name_of(node, ordinal)
                outcome = Skip(where, f"com.microsoft.{node.op_type}: {outcome}", (node.name,))
            results.append(outcome)
        return results

    def _plan(self, index: GraphIndex, node: onnx.NodeProto, ordinal: int) -> MoEBlockPlan | str:
        inputs = self._inputs(index, node)
        if isinstance(inputs, str):
            return inputs
        reason = self._attributes(index, node)
        if reason:
            return reason
        shape = self._shape(index, node, inputs)
        if isinstance(shape, str):
            return shape
        reason = self._quantization_and_biases(index, node, inputs, shape)
        if reason:
            return reason
        read = self._weights(index, node, inputs, shape)
        if isinstance(read, str):
            return read
        weights, activation, (alpha, limit, beta), notes = read
        block = block_name_of(node, ordinal)
        top_k = int(index.attr(node, "k", DEFAULT_K))
        normalize = bool(index.attr(node, "normalize_routing_weights", 0))
        prefix = f"{block}/ndp_ep"
        logits = inputs["logits"]
        typed_weight = inputs["fc1_scales" if shape.bits else "fc1"]
        logits_type = index.elem_type(logits) or index.initializers[typed_weight].data_type
        in_float32 = logits_type == onnx.TensorProto.BFLOAT16
        router_nodes, ids, routing_weights, _ = fused_moe_router_nodes(logits, top_k, normalize, prefix, in_float32)
        router_nodes = router_as_constant_nodes(top_k, normalize, prefix) + router_nodes
        return FusedMoEBlockPlan(
            name=block,
            rule=self.name,
            hidden_value=inputs["x"],
            expert_ids_value=ids,
            routing_weights_value=routing_weights,
            output_value=node.output[0],
            num_experts=shape.num_experts,
            top_k=top_k,
            hidden=shape.hidden,
            ffn=shape.ffn,
            activation=activation,
            weights=weights,
            replaced_nodes=(node.name,),
            activation_alpha=alpha,
            activation_limit=limit,
            activation_beta=beta,
            notes=tuple(notes),
            router_nodes=tuple(router_nodes),
            weight_dtype=shape.weight_dtype,
            quant_block_size=shape.block_size,
        )

    @staticmethod
    def _inputs(index: GraphIndex, node: onnx.NodeProto) -> _FusedInputs | str:
        quantized = node.op_type == "QMoE"
        if not node.name:
            return "the node has no name, so the rewriter cannot address it"
        limit_inputs = 14 if quantized else 8
        if len(node.input) > limit_inputs:
            return f"{len(node.input)} inputs; only the {limit_inputs} of the op schema are understood"
        inputs = _named_inputs(node, _QMOE_INPUTS if quantized else _MOE_INPUTS)
        for label in _INPUT_NAMES[2:]:
            value = inputs[label]
            if value and index.initializer_shape(value) is None:
                return f"{label} {value!r} is not an initializer (computed weights cannot be sharded)"
        has_fc3 = bool(inputs["fc3"] or inputs["fc3_bias"] or inputs["fc3_scales"])
        activation_type = _text_attr(index, node, "activation_type", DEFAULT_ACTIVATION)
        if has_fc3 and (quantized or activation_type in FUSED_GATED_ACTIVATIONS):
            return "a separate fc3 projection is not supported with this op / activation"
        return inputs

    @staticmethod
    def _attributes(index: GraphIndex, node: onnx.NodeProto) -> str:
        if index.attr(node, "use_sparse_mixer", 0):
            return "use_sparse_mixer=1 (sparse-mixer routing) is not expressible as softmax/top-k routing"
        if index.attr(node, "swiglu_limit_after_activation", 0):
            return "swiglu_limit_after_activation=1 is not supported"
        if node.op_type == "QMoE":
            bits = int(index.attr(node, "expert_weight_bits", 4))
            quant_type = _text_attr(index, node, "quant_type", "int")
            if bits not in QUANT_DTYPE_OF_BITS or quant_type != "int":
                return f"expert_weight_bits={bits}, quant_type={quant_type}: only int4 and int8 are supported"
            if int(index.attr(node, "block_size", 0)) <= 0:
                return "per-row (block_size=0) quantization is not supported; only block-wise scales are"
            if int(index.attr(node, "weights_prepacked", 0)):
                return "weights_prepacked=1 (CUDA CUTLASS layout) is not supported"
        return ""

    @staticmethod
    def _shape(index: GraphIndex, node: onnx.NodeProto, inputs: _FusedInputs) -> _FusedShape | str:
        fc1_shape, fc2_shape = index.initializer_shape(inputs["fc1"]), index.initializer_shape(inputs["fc2"])
        if fc1_shape is None or fc2_shape is None or len(fc1_shape) != 3 or len(fc2_shape) != 3:
            return f"fc1 {fc1_shape} / fc2 {fc2_shape} are not [E, out, in] stacks"
        fused_gated = _text_attr(index, node, "activation_type", DEFAULT_ACTIVATION) in FUSED_GATED_ACTIVATIONS
        bits = block_size = 0
        if node.op_type == "QMoE":
            bits = int(index.attr(node, "expert_weight_bits", 4))
            block_size = int(index.attr(node, "block_size", 0))
            weight_dtype = QUANT_DTYPE_OF_BITS[bits]
            per_byte = 8 // bits
            num_experts, hidden, ffn = fc2_shape[0], fc2_shape[1], fc2_shape[2] * per_byte
            fc1_in = fc1_shape[2] * per_byte
            for label in ("fc1", "fc2"):
                if index.initializers[inputs[label]].data_type != onnx.TensorProto.UINT8:
                    return f"{label} weights are not packed uint8"
            if _cuda_qmoe_layout(fc1_shape, fc2_shape, per_byte):
                return (
                    "weights in the CUDA QMoE layout ([E, in, out*bits/8], a `-e cuda` export): only the CPU "
                    "layout ([E, out, in*bits/8]) is supported; re-export with `-e cpu`"
                )
        else:
            num_experts, hidden, ffn = fc2_shape
            fc1_in = fc1_shape[2]
            dtypes = {index.initializers[inputs[k]].data_type for k in ("fc1", "fc2", "fc3") if inputs[k]}
            if len(dtypes) != 1 or next(iter(dtypes)) not in FLOAT_WEIGHT_DTYPE_OF_ONNX:
                names = sorted(onnx.TensorProto.DataType.Name(d) for d in dtypes)
                return f"expert weights of type {', '.join(names)} (float32, float16 or bfloat16 expected)"
            weight_dtype = FLOAT_WEIGHT_DTYPE_OF_ONNX[next(iter(dtypes))]
        fc1_rows = 2 * ffn if fused_gated else ffn
        if (fc1_shape[0], fc1_shape[1], fc1_in) != (num_experts, fc1_rows, hidden):
            expected = (num_experts, fc1_rows, hidden)
            return f"fc1 shape {tuple(fc1_shape)} does not match fc2 {tuple(fc2_shape)} (expected {expected} unpacked)"
        fc3 = inputs["fc3"]
        if fc3 and tuple(index.initializer_shape(fc3)) != (num_experts, ffn, hidden):
            return f"fc3 shape {index.initializer_shape(fc3)} is not {(num_experts, ffn, hidden)}"
        top_k = int(index.attr(node, "k", DEFAULT_K))
        if not 0 < top_k <= num_experts:
            return f"k={top_k} is not in 1..{num_experts}"
        logits_shape = index.shape(inputs["logits"])
        if logits_shape is not None and (
            len(logits_shape) != 2 or (isinstance(logits_shape[-1], int) and logits_shape[-1] != num_experts)
        ):
            return f"router input {inputs['logits']!r} has shape {logits_shape}, expected [tokens, {num_experts}]"
        return _FusedShape(num_experts, hidden, ffn, fc1_rows, weight_dtype, bits, block_size)

    @staticmethod
    def _quantization_and_biases(
        index: GraphIndex, node: onnx.NodeProto, inputs: _FusedInputs, shape: _FusedShape
    ) -> str:
        if shape.bits:
            block = shape.block_size
            for label, rows, cols in (("fc1", shape.fc1_rows, shape.hidden), ("fc2", shape.hidden, shape.ffn)):
                blocks = quant.block_count(cols, block)  # a partial last block keeps its own scale
                expected = (shape.num_experts, rows, blocks)
                scales = index.initializer_shape(inputs[f"{label}_scales"])
                if scales is None or tuple(scales) != expected:
                    return f"{label}_scales shape {scales} is not {expected}"
                zero_points = inputs[f"{label}_zero_points"]
                zp_expected = (shape.num_experts, rows, quant.packed_width(blocks, shape.bits))
                zp_shape = index.initializer_shape(zero_points) if zero_points else None
                if zero_points and tuple(zp_shape) != zp_expected:
                    return f"{label}_zero_points shape {zp_shape} is not {zp_expected}"
        for label, width in (("fc1_bias", shape.fc1_rows), ("fc2_bias", shape.hidden), ("fc3_bias", shape.ffn)):
            value = inputs[label]
            if value and tuple(index.initializer_shape(value)) != (shape.num_experts, width):
                return f"{label} shape {index.initializer_shape(value)} is not {(shape.num_experts, width)}"
        return ""

    @staticmethod
    def _weights(index: GraphIndex, node: onnx.NodeProto, inputs: _FusedInputs, shape: _FusedShape):
        """``(ExpertWeights, activation, (alpha, limit, beta), notes)`` or a skip reason."""
        activation_type = _text_attr(index, node, "activation_type", DEFAULT_ACTIVATION)
        alpha = float(index.attr(node, "activation_alpha", DEFAULT_ALPHA))
        beta = float(index.attr(node, "activation_beta", DEFAULT_BETA))
        limit = float(index.attr(node, "swiglu_limit", math.inf))
        fc1_bias, fc2_bias, fc3_bias = inputs["fc1_bias"], inputs["fc2_bias"], inputs["fc3_bias"]

        def matrix(label: str, columns: str = "all") -> StackedMatrix:
            if not shape.bits:
                return StackedMatrix(inputs[label], "out_in", columns=columns)
            scales, zero_points = inputs[f"{label}_scales"], inputs[f"{label}_zero_points"]
            return StackedMatrix(inputs[label], "out_in", columns=columns, scales=scales, zero_points=zero_points)

        def bias(value: str, columns: str = "all") -> StackedBias | None:
            return StackedBias(value, columns) if value else None

        down, down_bias = matrix("fc2"), bias(fc2_bias)
        notes = [f"com.microsoft.{node.op_type} activation_type={activation_type}"]
        parameters = (SWIGLU_ALPHA, SWIGLU_LIMIT, SWIGLU_BETA)
        if activation_type == "swiglu":
            fusion = int(index.attr(node, "swiglu_fusion", DEFAULT_SWIGLU_FUSION))
            if fusion != 1:
                return f"swiglu_fusion={fusion}: only the interleaved layout (1) has defined semantics here"
            if beta == 0.0 and alpha == 1.0 and math.isinf(limit):
                activation = "silu_glu"
            else:
                activation, parameters = "swiglu_clamp", (alpha, limit, beta)
            weights = ExpertWeights(
                up=matrix("fc1", "odd"),
                down=down,
                gate=matrix("fc1", "even"),
                up_bias=bias(fc1_bias, "odd"),
                gate_bias=bias(fc1_bias, "even"),
                down_bias=down_bias,
            )
        elif activation_type == "geglu":
            fusion = int(index.attr(node, "swiglu_fusion", DEFAULT_SWIGLU_FUSION))
            if fusion not in GEGLU_GATE_UP_ROWS:
                return f"activation_type=geglu with swiglu_fusion={fusion}: the op schema requires fused fc1 (1 or 2)"
            gate_rows, up_rows = GEGLU_GATE_UP_ROWS[fusion]
            activation = "gelu_tanh_glu"  # alpha, beta and swiglu_limit do not affect GEGLU (op schema)
            notes.append("geglu = gelu_tanh(gate) * up, which stock ONNX Runtime's CPU kernels refuse (CUDA only)")
            weights = ExpertWeights(
                up=matrix("fc1", up_rows),
                down=down,
                gate=matrix("fc1", gate_rows),
                up_bias=bias(fc1_bias, up_rows),
                gate_bias=bias(fc1_bias, gate_rows),
                down_bias=down_bias,
            )
        elif inputs["fc3"]:
            if activation_type not in GATED_ACTIVATION_OF_FC3:
                return f"activation_type={activation_type} with an fc3 input has no matching gated activation"
            activation = GATED_ACTIVATION_OF_FC3[activation_type]
            notes.append("fc3 gating per the ONNX Runtime CUDA kernel: act(fc1 x) * fc3 x (the CPU kernel refuses fc3)")
            weights = ExpertWeights(
                up=matrix("fc3"),
                down=down,
                gate=matrix("fc1"),
                up_bias=bias(fc3_bias),
                gate_bias=bias(fc1_bias),
                down_bias=down_bias,
            )
        else:
            if activation_type not in PLAIN_ACTIVATION_OF:
                return f"activation_type={activation_type!r} is not supported"
            activation = PLAIN_ACTIVATION_OF[activation_type]
            weights = ExpertWeights(up=matrix("fc1"), down=down, up_bias=bias(fc1_bias), down_bias=down_bias)
        return weights, activation, parameters, notes
