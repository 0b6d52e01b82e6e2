"""Generators of small MoE graphs for the fuzz tests: the two families the converter targets.

* ``stacked``: the dynamo-style stacked-gather block of ``sample_models/build_samples.py`` (router Gemm →
  Softmax → TopK, GatherND of stacked ``[E, out, in]`` weights, batched MatMul), with a choice of expert
  activation (gated SiLU/GELU/ReLU, or plain ReLU/SiLU/GELU with a single up projection);
* ``fused``: ``com.microsoft.MoE`` nodes of ``sample_models/build_fused_moe.py`` (relu/gelu/silu/swiglu, biases,
  2-D or 3-D input, chained layers).

Both can be cast to float16 (weights, inputs and outputs). Everything is seeded by the case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from sample_models.build_fused_moe import FusedCase, build_case
from sample_models.build_samples import GraphBuilder

STACKED_ACTIVATIONS = ("silu_glu", "gelu_glu", "relu_glu", "relu", "silu", "gelu")
FUSED_ACTIVATIONS = ("relu", "gelu", "silu", "swiglu")
OPSET = 18


@dataclass(frozen=True)
class StackedCase:
    num_experts: int
    top_k: int
    hidden: int
    ffn: int
    activation: str
    normalize: bool
    batch: int
    tokens: int
    seed: int

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"top_k {self.top_k} must be in 1..{self.num_experts}")
        if self.activation not in STACKED_ACTIVATIONS:
            raise ValueError(f"unknown activation {self.activation}")


def _activation(b: GraphBuilder, kind: str, x: str, prefix: str) -> str:
    if kind == "relu":
        return b.op1("Relu", [x], prefix)
    if kind == "silu":
        return b.op1("Mul", [x, b.op1("Sigmoid", [x], prefix)], prefix)
    half = b.const(f"{prefix}.half_{len(b.nodes)}", 0.5, np.float32)
    one = b.const(f"{prefix}.one_{len(b.nodes)}", 1.0, np.float32)
    root2 = b.const(f"{prefix}.root2_{len(b.nodes)}", math.sqrt(2.0), np.float32)
    erf = b.op1("Erf", [b.op1("Div", [x, root2], prefix)], prefix)
    return b.op1("Mul", [b.op1("Mul", [x, half], prefix), b.op1("Add", [erf, one], prefix)], prefix)


def build_stacked(case: StackedCase) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One stacked-gather MoE block on ``hidden_states[batch, tokens, H]``."""
    b = GraphBuilder(case.seed)
    e, k, h, i, p = case.num_experts, case.top_k, case.hidden, case.ffn, "moe"
    gated = case.activation.endswith("_glu")
    shape_3d = b.op1("Shape", ["hidden_states"], p)
    x2d = b.op1("Reshape", ["hidden_states", b.const(f"{p}.flat_shape", [-1, h])], p)
    router = b.weight(f"{p}.gate.weight", (e, h))
    first = b.weight(f"{p}.experts.gate_up_proj" if gated else f"{p}.experts.up_proj", (e, (2 if gated else 1) * i, h))
    down = b.weight(f"{p}.experts.down_proj", (e, h, i))
    probs = b.op1("Softmax", [b.op1("Gemm", [x2d, router], p, transB=1)], p, axis=-1)
    values, ids = b.op("TopK", [probs, b.const(f"{p}.k", [k])], p, outputs=2, axis=-1)
    if case.normalize:
        values = b.op1("Div", [values, b.op1("ReduceSum", [values, b.const(f"{p}.axes_last", [-1])], p, keepdims=1)], p)
    ids_nd = b.op1("Unsqueeze", [ids, b.const(f"{p}.axes_m1", [-1])], p)
    x_rep = b.op1(
        "Tile",
        [b.op1("Unsqueeze", [x2d, b.const(f"{p}.axes_1_3", [1, 3])], p), b.const(f"{p}.repeats", [1, k, 1, 1])],
        p,
    )
    projected = b.op1(
        "Squeeze", [b.op1("MatMul", [b.op1("GatherND", [first, ids_nd], p), x_rep], p), b.const(f"{p}.sq", [-1])], p
    )
    if gated:
        gate, up = b.op("Split", [projected, b.const(f"{p}.split", [i, i])], p, outputs=2, axis=-1)
        act = b.op1("Mul", [_activation(b, case.activation.removesuffix("_glu"), gate, p), up], p)
    else:
        act = _activation(b, case.activation, projected, p)
    act_col = b.op1("Unsqueeze", [act, b.const(f"{p}.axes_m1b", [-1])], p)
    y = b.op1(
        "Squeeze", [b.op1("MatMul", [b.op1("GatherND", [down, ids_nd], p), act_col], p), b.const(f"{p}.sq2", [-1])], p
    )
    weighted = b.op1("Mul", [y, b.op1("Unsqueeze", [values, b.const(f"{p}.axes_m1c", [-1])], p)], p)
    y2d = b.op1("ReduceSum", [weighted, b.const(f"{p}.axes_k", [1])], p, keepdims=0)
    b.nodes.append(helper.make_node("Reshape", [y2d, shape_3d], ["output"], name=f"{p}/Reshape_out"))
    x_info = helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT, ["batch", "seq", h])
    y_info = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", "seq", h])
    graph = helper.make_graph(b.nodes, "fuzz_stacked", [x_info], [y_info], b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9
    x = np.random.default_rng(case.seed + 1).standard_normal((case.batch, case.tokens, h)).astype(np.float32)
    return model, {"hidden_states": x}


def build_fused(case: FusedCase) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    model, feeds, _ = build_case(case)
    return model, feeds


def to_float16(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[onnx.ModelProto, dict]:
    """The same graph with float32 weights, inputs and outputs stored as float16 (constants cast too)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for tensor in out.graph.initializer:
        if tensor.data_type == TensorProto.FLOAT:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float16), tensor.name))
    for value in [*out.graph.input, *out.graph.output, *out.graph.value_info]:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.FLOAT16
    halved = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()}
    return out, halved
