"""Tiny model pairs for the diff tests, built with onnx.helper (seeded, a few KiB each).

The MoE pair follows the ndp-ep rewrite format: model A computes a 4-expert top-2 SiLU-gated MoE block with
ordinary ops on stacked weights; model B keeps the router and replaces the expert ops with one
``ndp_ep::ShardedMoEExperts`` node (built by graph_passes.sharded_op, the op contract) fed the per-expert,
per-shard weight initializers directly, as the converter emits it::

    A: x ─ router(MatMul, Softmax, TopK) ─ ids/weights ─┐
       x ─ Einsum(gate_up [E,2I,H]) ─ Split ─ SiLU·up ─ Einsum(down [E,H,I]) ─ weighted sum ─ y
    B: x ─ router (same) ─ ids/weights ─ ndp_ep::ShardedMoEExperts(x, ids, weights, shard weights…) ─ y
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graph_passes import sharded_op
from graph_passes.sharded_op import ShardedOpSpec

TOKENS, HIDDEN, FFN, EXPERTS, TOP_K, SHARDS = 3, 8, 4, 4, 2, 2
BLOCK = "moe0"


def _save(model: onnx.ModelProto, path: Path, external: bool = False) -> Path:
    if external:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.stem + ".weights.bin",
            size_threshold=0,
        )
    else:
        onnx.save_model(model, str(path))
    return path


def mlp_model(rename: bool = False, softmax_axis: int = -1, seed: int = 0) -> onnx.ModelProto:
    """x[2,8] → MatMul → Add → Relu → MatMul → Transpose → Softmax → y; ``rename`` renames nodes, inner tensors
    and initializers (not the graph's inputs and outputs)."""
    rng = np.random.default_rng(seed)
    p = "r_" if rename else ""
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), p + "fc1.weight")
    b1 = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), p + "fc1.bias")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), p + "fc2.weight")
    nodes = [
        helper.make_node("MatMul", ["x", p + "fc1.weight"], [p + "h1"], name=p + "fc1/MatMul"),
        helper.make_node("Add", [p + "h1", p + "fc1.bias"], [p + "h2"], name=p + "fc1/Add"),
        helper.make_node("Relu", [p + "h2"], [p + "h3"], name=p + "act/Relu"),
        helper.make_node("MatMul", [p + "h3", p + "fc2.weight"], [p + "h4"], name=p + "fc2/MatMul"),
        helper.make_node("Transpose", [p + "h4"], [p + "h5"], name=p + "head/Transpose", perm=[1, 0]),
        helper.make_node("Softmax", [p + "h5"], ["y"], name=p + "head/Softmax", axis=softmax_axis),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 2])],
        initializer=[w1, b1, w2],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="diff-tests")


def _router_nodes() -> list[onnx.NodeProto]:
    return [
        helper.make_node("MatMul", ["x", f"{BLOCK}.gate.weight"], ["router_logits"], name=f"{BLOCK}.gate/MatMul"),
        helper.make_node("Softmax", ["router_logits"], ["router_probs"], name=f"{BLOCK}.router/Softmax", axis=-1),
        helper.make_node(
            "TopK", ["router_probs", "top_k"], ["routing_weights", "expert_ids"], name=f"{BLOCK}.router/TopK"
        ),
    ]


def _router_initializers(rng: np.random.Generator) -> list[TensorProto]:
    return [
        numpy_helper.from_array(rng.standard_normal((HIDDEN, EXPERTS)).astype(np.float32), f"{BLOCK}.gate.weight"),
        numpy_helper.from_array(np.array([TOP_K], dtype=np.int64), "top_k"),
    ]


EXPERT_NODE_NAMES = (
    f"{BLOCK}.experts/Einsum_gate_up",
    f"{BLOCK}.experts/Split",
    f"{BLOCK}.experts/Sigmoid",
    f"{BLOCK}.experts/Mul_silu",
    f"{BLOCK}.experts/Mul_up",
    f"{BLOCK}.experts/Einsum_down",
    f"{BLOCK}.experts/ScatterElements",
    f"{BLOCK}.experts/Unsqueeze",
    f"{BLOCK}.experts/Mul_weights",
    f"{BLOCK}.experts/ReduceSum",
)


def moe_original(seed: int = 0) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """Model A and its stacked expert weights gate_up [E, 2I, H] and down [E, H, I]."""
    rng = np.random.default_rng(seed)
    router = _router_initializers(rng)
    gate_up = rng.standard_normal((EXPERTS, 2 * FFN, HIDDEN)).astype(np.float32)
    down = rng.standard_normal((EXPERTS, HIDDEN, FFN)).astype(np.float32)
    inits = router + [
        numpy_helper.from_array(gate_up, f"{BLOCK}.experts.gate_up_proj"),
        numpy_helper.from_array(down, f"{BLOCK}.experts.down_proj"),
        numpy_helper.from_array(np.zeros((TOKENS, EXPERTS), dtype=np.float32), f"{BLOCK}.experts.zeros"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), f"{BLOCK}.experts.axis2"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), f"{BLOCK}.experts.axis1"),
    ]
    n = EXPERT_NODE_NAMES
    experts = [
        helper.make_node("Einsum", ["x", f"{BLOCK}.experts.gate_up_proj"], ["gu"], name=n[0], equation="th,eih->tei"),
        helper.make_node("Split", ["gu"], ["g", "u"], name=n[1], axis=2, num_outputs=2),
        helper.make_node("Sigmoid", ["g"], ["g_sig"], name=n[2]),
        helper.make_node("Mul", ["g", "g_sig"], ["g_act"], name=n[3]),
        helper.make_node("Mul", ["g_act", "u"], ["act"], name=n[4]),
        helper.make_node("Einsum", ["act", f"{BLOCK}.experts.down_proj"], ["eo"], name=n[5], equation="tei,ehi->teh"),
        helper.make_node(
            "ScatterElements",
            [f"{BLOCK}.experts.zeros", "expert_ids", "routing_weights"],
            ["dense_w"],
            name=n[6],
            axis=1,
        ),
        helper.make_node("Unsqueeze", ["dense_w", f"{BLOCK}.experts.axis2"], ["dense_w3"], name=n[7]),
        helper.make_node("Mul", ["eo", "dense_w3"], ["weighted"], name=n[8]),
        helper.make_node("ReduceSum", ["weighted", f"{BLOCK}.experts.axis1"], ["moe_out"], name=n[9], keepdims=0),
    ]
    tail = [helper.make_node("Add", ["x", "moe_out"], ["y"], name="residual/Add")]
    graph = helper.make_graph(
        _router_nodes() + experts + tail,
        "moe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [TOKENS, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [TOKENS, HIDDEN])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="diff-tests")
    return model, gate_up, down


def moe_rewritten(gate_up: np.ndarray, down: np.ndarray, seed: int = 0, placement: bool = True) -> onnx.ModelProto:
    """Model B: the ndp-ep rewrite of :func:`moe_original`, in the form the converter emits — one sharded node
    built by the op contract (graph_passes.sharded_op), fed the per-expert, per-shard weights directly.

    The shards are sliced here by hand from the stacked weights, independently of the rewriter: shard ``s`` of
    expert ``e`` is ``[gate columns s | up columns s]`` of ``x @ W`` (``[H, 2I/S]``) and rows ``s`` of the down
    projection (``[I/S, H]``)."""
    rng = np.random.default_rng(seed)
    inits = _router_initializers(rng)
    spec = ShardedOpSpec(
        layer=BLOCK, num_experts=EXPERTS, top_k=TOP_K, hidden=HIDDEN, ffn=FFN, shards=SHARDS, activation="silu_glu"
    )
    step = FFN // SHARDS
    first, second = {}, {}
    for e in range(EXPERTS):
        gate_t, up_t = gate_up[e, :FFN, :].T, gate_up[e, FFN:, :].T  # [H, I]
        down_t = down[e].T  # [I, H]
        for s in range(SHARDS):
            cols = slice(s * step, (s + 1) * step)
            first[f"{BLOCK}.experts.{e}.shard{s}.gate_up"] = np.concatenate([gate_t[:, cols], up_t[:, cols]], axis=1)
            second[f"{BLOCK}.experts.{e}.shard{s}.down"] = down_t[cols, :]
    names = spec.weight_names()
    assert names == [*first, *second], "the contract's input order is expert-major, then shard"
    for name, array in {**first, **second}.items():
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
    summary = {"num_experts": EXPERTS, "top_k": TOP_K, "hidden": HIDDEN, "ffn": FFN, "shards": SHARDS}
    sharded = sharded_op.make_node(
        spec,
        "x",
        "expert_ids",
        "routing_weights",
        "moe_out",
        names,
        replaced_nodes=EXPERT_NODE_NAMES,
        summary={**summary, "activation": "silu_glu", "rule": "diff-tests"},
    )
    if placement:
        sharded_op.set_metadata(sharded, sharded_op.META_PLACEMENT, {"device": "ndp", "units": [0, 1]})
    tail = [helper.make_node("Add", ["x", "moe_out"], ["y"], name="residual/Add")]
    graph = helper.make_graph(
        [*_router_nodes(), sharded, *tail],
        "moe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [TOKENS, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [TOKENS, HIDDEN])],
        initializer=inits,
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(sharded_op.DOMAIN, sharded_op.OPSET)]
    return helper.make_model(graph, opset_imports=opsets, producer_name="diff-tests")


def write_pair(directory: Path, kind: str, external: bool = False) -> tuple[Path, Path]:
    """Write one named pair: identical, renamed, one_node_changed or ndp_ep_rewrite."""
    directory.mkdir(parents=True, exist_ok=True)
    if kind == "identical":
        a, b = mlp_model(), mlp_model()
    elif kind == "renamed":
        a, b = mlp_model(), mlp_model(rename=True)
    elif kind == "one_node_changed":
        a, b = mlp_model(), mlp_model(softmax_axis=0)
    elif kind == "ndp_ep_rewrite":
        a, gate_up, down = moe_original()
        b = moe_rewritten(gate_up, down)
    else:
        raise ValueError(kind)
    return _save(a, directory / f"{kind}_a.onnx", external), _save(b, directory / f"{kind}_b.onnx", external)
