"""Converted fp16 / bf16 / int8 / int4 experts keep their precision on disk and compute what ONNX Runtime's own
``com.microsoft.MoE`` / ``QMoE`` CPU kernels compute.

Each test builds one fused MoE node with seeded random weights, converts it, reads the shard initializers back
and evaluates the sharded form with a NumPy reading of the contract written here (own nibble unpacking, own
router, own activations, float64), then compares with ONNX Runtime running the original node.

From onnxruntime 1.31 the CPU ``QMoE`` computes 8-bit experts with dynamically int8-quantized activations (its
MLAS QNBit GEMM) unless ``ORT_QMOE_CPU_QNBIT_GEMM=fp32`` selects dequantize-then-SGEMM, the formula this NumPy
reading (and the converter's check) uses. The tests compare with the fp32 path at 1e-3 of the largest output,
and check that the default path stays within the verifier's int8 tolerance; that the provider reproduces the
default path itself is tested in test_qmoe_onnxruntime_paths.py.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from graph_passes.convert import convert
from graph_passes.rewrite import materialize
from graph_passes.sharded_op import is_sharded_node, parse_node
from graph_passes.verify import RELATIVE_TOLERANCE

TOKENS = 7


def _pack4(values: np.ndarray) -> np.ndarray:
    return (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)


def _unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    if bits == 8:
        return packed.astype(np.int64)
    out = np.zeros(packed.shape[:-1] + (packed.shape[-1] * 2,), np.int64)
    out[..., 0::2] = packed % 16
    out[..., 1::2] = packed // 16
    return out


def _quantized(rng, experts: int, rows: int, cols: int, bits: int, block: int, zero_points: bool):
    """Random packed values, scales and (optionally) packed zero points of ``experts`` ``[rows, cols]`` matrices.
    A ``cols`` that is not a multiple of ``block`` ends each row in a partial block with a scale of its own."""
    q = rng.integers(0, 2**bits, (experts, rows, cols), dtype=np.uint8)
    blocks = -(-cols // block)
    scales = rng.uniform(0.01, 0.05, (experts, rows, blocks)).astype(np.float32)
    packed = _pack4(q) if bits == 4 else q
    zp = None
    if zero_points:
        z = rng.integers(0, 2**bits, (experts, rows, blocks + (bits == 4 and blocks % 2)), dtype=np.uint8)
        zp = _pack4(z) if bits == 4 else z
    return packed, scales, zp


def _fused_model(
    op: str, inputs: dict[str, np.ndarray], attrs: dict, hidden: int, experts: int, dtype: int, tokens: int = TOKENS
):
    order = (
        ["fc1", "fc1_scales", "fc1_bias", "fc2", "fc2_scales", "fc2_bias", "", "", "", "fc1_zp", "fc2_zp"]
        if op == "QMoE"
        else ["fc1", "fc1_bias", "fc2", "fc2_bias"]
    )
    names = ["x", "logits"] + [n if n in inputs else "" for n in order]
    while names[-1] == "":
        names.pop()
    node = helper.make_node(op, names, ["y"], name="/model/layers.0/moe/" + op, domain="com.microsoft", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", dtype, [tokens, hidden]),
            helper.make_tensor_value_info("logits", dtype, [tokens, experts]),
        ],
        [helper.make_tensor_value_info("y", dtype, [tokens, hidden])],
        [numpy_helper.from_array(v, k) for k, v in inputs.items()],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def qmoe_layer(
    rng: np.random.Generator,
    bits: int,
    block: int,
    zero_points: bool,
    hidden: int,
    ffn: int,
    *,
    experts: int = 4,
    top_k: int = 2,
    activation: dict | None = None,
    tokens: int = TOKENS,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A float32 ``com.microsoft.QMoE`` layer with random block-quantized weights (and biases) drawn from ``rng``,
    and its weight inputs. ``activation``: the SwiGLU attributes (default GPT-OSS's for 8 bits, SiLU-GLU for 4)."""
    fc1, fc1_scales, fc1_zp = _quantized(rng, experts, 2 * ffn, hidden, bits, block, zero_points)
    fc2, fc2_scales, fc2_zp = _quantized(rng, experts, hidden, ffn, bits, block, zero_points)
    inputs = {
        "fc1": fc1,
        "fc1_scales": fc1_scales,
        "fc1_bias": rng.normal(0, 0.1, (experts, 2 * ffn)).astype(np.float32),
        "fc2": fc2,
        "fc2_scales": fc2_scales,
        "fc2_bias": rng.normal(0, 0.1, (experts, hidden)).astype(np.float32),
    }
    if zero_points:
        inputs |= {"fc1_zp": fc1_zp, "fc2_zp": fc2_zp}
    attrs = dict(
        k=top_k, activation_type="swiglu", swiglu_fusion=1, normalize_routing_weights=1, expert_weight_bits=bits
    )
    if activation is None:
        activation = SWIGLU_GPT_OSS if bits == 8 else SILU_GLU
    attrs |= {"block_size": block, **activation}
    return _fused_model("QMoE", inputs, attrs, hidden, experts, TensorProto.FLOAT, tokens), inputs


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["y"], feeds)[0]


def _shards(converted: onnx.ModelProto):
    (node,) = [n for n in converted.graph.node if is_sharded_node(n)]
    spec = parse_node(node)
    arrays = {t.name: numpy_helper.to_array(t) for t in converted.graph.initializer}
    return spec, spec.split_inputs(list(node.input[3:])), arrays, node


def _sharded_reference(spec, groups, arrays, x: np.ndarray, logits: np.ndarray, normalize: bool) -> np.ndarray:
    """The contract's formula, float64: softmax/top-k router, per-shard dequantized matrices, summed shards."""
    x = x.astype(np.float64)
    z = logits.astype(np.float64)
    probs = np.exp(z - z.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ids = np.argsort(-probs, axis=-1, kind="stable")[:, : spec.top_k]
    weights = np.take_along_axis(probs, ids, -1)
    if normalize:
        weights /= weights.sum(-1, keepdims=True)
    width = spec.ffn // spec.shards

    def matrix(group: str, e: int, s: int, inputs: int) -> np.ndarray:  # -> [in, out]
        w = arrays[groups[group][e * spec.shards + s]]
        if not spec.quantized:  # stored [in, out], or [out, in] under an out_in layout attribute
            layout = spec.first_layout if group == "first" else spec.down_layout
            return (w.T if layout == "out_in" else w).astype(np.float64)
        q = _unpack(w, spec.bits)[:, :inputs]
        scales = arrays[groups[group + "_scales"][e * spec.shards + s]].astype(np.float64)
        block = spec.quant_block_size
        if spec.has_zero_points:
            zp = _unpack(arrays[groups[group + "_zero_points"][e * spec.shards + s]], spec.bits)
            zp = zp[:, : scales.shape[1]]
        else:
            zp = np.full(scales.shape, 2 ** (spec.bits - 1))
        zp, scales = np.repeat(zp, block, axis=1)[:, :inputs], np.repeat(scales, block, axis=1)[:, :inputs]
        return ((q - zp) * scales).T  # -> [in, out]

    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(spec.top_k):
            e = int(ids[t, k])
            y = np.zeros(spec.hidden)
            for s in range(spec.shards):
                h = x[t] @ matrix("first", e, s, spec.hidden)
                if spec.has_first_bias:
                    h = h + arrays[groups["first_bias"][e * spec.shards + s]].astype(np.float64)
                gate, up = h[:width], h[width:]
                if spec.activation == "silu_glu":
                    act = gate / (1 + np.exp(-gate)) * up
                else:
                    assert spec.activation == "swiglu_clamp"
                    g = np.minimum(gate, spec.activation_limit)
                    u = np.clip(up, -spec.activation_limit, spec.activation_limit)
                    act = (u + spec.activation_beta) * g / (1 + np.exp(-spec.activation_alpha * g))
                y += act @ matrix("down", e, s, width)
            if spec.has_down_bias:
                y += arrays[groups["down_bias"][e]].astype(np.float64)
            out[t] += weights[t, k] * y
    return out


SWIGLU_GPT_OSS = {"activation_alpha": 1.702, "activation_beta": 1.0, "swiglu_limit": 7.0}
SILU_GLU = {"activation_alpha": 1.0, "activation_beta": 0.0}


@pytest.mark.parametrize(
    ("bits", "block", "zero_points", "swiglu", "shards", "expected_shards"),
    [
        (4, 16, False, SWIGLU_GPT_OSS, 4, 4),
        (4, 32, False, SILU_GLU, 2, 2),
        (8, 16, False, SWIGLU_GPT_OSS, 2, 2),
        (8, 32, True, SILU_GLU, 4, 2),  # ffn 64 / block 32: at most 2 shards on block boundaries
        (4, 16, True, SWIGLU_GPT_OSS, 4, 4),
    ],
)
def test_qmoe_shards_stay_packed_and_match_onnxruntime(
    bits, block, zero_points, swiglu, shards, expected_shards, monkeypatch
):
    rng = np.random.default_rng(bits * 100 + block + shards)
    experts, hidden, ffn = 4, 32, 64
    model, _ = qmoe_layer(rng, bits, block, zero_points, hidden, ffn, experts=experts, activation=swiglu)
    feeds = {
        "x": rng.standard_normal((TOKENS, hidden)).astype(np.float32),
        "logits": rng.standard_normal((TOKENS, experts)).astype(np.float32),
    }
    default_path = _ort(model, feeds)
    monkeypatch.setenv("ORT_QMOE_CPU_QNBIT_GEMM", "fp32")
    expected = _ort(model, feeds)
    monkeypatch.delenv("ORT_QMOE_CPU_QNBIT_GEMM")

    rewritten, report = convert(model, shards=shards)
    (block_report,) = report.blocks
    assert (block_report.weight_dtype, block_report.quant_block_size) == (f"int{bits}", block)
    assert block_report.shards == expected_shards
    assert (expected_shards != shards) == any("using" in n for n in report.notes)
    converted = materialize(rewritten)
    spec, groups, arrays, _ = _shards(converted)
    width = ffn // expected_shards
    first = arrays[groups["first"][0]]
    assert first.dtype == np.uint8 and first.shape == (2 * width, hidden * bits // 8)
    assert arrays[groups["down"][0]].shape == (hidden, width * bits // 8)
    assert arrays[groups["down_scales"][0]].shape == (hidden, width // block)
    assert spec.has_zero_points == zero_points
    got = _sharded_reference(spec, groups, arrays, feeds["x"], feeds["logits"], normalize=True)
    assert np.max(np.abs(got - expected)) <= 1e-3 * np.max(np.abs(expected))
    assert np.max(np.abs(got - default_path)) <= RELATIVE_TOLERANCE[f"int{bits}"] * np.max(np.abs(expected))


@pytest.mark.parametrize(
    ("bits", "block", "zero_points", "hidden", "ffn", "expected_shards"),
    [
        (4, 32, False, 80, 64, 2),  # hidden 80 = 2.5 blocks: the first projection's rows end in a partial block
        (8, 32, True, 80, 64, 2),
        (4, 16, True, 40, 88, 1),  # both widths partial: ffn 88 = 5.5 blocks splits on no block boundary
        (8, 64, False, 96, 80, 1),
        (4, 128, True, 160, 96, 1),  # the block wider than the FFN: one partial block
    ],
)
def test_qmoe_with_a_partial_last_block_converts_and_matches_onnxruntime(
    bits, block, zero_points, hidden, ffn, expected_shards, monkeypatch
):
    """A QMoE whose input widths are not multiples of block_size (GenAI's builder keeps the rows unpadded, with
    ceil(width / block) scales) is converted, not skipped, and computes what ONNX Runtime computes on it."""
    rng = np.random.default_rng(bits * 1000 + block + hidden + ffn)
    experts = 4
    model, _ = qmoe_layer(rng, bits, block, zero_points, hidden, ffn, experts=experts, activation=SILU_GLU)
    feeds = {
        "x": rng.standard_normal((TOKENS, hidden)).astype(np.float32),
        "logits": rng.standard_normal((TOKENS, experts)).astype(np.float32),
    }
    monkeypatch.setenv("ORT_QMOE_CPU_QNBIT_GEMM", "fp32")  # the float path (ORT's only one for a partial block)
    expected = _ort(model, feeds)

    rewritten, report = convert(model, shards=2)
    assert not report.skipped, report.skipped
    (block_report,) = report.blocks
    assert (block_report.quant_block_size, block_report.shards) == (block, expected_shards)
    spec, groups, arrays, _ = _shards(materialize(rewritten))
    width = ffn // expected_shards
    assert arrays[groups["first_scales"][0]].shape == (2 * width, -(-hidden // block))
    assert arrays[groups["down_scales"][0]].shape == (hidden, -(-width // block))
    assert arrays[groups["first"][0]].shape == (2 * width, hidden * bits // 8)  # unpadded, as the source
    got = _sharded_reference(spec, groups, arrays, feeds["x"], feeds["logits"], normalize=True)
    assert np.max(np.abs(got - expected)) <= 1e-5 * np.max(np.abs(expected))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_moe_shards_keep_their_dtype(dtype):
    rng = np.random.default_rng(11)
    experts, hidden, ffn, top_k = 4, 16, 32, 2
    np_dtype = np.float16 if dtype == "float16" else onnx.helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16)
    onnx_dtype = TensorProto.FLOAT16 if dtype == "float16" else TensorProto.BFLOAT16
    fc1 = rng.normal(0, 0.3, (experts, 2 * ffn, hidden)).astype(np_dtype)
    fc2 = rng.normal(0, 0.3, (experts, hidden, ffn)).astype(np_dtype)
    inputs = {"fc1": fc1, "fc2": fc2}
    attrs = dict(k=top_k, activation_type="swiglu", swiglu_fusion=1, normalize_routing_weights=1, **SWIGLU_GPT_OSS)
    model = _fused_model("MoE", inputs, attrs, hidden, experts, onnx_dtype)
    rewritten, report = convert(model, shards=2)
    (block_report,) = report.blocks
    assert block_report.weight_dtype == dtype
    converted = materialize(rewritten)
    spec, groups, arrays, node = _shards(converted)
    assert spec.weight_dtype == dtype
    first = next(t for t in converted.graph.initializer if t.name == groups["first"][0])
    assert first.data_type == onnx_dtype
    # shard 1 of expert 2: gate rows 16..31 (even rows of fc1) then up rows (odd), [2W, H] as fc1 is [out, in]
    assert (spec.first_layout, spec.down_layout) == ("out_in", "out_in")
    gate_up = arrays[groups["first"][2 * 2 + 1]]
    want = np.concatenate([fc1[2][0::2][16:32], fc1[2][1::2][16:32]])
    assert np.array_equal(gate_up.view(np.uint16), np.ascontiguousarray(want).view(np.uint16))
    assert json.loads(next(p.value for p in node.metadata_props if p.key == "ndp_ep.block"))["weight_dtype"] == dtype
    if dtype == "float16":  # ONNX Runtime's CPU MoE has a float16 kernel (none for bfloat16)
        feeds = {
            "x": rng.standard_normal((TOKENS, hidden)).astype(np.float16),
            "logits": rng.standard_normal((TOKENS, experts)).astype(np.float16),
        }
        expected = _ort(model, feeds).astype(np.float64)
        got = _sharded_reference(spec, groups, arrays, feeds["x"], feeds["logits"], normalize=True)
        assert np.max(np.abs(got - expected)) <= 2e-2 * np.max(np.abs(expected))
    else:
        assert any("float32 copies of its bfloat16 weights" in n for n in report.notes)


def _as_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every float32 initializer, constant, cast target and graph input/output in float16."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    for position, tensor in enumerate(graph.initializer):
        if tensor.data_type == TensorProto.FLOAT:
            half = numpy_helper.to_array(tensor).astype(np.float16)
            graph.initializer[position].CopyFrom(numpy_helper.from_array(half, tensor.name))
    for value in [*graph.input, *graph.output]:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.FLOAT16
    del graph.value_info[:]
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.name == "to" and attribute.i == TensorProto.FLOAT:
                attribute.i = TensorProto.FLOAT16
            if attribute.name == "value" and attribute.t.data_type == TensorProto.FLOAT:
                half = numpy_helper.to_array(attribute.t).astype(np.float16)
                attribute.t.CopyFrom(numpy_helper.from_array(half, attribute.t.name))
    return out


@pytest.mark.parametrize(
    ("stem", "rule"),
    [
        ("mixtral_block_dynamo", "gathered_experts"),
        ("mixtral_block_torchscript", "onehot_experts"),
        ("gpt_oss_block_dynamo", "gathered_experts"),
    ],
)
def test_float16_pytorch_exports_convert_keeping_float16_shards(stem, rule):
    from tests.convert_real.cases import HF_DIR

    model = _as_float16(onnx.load(HF_DIR / f"{stem}.onnx"))
    rewritten, report = convert(model, shards=2)
    (block,) = report.blocks
    assert (block.rule, block.weight_dtype) == (rule, "float16")
    assert block.checked_numerically and block.checked_in_isolation
    converted = materialize(rewritten)
    spec, groups, arrays, _ = _shards(converted)
    assert spec.weight_dtype == "float16"
    assert {arrays[n].dtype for n in groups["first"] + groups["down"]} == {np.dtype(np.float16)}


def test_qmoe_weights_in_the_cuda_layout_are_skipped_with_the_advice_to_export_for_cpu():
    from graph_passes.graph_index import GraphIndex
    from graph_passes.rules.fused_moe import FusedMoERule

    rng = np.random.default_rng(5)
    experts, hidden, ffn = 4, 64, 128  # CUDA layout: fc1 [E, H, 2I/2], fc2 [E, I, H/2], scales per output row
    inputs = {
        "fc1": rng.integers(0, 256, (experts, hidden, ffn), dtype=np.uint8),
        "fc1_scales": np.ones((experts, 2 * ffn, hidden // 32), np.float32),
        "fc2": rng.integers(0, 256, (experts, ffn, hidden // 2), dtype=np.uint8),
        "fc2_scales": np.ones((experts, hidden, ffn // 32), np.float32),
    }
    attrs = dict(k=2, activation_type="swiglu", swiglu_fusion=1, expert_weight_bits=4, block_size=32)
    model = _fused_model("QMoE", inputs, attrs, hidden, experts, TensorProto.FLOAT)
    (skip,) = FusedMoERule().find(GraphIndex(model))
    assert "CUDA QMoE layout" in skip.reason and "re-export with `-e cpu`" in skip.reason
