"""Decode steps of a claimed expert node as ONNX Runtime's own kernels.

The provider compiles every claimed ``ShardedMoEExperts`` node into

    If(Size(expert_ids) == top_k)                        one token: a decode step
      then: native sharded experts (below)                 ORT kernels, no Python call
      else: ai.onnx.contrib::NdpShardedMoE(...)            prefill: the Python kernel groups tokens by expert

A decode step pays ONNX Runtime's per-kernel cost instead of a round trip into Python, which at one token
costs more than the arithmetic. Its numerics are those of the sharded op: each selected expert's shards
compute their partial products separately and a ReduceSum over the shard axis adds the partial sums:

    ids[K] ─ Gather(first[E,S,H,W]) ─┐
    x[1,1,1,H] ──────────── MatMul ◄─┘ ─ [K,S,1,W] ─ activation ─ [K,S,1,I/S] ─┐
    ids ─ Gather(down[E,S,I/S,H]) ───────────────────────────────── MatMul ◄───┘ ─ [K,S,1,H]
      ─ ReduceSum(shards) ─ [K,1,H] ─ Mul(routing weights [K,1,1]) ─ ReduceSum(k) ─ Reshape(like x)
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ndp_ep.kernels import CUSTOM_DOMAIN, ORT_OP_TYPE, ShardedExperts

MIN_OPSET = 13  # ReduceSum with axes as an input


class _Emitter:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = itertools.count()

    def const(self, name: str, array: np.ndarray) -> str:
        full = f"{self.prefix}/{name}"
        self.initializers.append(numpy_helper.from_array(np.asarray(array), full))
        return full

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        index = next(self._count)
        out = f"{self.prefix}/{op_type}_{index}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out


def _gelu(e: _Emitter, x: str) -> str:
    half = e.const("half", np.float32(0.5))
    one = e.const("one", np.float32(1.0))
    erf = e.op("Erf", [e.op("Mul", [x, e.const("inv_sqrt2", np.float32(1 / np.sqrt(2.0)))])])
    return e.op("Mul", [e.op("Mul", [x, half]), e.op("Add", [erf, one])])


def _gelu_tanh(e: _Emitter, x: str) -> str:
    cube = e.op("Mul", [e.op("Mul", [x, x]), x])
    inner = e.op("Add", [x, e.op("Mul", [cube, e.const("c044715", np.float32(0.044715))])])
    tanh = e.op("Tanh", [e.op("Mul", [inner, e.const("sqrt_2_pi", np.float32(np.sqrt(2.0 / np.pi)))])])
    return e.op(
        "Mul",
        [e.op("Mul", [x, e.const("half_t", np.float32(0.5))]), e.op("Add", [tanh, e.const("one_t", np.float32(1.0))])],
    )


def _activation(e: _Emitter, experts: ShardedExperts, h: str, width: int) -> str:
    name = experts.activation
    if not experts.gated:
        if name == "relu":
            return e.op("Relu", [h])
        if name == "gelu":
            return _gelu(e, h)
        if name == "gelu_tanh":
            return _gelu_tanh(e, h)
        return e.op("Mul", [h, e.op("Sigmoid", [h])])  # silu
    axis = e.const("axis_w", np.array([3], np.int64))
    half = width // 2
    gate = e.op("Slice", [h, e.const("s0", np.array([0], np.int64)), e.const("s1", np.array([half], np.int64)), axis])
    up = e.op("Slice", [h, e.const("u0", np.array([half], np.int64)), e.const("u1", np.array([width], np.int64)), axis])
    if name == "silu_glu":
        return e.op("Mul", [e.op("Mul", [gate, e.op("Sigmoid", [gate])]), up])
    if name == "gelu_glu":
        return e.op("Mul", [_gelu(e, gate), up])
    limit = np.float32(experts.activation_limit)
    gate = e.op("Min", [gate, e.const("limit", limit)])
    up = e.op("Clip", [up, e.const("neg_limit", -limit), e.const("pos_limit", limit)])
    glu = e.op(
        "Mul", [gate, e.op("Sigmoid", [e.op("Mul", [gate, e.const("alpha", np.float32(experts.activation_alpha))])])]
    )
    return e.op("Mul", [e.op("Add", [up, e.const("one_s", np.float32(1.0))]), glu])


def decode_branch(
    experts: ShardedExperts,
    prefix: str,
    hidden: str,
    ids: str,
    weights: str,
    output: str,
    flat_ids: str | None = None,
):
    """Nodes and initializers computing one token's sharded experts with ONNX ops; last node writes ``output``.

    ``flat_ids``: the ids already flattened to ``[K]`` by the caller (the session shares that with the routing
    output), else they are flattened here."""
    e = _Emitter(prefix)
    num_experts, shards, hidden_size, width = experts.first.shape
    first = e.const("first", experts.first)
    down = e.const("down", experts.down)
    ids_flat = flat_ids or e.op("Reshape", [ids, e.const("flat", np.array([-1], np.int64))])
    x = e.op("Reshape", [hidden, e.const("row", np.array([1, 1, 1, hidden_size], np.int64))])
    h = e.op("MatMul", [x, e.op("Gather", [first, ids_flat], axis=0)])  # [K, S, 1, W]
    if experts.first_bias is not None:
        bias = e.const("first_bias", experts.first_bias.reshape(num_experts, shards, 1, width))
        h = e.op("Add", [h, e.op("Gather", [bias, ids_flat], axis=0)])
    partial = e.op("MatMul", [_activation(e, experts, h, width), e.op("Gather", [down, ids_flat], axis=0)])
    y = e.op("ReduceSum", [partial, e.const("shard_axis", np.array([1], np.int64))], keepdims=0)  # [K, 1, H]
    if experts.down_bias is not None:
        bias = e.const("down_bias", experts.down_bias.reshape(num_experts, 1, hidden_size))
        y = e.op("Add", [y, e.op("Gather", [bias, ids_flat], axis=0)])
    w = e.op("Reshape", [weights, e.const("w_shape", np.array([-1, 1, 1], np.int64))])
    combined = e.op("ReduceSum", [e.op("Mul", [y, w]), e.const("k_axis", np.array([0], np.int64))], keepdims=0)
    e.nodes.append(helper.make_node("Reshape", [combined, e.op("Shape", [hidden])], [output], name=f"{prefix}/out"))
    return e.nodes, e.initializers


def compiled_node(
    experts: ShardedExperts,
    kernel_key: str,
    prefix: str,
    hidden: str,
    ids: str,
    weights: str,
    output: str,
    is_decode: str | None = None,
    flat_ids: str | None = None,
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str]:
    """The If node that replaces one claimed node, and the nodes computing its condition unless ``is_decode``
    (a boolean computed for an earlier layer: every layer of a run sees the same token count) is given.
    Returns the nodes, the initializers and the condition's value name."""
    then_nodes, initializers = decode_branch(
        experts, f"{prefix}/decode", hidden, ids, weights, f"{prefix}/decode_out", flat_ids
    )
    python_op = helper.make_node(
        ORT_OP_TYPE,
        [hidden, ids, weights],
        [f"{prefix}/python_out"],
        name=f"{prefix}/python",
        domain=CUSTOM_DOMAIN,
        kernel=kernel_key,
    )

    def branch(name: str, nodes: list[onnx.NodeProto], out: str) -> onnx.GraphProto:
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])

    condition_nodes: list[onnx.NodeProto] = []
    if is_decode is None:
        k_name = f"{prefix}/top_k"
        initializers.append(numpy_helper.from_array(np.array(experts.top_k, np.int64), k_name))
        size = helper.make_node("Size", [ids], [f"{prefix}/ids_size"], name=f"{prefix}/ids_size")
        is_decode = f"{prefix}/is_decode"
        condition_nodes = [size, helper.make_node("Equal", [size.output[0], k_name], [is_decode], name=is_decode)]
    dispatch = helper.make_node(
        "If",
        [is_decode],
        [output],
        name=f"{prefix}/dispatch",
        then_branch=branch(f"{prefix}_decode", then_nodes, f"{prefix}/decode_out"),
        else_branch=branch(f"{prefix}_prefill", [python_op], f"{prefix}/python_out"),
    )
    return [*condition_nodes, dispatch], initializers, is_decode
