"""The sharded kernel equals the unsharded reference for every activation, with and without biases."""

from __future__ import annotations

import numpy as np
import pytest

from graph_passes.expert_math import ExpertArrays, expert_ffn
from graph_passes.plan import ExpertWeights, MoEBlockPlan, StackedMatrix
from ndp_ep.kernels import ShardedExperts

ACTIVATIONS = ["silu_glu", "swiglu_clamp", "gelu_glu", "relu", "gelu", "gelu_tanh", "silu"]


def _plan(activation: str, experts: int, top_k: int, hidden: int, ffn: int) -> MoEBlockPlan:
    gated = activation in ("silu_glu", "swiglu_clamp", "gelu_glu")
    matrix = StackedMatrix("w", "in_out")
    weights = ExpertWeights(up=matrix, down=matrix, gate=matrix if gated else None)
    return MoEBlockPlan(
        name="b",
        rule="test",
        hidden_value="x",
        expert_ids_value="i",
        routing_weights_value="r",
        output_value="y",
        num_experts=experts,
        top_k=top_k,
        hidden=hidden,
        ffn=ffn,
        activation=activation,
        weights=weights,
        replaced_nodes=(),
    )


def _kernel_and_reference(activation: str, biases: bool):
    """A sharded kernel and, for checking it, the unsharded experts it was cut from."""
    experts, top_k, hidden, ffn, shards = 4, 2, 16, 24, 3
    rng = np.random.default_rng(7)
    plan = _plan(activation, experts, top_k, hidden, ffn)
    arrays = []
    for _ in range(experts):
        arrays.append(
            ExpertArrays(
                up=rng.standard_normal((hidden, ffn)).astype(np.float32),
                down=rng.standard_normal((ffn, hidden)).astype(np.float32),
                gate=rng.standard_normal((hidden, ffn)).astype(np.float32) if plan.gated else None,
                up_bias=rng.standard_normal(ffn).astype(np.float32) if biases else None,
                gate_bias=rng.standard_normal(ffn).astype(np.float32) if biases and plan.gated else None,
                down_bias=rng.standard_normal(hidden).astype(np.float32) if biases else None,
            )
        )
    width = ffn // shards

    def first(a: ExpertArrays, s: int) -> np.ndarray:
        cols = slice(s * width, (s + 1) * width)
        return np.concatenate([a.gate[:, cols], a.up[:, cols]], axis=1) if plan.gated else a.up[:, cols]

    def first_bias(a: ExpertArrays, s: int) -> np.ndarray:
        cols = slice(s * width, (s + 1) * width)
        return np.concatenate([a.gate_bias[cols], a.up_bias[cols]]) if plan.gated else a.up_bias[cols]

    kernel = ShardedExperts(
        layer="b",
        num_experts=experts,
        top_k=top_k,
        shards=shards,
        activation=activation,
        activation_alpha=1.702,
        activation_limit=7.0,
        first=np.stack([[first(a, s) for s in range(shards)] for a in arrays]),
        down=np.stack([[a.down[s * width : (s + 1) * width] for s in range(shards)] for a in arrays]),
        first_bias=np.stack([[first_bias(a, s) for s in range(shards)] for a in arrays]) if biases else None,
        down_bias=np.stack([a.down_bias for a in arrays]) if biases else None,
    )
    return kernel, plan, arrays


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("tokens", [1, 5])
@pytest.mark.parametrize("biases", [False, True])
def test_sharded_kernel_equals_unsharded_reference(activation, tokens, biases):
    kernel, plan, arrays = _kernel_and_reference(activation, biases)
    rng = np.random.default_rng(tokens)
    hidden, experts, top_k = plan.hidden, plan.num_experts, plan.top_k
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    ids = np.stack([rng.choice(experts, top_k, replace=False) for _ in range(tokens)]).astype(np.int64)
    rw = rng.random((tokens, top_k)).astype(np.float32)
    expected = np.zeros_like(x)
    for t in range(tokens):
        for k in range(top_k):
            expected[t] += rw[t, k] * expert_ffn(plan, x[t : t + 1], arrays[ids[t, k]])[0]
    got = kernel(x, ids, rw)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("biases", [False, True])
def test_native_decode_graph_equals_the_python_kernel(activation, biases):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from ndp_ep.decode_graph import decode_branch

    kernel, plan, _ = _kernel_and_reference(activation, biases)
    nodes, initializers = decode_branch(kernel, "t", "x", "ids", "rw", "y")
    graph = helper.make_graph(
        nodes,
        "decode",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, plan.hidden]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, [1, plan.top_k]),
            helper.make_tensor_value_info("rw", TensorProto.FLOAT, [1, plan.top_k]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(11)
    for _ in range(5):
        x = rng.standard_normal((1, 1, plan.hidden)).astype(np.float32)
        ids = rng.choice(plan.num_experts, plan.top_k, replace=False).astype(np.int64).reshape(1, -1)
        rw = rng.random((1, plan.top_k)).astype(np.float32)
        (native,) = session.run(None, {"x": x, "ids": ids, "rw": rw})
        expected = kernel(x, ids, rw)
        assert native.shape == expected.shape == (1, 1, plan.hidden)
        np.testing.assert_allclose(native, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_kernel_rejects_out_of_range_expert_ids():
    kernel = ShardedExperts(
        layer="b",
        num_experts=2,
        top_k=1,
        shards=1,
        activation="relu",
        activation_alpha=1.0,
        activation_limit=1.0,
        first=np.zeros((2, 1, 4, 4), np.float32),
        down=np.zeros((2, 1, 4, 4), np.float32),
    )
    with pytest.raises(ValueError, match="out of range"):
        kernel(np.zeros((1, 4), np.float32), np.array([[2]]), np.ones((1, 1), np.float32))
    with pytest.raises(ValueError, match="out of range"):
        kernel(np.zeros((3, 4), np.float32), np.array([[0], [-1], [1]]), np.ones((3, 1), np.float32))


COEXISTENCE_SCRIPT = """
import sys, numpy as np, onnxruntime as ort
from onnx import TensorProto, helper
import ndp_ep
early = ndp_ep.InferenceSession(sys.argv[1])  # created before onnxruntime_extensions adds its own Python ops
hidden = np.ones((1, 3, 64), np.float32)
expected = early.run(None, {"hidden_states": hidden})[0]
from onnxruntime_extensions import PyCustomOpDef, get_library_path, onnx_op

@onnx_op(op_type="NdpEpTestNegate", inputs=[PyCustomOpDef.dt_float], outputs=[PyCustomOpDef.dt_float])
def negate(x):
    return -x

node = helper.make_node("NdpEpTestNegate", ["x"], ["y"], domain="ai.onnx.contrib")
graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.contrib", 1)])
options = ort.SessionOptions()
options.register_custom_ops_library(get_library_path())
theirs = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
late = ndp_ep.InferenceSession(sys.argv[1])
assert theirs.run(None, {"x": np.array([1.0, -2.0], np.float32)})[0].tolist() == [-1.0, 2.0]
assert np.array_equal(early.run(None, {"hidden_states": hidden})[0], expected)
assert np.array_equal(late.run(None, {"hidden_states": hidden})[0], expected)
assert theirs.run(None, {"x": np.array([3.0], np.float32).repeat(2)})[0].tolist() == [-3.0, -3.0]
print("ok")
"""


def test_python_ops_of_onnxruntime_extensions_coexist_with_ours(samples_dir, repo_root):
    """Their ops and ours in one process, ours created first; in a subprocess, since a failure here would be a
    segmentation fault."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", COEXISTENCE_SCRIPT, str(samples_dir / "moe_block.onnx")],
        capture_output=True,
        text=True,
        cwd=repo_root,
        timeout=120,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == "ok"
