"""Build the bundled sample MoE models with onnx.helper (no torch needed).

    python -m sample_models.build_samples        # rewrites sample_models/*.onnx and *.npz

The expert computation follows what ``torch.onnx.export(..., dynamo=True)`` emits for a Hugging Face
Mixtral block with ``experts_implementation="batched_mm"``:

    x[T,H] ─Gemm(router)─ Softmax ─ TopK ─┬─ values ─ ReduceSum/Div ─ rw[T,K] ───────────────┐
                                          └─ ids ─ Unsqueeze ─┬─ GatherND(W_gate_up[E,2I,H]) │
    x ─ Unsqueeze ─ Tile(per top-k slot) ─ MatMul ◄───────────┘             │                │
         Split ─ gate·Sigmoid(gate)·up ─ MatMul ◄─ GatherND(W_down[E,H,I]) ─┘                │
         Squeeze ─ Mul(rw) ◄─────────────────────────────────────────────────────────────────┘
         ReduceSum(axis=k) ─ y[T,H]

``moe_block`` is one such block on ``hidden_states[batch, seq, H]``; ``moe_decoder`` is a small decoder:
token embedding, then per layer RMSNorm → causal single-head attention → residual → RMSNorm → MoE block →
residual, then a final norm and an LM head.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 18
HERE = Path(__file__).parent


@dataclass(frozen=True)
class MoEBlockSpec:
    """Shape knobs of one MoE block (one builder knob per edge case in tests)."""

    num_experts: int = 8
    top_k: int = 2
    hidden: int = 64
    ffn: int = 128
    normalize: bool = True  # renormalise the top-k probabilities (Mixtral) or not (Qwen2-MoE style)


class GraphBuilder:
    """Accumulates nodes and initializers with unique, readable names."""

    def __init__(self, seed: int) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(seed)
        self._count = 0

    def weight(self, name: str, shape: tuple[int, ...], scale: float | None = None) -> str:
        fan_in = shape[-1]
        std = scale if scale is not None else 1.0 / np.sqrt(fan_in)
        array = (self.rng.standard_normal(shape) * std).astype(np.float32)
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def const(self, name: str, values, dtype=np.int64) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(values, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], prefix: str, outputs: int = 1, **attrs) -> list[str]:
        self._count += 1
        name = f"{prefix}/{op_type}_{self._count}"
        outs = [f"{name}_out{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs

    def op1(self, op_type: str, inputs: list[str], prefix: str, **attrs) -> str:
        return self.op(op_type, inputs, prefix, **attrs)[0]


def add_moe_block(b: GraphBuilder, x2d: str, prefix: str, spec: MoEBlockSpec) -> str:
    """Append one MoE block reading ``x2d`` ([T, H]); returns the name of its [T, H] output."""
    e, k, h, i = spec.num_experts, spec.top_k, spec.hidden, spec.ffn
    router = b.weight(f"{prefix}.gate.weight", (e, h))
    gate_up = b.weight(f"{prefix}.experts.gate_up_proj", (e, 2 * i, h))
    down = b.weight(f"{prefix}.experts.down_proj", (e, h, i))
    logits = b.op1("Gemm", [x2d, router], prefix, transB=1)
    probs = b.op1("Softmax", [logits], prefix, axis=-1)
    top_values, top_ids = b.op("TopK", [probs, b.const(f"{prefix}.k", [k])], prefix, outputs=2, axis=-1)
    if spec.normalize:
        denom = b.op1("ReduceSum", [top_values, b.const(f"{prefix}.axes_last", [-1])], prefix, keepdims=1)
        weights = b.op1("Div", [top_values, denom], prefix)
    else:
        weights = top_values
    ids_nd = b.op1("Unsqueeze", [top_ids, b.const(f"{prefix}.axes_m1", [-1])], prefix)  # [T,K,1]
    x_col = b.op1("Unsqueeze", [x2d, b.const(f"{prefix}.axes_1_3", [1, 3])], prefix)  # [T,1,H,1]
    x_rep = b.op1("Tile", [x_col, b.const(f"{prefix}.repeats", [1, k, 1, 1])], prefix)  # [T,K,H,1]
    w_gu = b.op1("GatherND", [gate_up, ids_nd], prefix)  # [T,K,2I,H]
    gu = b.op1("MatMul", [w_gu, x_rep], prefix)  # [T,K,2I,1]
    gu = b.op1("Squeeze", [gu, b.const(f"{prefix}.axes_sq", [-1])], prefix)  # [T,K,2I]
    gate, up = b.op("Split", [gu, b.const(f"{prefix}.split", [i, i])], prefix, outputs=2, axis=-1)
    act = b.op1("Mul", [b.op1("Mul", [gate, b.op1("Sigmoid", [gate], prefix)], prefix), up], prefix)
    w_d = b.op1("GatherND", [down, ids_nd], prefix)  # [T,K,H,I]
    act_col = b.op1("Unsqueeze", [act, b.const(f"{prefix}.axes_m1b", [-1])], prefix)  # [T,K,I,1]
    y = b.op1("MatMul", [w_d, act_col], prefix)  # [T,K,H,1]
    y = b.op1("Squeeze", [y, b.const(f"{prefix}.axes_sq2", [-1])], prefix)  # [T,K,H]
    w_col = b.op1("Unsqueeze", [weights, b.const(f"{prefix}.axes_m1c", [-1])], prefix)  # [T,K,1]
    weighted = b.op1("Mul", [y, w_col], prefix)
    return b.op1("ReduceSum", [weighted, b.const(f"{prefix}.axes_k", [1])], prefix, keepdims=0)


def add_rms_norm(b: GraphBuilder, x: str, prefix: str, hidden: int) -> str:
    b.initializers.append(numpy_helper.from_array(np.ones(hidden, np.float32), f"{prefix}.weight"))
    sq = b.op1("Mul", [x, x], prefix)
    mean = b.op1("ReduceMean", [sq, b.const(f"{prefix}.axes", [-1])], prefix, keepdims=1)
    eps = b.const(f"{prefix}.eps", [1e-6], dtype=np.float32)
    inv = b.op1("Reciprocal", [b.op1("Sqrt", [b.op1("Add", [mean, eps], prefix)], prefix)], prefix)
    return b.op1("Mul", [b.op1("Mul", [x, inv], prefix), f"{prefix}.weight"], prefix)


def add_attention(b: GraphBuilder, x: str, prefix: str, hidden: int) -> str:
    """Single-head causal self-attention on x [B, S, H]."""
    q = b.op1("MatMul", [x, b.weight(f"{prefix}.q_proj", (hidden, hidden))], prefix)
    k = b.op1("MatMul", [x, b.weight(f"{prefix}.k_proj", (hidden, hidden))], prefix)
    v = b.op1("MatMul", [x, b.weight(f"{prefix}.v_proj", (hidden, hidden))], prefix)
    kt = b.op1("Transpose", [k], prefix, perm=[0, 2, 1])
    scores = b.op1("MatMul", [q, kt], prefix)
    scores = b.op1("Mul", [scores, b.const(f"{prefix}.scale", [1 / np.sqrt(hidden)], np.float32)], prefix)
    # causal mask: -1e9 above the diagonal, built from the runtime sequence length
    seq = b.op1("Gather", [b.op1("Shape", [x], prefix), b.const(f"{prefix}.idx1", 1)], prefix, axis=0)
    ar = b.op1("Range", [b.const(f"{prefix}.zero", 0), seq, b.const(f"{prefix}.one", 1)], prefix)
    rows = b.op1("Unsqueeze", [ar, b.const(f"{prefix}.ax1", [1])], prefix)
    cols = b.op1("Unsqueeze", [ar, b.const(f"{prefix}.ax0", [0])], prefix)
    future = b.op1("Greater", [cols, rows], prefix)
    neg = b.const(f"{prefix}.neg", -1e9, np.float32)
    zero = b.const(f"{prefix}.fzero", 0.0, np.float32)
    mask = b.op1("Where", [future, neg, zero], prefix)
    probs = b.op1("Softmax", [b.op1("Add", [scores, mask], prefix)], prefix, axis=-1)
    ctx = b.op1("MatMul", [probs, v], prefix)
    return b.op1("MatMul", [ctx, b.weight(f"{prefix}.o_proj", (hidden, hidden))], prefix)


def _model(b: GraphBuilder, inputs, outputs, name: str) -> onnx.ModelProto:
    graph = helper.make_graph(b.nodes, name, inputs, outputs, b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ndp-ep samples")
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def build_moe_block(spec: MoEBlockSpec = MoEBlockSpec(), seed: int = 0) -> onnx.ModelProto:
    """One MoE block on ``hidden_states[batch, seq, H]`` → ``output[batch, seq, H]``."""
    b = GraphBuilder(seed)
    h = spec.hidden
    shape_3d = b.op1("Shape", ["hidden_states"], "moe")
    x2d = b.op1("Reshape", ["hidden_states", b.const("moe.flat_shape", [-1, h])], "moe")
    y2d = add_moe_block(b, x2d, "moe", spec)
    b.nodes.append(helper.make_node("Reshape", [y2d, shape_3d], ["output"], name="moe/Reshape_out"))
    x_info = helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT, ["batch", "seq", h])
    y_info = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", "seq", h])
    return _model(b, [x_info], [y_info], "moe_block")


def build_moe_decoder(
    layer_specs: tuple[MoEBlockSpec, ...] = (
        MoEBlockSpec(),
        MoEBlockSpec(num_experts=4, top_k=1, normalize=False),
        MoEBlockSpec(),
    ),
    vocab: int = 128,
    seed: int = 1,
) -> onnx.ModelProto:
    """A small decoder-like model: embedding, per layer attention + MoE with norms and residuals, LM head."""
    b = GraphBuilder(seed)
    h = layer_specs[0].hidden
    x = b.op1("Gather", [b.weight("model.embed_tokens.weight", (vocab, h), scale=1.0), "input_ids"], "embed")
    for index, spec in enumerate(layer_specs):
        prefix = f"model.layers.{index}"
        attn = add_attention(b, add_rms_norm(b, x, f"{prefix}.input_layernorm", h), f"{prefix}.self_attn", h)
        x = b.op1("Add", [x, attn], prefix)
        normed = add_rms_norm(b, x, f"{prefix}.post_attention_layernorm", h)
        shape_3d = b.op1("Shape", [normed], f"{prefix}.mlp")
        x2d = b.op1("Reshape", [normed, b.const(f"{prefix}.mlp.flat_shape", [-1, h])], f"{prefix}.mlp")
        y2d = add_moe_block(b, x2d, f"{prefix}.mlp", spec)
        x = b.op1("Add", [x, b.op1("Reshape", [y2d, shape_3d], f"{prefix}.mlp")], prefix)
    x = add_rms_norm(b, x, "model.norm", h)
    b.nodes.append(
        helper.make_node("MatMul", [x, b.weight("lm_head.weight", (h, vocab))], ["logits"], name="lm_head/MatMul")
    )
    ids_info = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
    logits_info = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", vocab])
    return _model(b, [ids_info], [logits_info], "moe_decoder")


def main() -> None:
    rng = np.random.default_rng(123)
    block = build_moe_block()
    onnx.save(block, HERE / "moe_block.onnx")
    np.savez(HERE / "moe_block.inputs.npz", hidden_states=rng.standard_normal((1, 7, 64)).astype(np.float32))
    decoder = build_moe_decoder()
    onnx.save(decoder, HERE / "moe_decoder.onnx")
    np.savez(HERE / "moe_decoder.inputs.npz", input_ids=rng.integers(0, 128, size=(1, 16), dtype=np.int64))
    print("wrote", ", ".join(str(p.name) for p in sorted(HERE.glob("*.onnx"))))


if __name__ == "__main__":
    main()
