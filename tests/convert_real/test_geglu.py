"""GeGLU MoE (``activation_type="geglu"``, Gemma-4 as ONNX Runtime GenAI's builder exports it): stock ONNX Runtime's
CPU kernels refuse it, so the converter proves such a block against the float64 reading of the op's documented
semantics (graph_passes/fused_reference.py), and the provider runs the converted model on CPU.

The reading is first checked against stock ONNX Runtime on every fused op it can run (routing, dequantization
with partial blocks, both gate/up layouts, the activations ORT's CPU kernels have); geglu then differs from what
was checked only in its activation, which tests/core/test_activations.py checks against a formula written there.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

import ndp_ep
from graph_passes import fused_reference
from graph_passes.convert import convert
from graph_passes.rewrite import materialize
from graph_passes.sharded_op import is_sharded_node, parse_node
from tests.convert_real.test_precisions import SILU_GLU, SWIGLU_GPT_OSS, TOKENS, _fused_model, qmoe_layer

ENV = "ORT_QMOE_CPU_QNBIT_GEMM"
EXPERTS = 4


def _float_layer(rng, activation: str, fusion: int, hidden: int, ffn: int, extra: dict | None = None):
    rows = 2 * ffn if activation in ("swiglu", "geglu") else ffn
    inputs = {
        "fc1": rng.normal(0, 0.3, (EXPERTS, rows, hidden)).astype(np.float32),
        "fc1_bias": rng.normal(0, 0.1, (EXPERTS, rows)).astype(np.float32),
        "fc2": rng.normal(0, 0.3, (EXPERTS, hidden, ffn)).astype(np.float32),
        "fc2_bias": rng.normal(0, 0.1, (EXPERTS, hidden)).astype(np.float32),
    }
    attrs = dict(k=2, activation_type=activation, normalize_routing_weights=1, **(extra or {}))
    if rows != ffn:
        attrs["swiglu_fusion"] = fusion
    return _fused_model("MoE", inputs, attrs, hidden, EXPERTS, TensorProto.FLOAT)


def _quantized_layer(rng, activation: str, bits: int, block: int, zero_points: bool, hidden: int, ffn: int):
    attrs = {"activation_type": activation} if activation == "geglu" else SILU_GLU
    model, _ = qmoe_layer(rng, bits, block, zero_points, hidden, ffn, experts=EXPERTS, activation=attrs)
    return model


def _feeds(rng, hidden: int) -> dict[str, np.ndarray]:
    return {
        "x": rng.standard_normal((TOKENS, hidden)).astype(np.float32),
        "logits": rng.standard_normal((TOKENS, EXPERTS)).astype(np.float32),
    }


def _reading(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    (node,) = model.graph.node
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer} | feeds
    labels = fused_reference.input_labels(node)
    return fused_reference.evaluate(node, lambda label: arrays[labels[label]] if label in labels else None)


def _relative(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - expected)) / np.max(np.abs(expected)))


def _stock(model: onnx.ModelProto, feeds) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


@pytest.mark.parametrize(
    "build",
    [
        lambda rng: _float_layer(rng, "relu", 0, 24, 40),
        lambda rng: _float_layer(rng, "gelu", 0, 24, 40),
        lambda rng: _float_layer(rng, "silu", 0, 24, 40),
        lambda rng: _float_layer(rng, "swiglu", 1, 24, 40, SWIGLU_GPT_OSS),
        lambda rng: _float_layer(rng, "swiglu", 1, 24, 40, SILU_GLU),
        lambda rng: _quantized_layer(rng, "swiglu", 4, 32, True, 80, 48),  # partial last blocks, zero points
        lambda rng: _quantized_layer(rng, "swiglu", 8, 16, False, 72, 40),
    ],
    ids=["relu", "gelu", "silu", "swiglu_gpt_oss", "silu_glu", "qmoe_int4_partial_zp", "qmoe_int8_partial"],
)
def test_the_float64_reading_matches_stock_onnxruntime_wherever_it_runs(build, monkeypatch):
    monkeypatch.setenv(ENV, "fp32")  # ORT's float path: the reading dequantizes
    rng = np.random.default_rng(7)
    model = build(rng)
    feeds = _feeds(rng, model.graph.input[0].type.tensor_type.shape.dim[1].dim_value)
    assert _relative(_stock(model, feeds), _reading(model, feeds)) < 1e-5


def test_stock_onnxruntime_refuses_geglu_on_cpu():
    model = _float_layer(np.random.default_rng(0), "geglu", 1, 16, 32)
    with pytest.raises(Exception, match="Unsupported MoE activation type: geglu"):
        _stock(model, {})


def test_the_geglu_reading_is_gelu_tanh_of_the_gate_times_up_in_either_layout():
    rng = np.random.default_rng(3)
    interleaved = _float_layer(rng, "geglu", 1, 16, 24)
    feeds = _feeds(rng, 16)
    arrays = {t.name: numpy_helper.to_array(t) for t in interleaved.graph.initializer}
    # the same experts with fc1's rows [g0, u0, g1, u1, ...] stored as [g | u] (swiglu_fusion=2)
    concatenated = _float_layer(rng, "geglu", 2, 16, 24)
    for tensor in concatenated.graph.initializer:
        value = arrays[tensor.name]
        if tensor.name.startswith("fc1"):
            value = np.concatenate([value[:, 0::2], value[:, 1::2]], axis=1)
        tensor.CopyFrom(numpy_helper.from_array(value, tensor.name))
    x = feeds["x"].astype(np.float64)
    probs = np.exp(feeds["logits"].astype(np.float64))
    probs /= probs.sum(1, keepdims=True)
    expected = np.zeros_like(x)
    for t in range(TOKENS):
        top = np.argsort(-probs[t])[:2]
        for e in top:
            h = arrays["fc1"][e] @ x[t] + arrays["fc1_bias"][e]
            g, u = h[0::2], h[1::2]
            act = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3))) * u
            expected[t] += probs[t, e] / probs[t, top].sum() * (arrays["fc2"][e] @ act + arrays["fc2_bias"][e])
    assert _relative(_reading(interleaved, feeds), expected) < 1e-12
    assert _relative(_reading(concatenated, feeds), expected) < 1e-12


def _converted(model: onnx.ModelProto):
    rewritten, report = convert(model, shards=2)
    assert report.blocks and not report.skipped, report.skipped
    return materialize(rewritten), report


@pytest.mark.parametrize(
    ("build", "env", "tolerance"),
    [
        (lambda rng: _float_layer(rng, "geglu", 1, 32, 64), None, 1e-4),
        (lambda rng: _float_layer(rng, "geglu", 2, 32, 64), None, 1e-4),
        (lambda rng: _quantized_layer(rng, "geglu", 4, 32, False, 64, 64), None, 1e-4),
        (lambda rng: _quantized_layer(rng, "geglu", 4, 32, True, 80, 88), None, 1e-4),  # partial blocks, 1 shard
        (lambda rng: _quantized_layer(rng, "geglu", 8, 32, False, 64, 64), "fp32", 1e-4),
        # ORT's default for 8-bit experts (int8 activations, as its QMoE runs them): within the int8 tolerance
        (lambda rng: _quantized_layer(rng, "geglu", 8, 32, True, 64, 64), None, 2e-2),
    ],
    ids=["fp32_interleaved", "fp32_concatenated", "int4", "int4_partial_blocks", "int8_fp32", "int8_default"],
)
def test_a_geglu_block_converts_and_the_provider_matches_the_float64_reading(build, env, tolerance, monkeypatch):
    if env:
        monkeypatch.setenv(ENV, env)
    else:
        monkeypatch.delenv(ENV, raising=False)
    rng = np.random.default_rng(11)
    model = build(rng)
    hidden = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    feeds = _feeds(rng, hidden)
    converted, report = _converted(model)
    (block,) = report.blocks
    assert block.activation == "gelu_tanh_glu"
    assert block.checked_numerically and block.checked_in_isolation  # against the float64 reading
    (node,) = [n for n in converted.graph.node if is_sharded_node(n)]
    assert parse_node(node).activation == "gelu_tanh_glu"
    options = ort.SessionOptions()
    options.log_severity_level = 3
    ours = ort.InferenceSession(converted.SerializeToString(), ndp_ep.session_options(options)).run(None, feeds)[0]
    assert _relative(ours, _reading(model, feeds)) < tolerance


def test_geglu_without_fused_gate_up_rows_is_skipped_with_the_reason():
    model = _float_layer(np.random.default_rng(0), "geglu", 1, 16, 32)
    for attribute in model.graph.node[0].attribute:
        if attribute.name == "swiglu_fusion":
            attribute.i = 0
    _, report = convert(model, shards=2)
    assert not report.blocks
    (skip,) = report.skipped
    assert "swiglu_fusion=0" in skip.reason


def test_a_geglu_block_too_large_to_check_whole_is_proven_on_its_first_experts():
    model = _float_layer(np.random.default_rng(1), "geglu", 1, 32, 64)
    weight_bytes = sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
    _, report = convert(model, shards=2, max_check_weight_bytes=int(0.8 * weight_bytes))
    (block,) = report.blocks
    assert block.checked_numerically and block.checked_in_isolation
    assert any("checked on its first 3 of 4 experts" in n for n in report.notes)
