"""The native sharded-expert kernels against an independent float64 reference written here.

Each case builds one ``ndp_ep::ShardedMoEExperts`` node by hand (graph_passes.sharded_op.make_node with numpy
weights), runs it in a plain ONNX Runtime session on the provider, and compares with a float64 evaluation of
the contract's formula: ``y[t] = sum_k w[t,k] * sum_s Down_s(act(First_s(x[t])))`` with the test's own
activation formulas and, for quantized weights, its own ``(q - zero_point) * scale`` dequantization.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ndp_ep
from graph_passes import sharded_op
from graph_passes.activations import CATALOG
from graph_passes.sharded_op import ShardedOpSpec

SEED = 1234
ALPHA, LIMIT = 1.702, 7.0
_erf = np.vectorize(math.erf)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def reference_activation(name: str, h: np.ndarray, beta: float) -> np.ndarray:
    """float64 activations of the contract (graph_passes/plan.py), on [rows, F] with gate then up halves."""
    if name in ("silu_glu", "gelu_glu", "swiglu_clamp"):
        gate, up = np.split(h, 2, axis=-1)
        if name == "silu_glu":
            return gate * _sigmoid(gate) * up
        if name == "gelu_glu":
            return 0.5 * gate * (1 + _erf(gate / math.sqrt(2))) * up
        gate = np.minimum(gate, LIMIT)
        up = np.clip(up, -LIMIT, LIMIT)
        return (up + beta) * gate * _sigmoid(ALPHA * gate)
    if name == "relu":
        return np.maximum(h, 0)
    if name == "gelu":
        return 0.5 * h * (1 + _erf(h / math.sqrt(2)))
    if name == "gelu_tanh":
        return 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    assert name == "silu"
    return h * _sigmoid(h)


def quantize(w_out_in: np.ndarray, bits: int, block: int, rng, zero_points: bool):
    """Block-quantize a [out, in] float64 matrix: packed uint8 q, scales [out, ceil(in/block)], zero points, and the
    float64 values those dequantize to (a last block cut short by ``in`` covers the inputs it has)."""
    out_dim, in_dim = w_out_in.shape
    qmax = (1 << bits) - 1
    padded_in = -(-in_dim // block) * block
    padded = np.concatenate([w_out_in, np.zeros((out_dim, padded_in - in_dim))], axis=1)
    blocks = padded.reshape(out_dim, padded_in // block, block)
    scale = np.abs(blocks).max(axis=-1) / (qmax // 2) + 1e-3
    zp = (
        rng.integers(qmax // 2 - 2, qmax // 2 + 3, scale.shape)
        if zero_points
        else np.full(scale.shape, 1 << (bits - 1))
    )
    q = np.clip(np.rint(blocks / scale[..., None]) + zp[..., None], 0, qmax).astype(np.uint8)
    dequant = ((q.astype(np.float64) - zp[..., None]) * scale[..., None]).reshape(out_dim, padded_in)[:, :in_dim]
    q = q.reshape(out_dim, padded_in)[:, :in_dim]

    def pack(values: np.ndarray) -> np.ndarray:
        if bits == 8:
            return values.astype(np.uint8)
        padded = np.concatenate([values, np.zeros((values.shape[0], values.shape[1] % 2), values.dtype)], axis=1)
        return (padded[:, 0::2] | (padded[:, 1::2] << 4)).astype(np.uint8)

    return pack(q), scale.astype(np.float32), pack(zp.astype(np.uint8)) if zero_points else None, dequant


def build_case(
    activation="silu_glu",
    weight_dtype="float32",
    shards=2,
    experts=4,
    top_k=2,
    hidden=16,
    ffn=24,
    first_bias=False,
    down_bias=False,
    block=8,
    zero_points=False,
    beta=1.0,
    seed=SEED,
    first_layout="in_out",
    down_layout="in_out",
):
    """The node's model and, per expert, the float64 matrices the reference uses: first [H, F], down [I, H].

    Float shards are stored as the layouts say: ``in_out`` as those matrices, ``out_in`` as their transposes."""
    rng = np.random.default_rng(seed)
    gated = CATALOG[activation].gated
    quantized = weight_dtype in ("int8", "int4")
    spec = ShardedOpSpec(
        layer="moe",
        num_experts=experts,
        top_k=top_k,
        hidden=hidden,
        ffn=ffn,
        shards=shards,
        activation=activation,
        activation_alpha=ALPHA,
        activation_limit=LIMIT,
        activation_beta=beta,
        has_first_bias=first_bias,
        has_down_bias=down_bias,
        weight_dtype=weight_dtype,
        quant_block_size=block if quantized else 0,
        has_zero_points=zero_points and quantized,
        first_layout=first_layout,
        down_layout=down_layout,
    )
    width = ffn // shards

    def stored(matrix: np.ndarray, layout: str) -> np.ndarray:
        return np.ascontiguousarray(matrix.T if layout == "out_in" else matrix)

    groups: dict[str, list[np.ndarray]] = {g: [] for g, _ in spec.input_groups()}
    reference = []
    float_type = {"float32": np.float32, "float16": np.float16}.get(weight_dtype)
    for _e in range(experts):
        gate = rng.standard_normal((hidden, ffn)) * 0.3
        up = rng.standard_normal((hidden, ffn)) * 0.3
        down = rng.standard_normal((ffn, hidden)) * 0.3
        b1 = rng.standard_normal(2 * ffn if gated else ffn) * 0.1
        b2 = rng.standard_normal(hidden) * 0.1
        firsts, downs = [], []
        for s in range(shards):
            cols = slice(s * width, (s + 1) * width)
            first = np.concatenate([gate[:, cols], up[:, cols]], axis=1) if gated else up[:, cols]
            down_rows = down[cols]
            if quantized:
                bits = 8 if weight_dtype == "int8" else 4
                q1, s1, z1, first = quantize(first.T, bits, block, rng, zero_points)
                q2, s2, z2, down_rows = quantize(down_rows.T, bits, block, rng, zero_points)
                first, down_rows = first.T, down_rows.T
                groups["first"].append(q1)
                groups["down"].append(q2)
                groups["first_scales"].append(s1)
                groups["down_scales"].append(s2)
                if zero_points:
                    groups["first_zero_points"].append(z1)
                    groups["down_zero_points"].append(z2)
            elif weight_dtype == "bfloat16":
                first, down_rows = _bf16_round(first), _bf16_round(down_rows)
                groups["first"].append(_bf16_tensor(stored(first, first_layout)))
                groups["down"].append(_bf16_tensor(stored(down_rows, down_layout)))
            else:
                first = first.astype(float_type).astype(np.float64)
                down_rows = down_rows.astype(float_type).astype(np.float64)
                groups["first"].append(stored(first, first_layout).astype(float_type))
                groups["down"].append(stored(down_rows, down_layout).astype(float_type))
            shard_bias = np.concatenate([b1[:ffn][cols], b1[ffn:][cols]]) if gated else b1[cols]
            if first_bias:
                groups["first_bias"].append(shard_bias.astype(np.float32))
            firsts.append((first, shard_bias.astype(np.float32).astype(np.float64) if first_bias else 0.0))
            downs.append(down_rows)
        if down_bias:
            groups["down_bias"].append(b2.astype(np.float32))
        reference.append((firsts, downs, b2.astype(np.float32).astype(np.float64) if down_bias else 0.0))
    return sharded_model(spec, groups), reference, spec


def sharded_model(spec: ShardedOpSpec, groups: dict[str, list]) -> onnx.ModelProto:
    """One sharded node of ``spec`` on inputs x [T, H], ids and w [T, K], output y [T, H], its weight inputs
    the arrays (or ready tensors) of ``groups``, one list per input group."""
    names = spec.weight_names()
    flat = [a for g, _ in spec.input_groups() for a in groups[g]]
    initializers = [a if isinstance(a, onnx.TensorProto) else numpy_helper.from_array(a) for a in flat]
    for tensor, name in zip(initializers, names, strict=True):
        tensor.name = name
    node = sharded_op.make_node(spec, "x", "ids", "w", "y", names)
    graph = helper.make_graph(
        [node],
        "sharded",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", spec.hidden]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["T", spec.top_k]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, ["T", spec.top_k]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", spec.hidden])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("ndp_ep", 1)])


def _bf16_round(values: np.ndarray) -> np.ndarray:
    bits = values.astype(np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return rounded.view(np.float32).astype(np.float64)


def _bf16_tensor(values: np.ndarray) -> onnx.TensorProto:
    raw = (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    tensor = onnx.TensorProto()
    tensor.data_type = TensorProto.BFLOAT16
    tensor.dims.extend(values.shape)
    tensor.raw_data = raw.tobytes()
    return tensor


def reference_output(reference, spec: ShardedOpSpec, x, ids, w, activation=reference_activation) -> np.ndarray:
    out = np.zeros((x.shape[0], spec.hidden))
    for t in range(x.shape[0]):
        for k in range(spec.top_k):
            firsts, downs, b2 = reference[ids[t, k]]
            y = sum(
                activation(spec.activation, x[t] @ first + b1, spec.activation_beta) @ down
                for (first, b1), down in zip(firsts, downs, strict=True)
            )
            out[t] += w[t, k] * (y + b2)
    return out


def run_case(model, spec, tokens=7, threads=1, seed=SEED):
    import onnxruntime as ort

    rng = np.random.default_rng(seed + tokens)
    x = rng.standard_normal((tokens, spec.hidden)).astype(np.float32)
    ids = np.array([rng.choice(spec.num_experts, spec.top_k, replace=False) for _ in range(tokens)], np.int64).reshape(
        tokens, spec.top_k
    )
    w = rng.random((tokens, spec.top_k)).astype(np.float32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), ndp_ep.session_options(options))
    assert session.get_providers()[0] == "NdpExecutionProvider"
    return session.run(None, {"x": x, "ids": ids, "w": w})[0], (x.astype(np.float64), ids, w.astype(np.float64))


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


ACTIVATIONS = ["silu_glu", "gelu_glu", "swiglu_clamp", "relu", "gelu", "gelu_tanh", "silu"]


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("biases", [False, True])
def test_float32_kernel_matches_the_float64_reference_for_every_activation(activation, biases):
    model, reference, spec = build_case(activation, first_bias=biases, down_bias=biases, beta=0.5 if biases else 1.0)
    out, (x, ids, w) = run_case(model, spec)
    assert _rel(out, reference_output(reference, spec, x, ids, w)) < 1e-5


def catalog_activation(name: str, h: np.ndarray, beta: float) -> np.ndarray:
    """The catalog's float32 NumPy ``apply`` of ``name`` on [rows, F] (gate then up halves for a gated one)."""
    entry = CATALOG[name]
    h32 = h.astype(np.float32)
    if entry.gated:
        gate, up = np.split(h32, 2, axis=-1)
        return entry.apply(gate, up, ALPHA, LIMIT, beta).astype(np.float64)
    return entry.apply(h32).astype(np.float64)


@pytest.mark.parametrize("activation", sorted(CATALOG))
def test_the_built_library_computes_every_catalog_activation_as_its_numpy_apply(activation):
    # the native per-element code is generated from the catalog: a new entry is accepted and computed alike
    model, reference, spec = build_case(activation, first_bias=True, down_bias=True, beta=0.5)
    out, (x, ids, w) = run_case(model, spec)
    assert _rel(out, reference_output(reference, spec, x, ids, w, activation=catalog_activation)) < 1e-5


@pytest.mark.parametrize("shards,tokens,threads", [(1, 1, 1), (3, 1, 2), (4, 33, 2), (2, 0, 1)])
def test_shard_counts_token_counts_and_threads_do_not_change_the_result(shards, tokens, threads):
    model, reference, spec = build_case("silu_glu", shards=shards, ffn=24)
    out, (x, ids, w) = run_case(model, spec, tokens=tokens, threads=threads)
    assert out.shape == (tokens, spec.hidden)
    if tokens:
        assert _rel(out, reference_output(reference, spec, x, ids, w)) < 1e-5


@pytest.mark.parametrize("weight_dtype", ["float16", "bfloat16"])
def test_half_precision_weights_compute_with_the_rounded_weights(weight_dtype):
    model, reference, spec = build_case("swiglu_clamp", weight_dtype=weight_dtype, first_bias=True, down_bias=True)
    out, (x, ids, w) = run_case(model, spec)
    assert _rel(out, reference_output(reference, spec, x, ids, w)) < 1e-5


LAYOUTS = [("out_in", "out_in"), ("out_in", "in_out"), ("in_out", "out_in")]


@pytest.mark.parametrize(("first_layout", "down_layout"), LAYOUTS)
@pytest.mark.parametrize("weight_dtype", ["float32", "float16", "bfloat16"])
def test_out_in_float_shards_give_the_in_out_result_bit_for_bit(first_layout, down_layout, weight_dtype):
    common = {"activation": "swiglu_clamp", "weight_dtype": weight_dtype, "shards": 3, "first_bias": True}
    model_in_out, reference, spec = build_case(**common)
    model_out_in, _, spec_out_in = build_case(**common, first_layout=first_layout, down_layout=down_layout)
    first = spec_out_in.weight_names()[0]
    dims = {t.name: tuple(t.dims) for t in model_out_in.graph.initializer}
    width = spec.ffn // 3
    expected_first = (2 * width, spec.hidden) if first_layout == "out_in" else (spec.hidden, 2 * width)
    assert dims[first] == expected_first
    out_in, (x, ids, w) = run_case(model_out_in, spec_out_in, tokens=9, threads=2)
    in_out, _ = run_case(model_in_out, spec, tokens=9, threads=2)
    assert np.array_equal(out_in, in_out)  # the kernel transposes at load time: same float32 products
    assert _rel(out_in, reference_output(reference, spec, x, ids, w)) < 1e-5


def test_out_in_weights_of_in_out_shape_are_refused_when_the_session_is_built():
    import onnxruntime as ort

    model, _, spec = build_case("silu", shards=2, hidden=16, ffn=24)  # in_out down shards [12, 16]
    node = model.graph.node[0]
    node.attribute.append(helper.make_attribute("down_layout", "out_in"))  # claims [16, 12]
    with pytest.raises(Exception, match="shape"):
        ort.InferenceSession(model.SerializeToString(), ndp_ep.session_options(ort.SessionOptions()))


@pytest.mark.parametrize("weight_dtype", ["int8", "int4"])
@pytest.mark.parametrize("zero_points", [False, True])
@pytest.mark.parametrize("block", [4, 8])
def test_block_quantized_weights_dequantize_as_the_contract_says(weight_dtype, zero_points, block):
    model, reference, spec = build_case(
        "silu_glu", weight_dtype=weight_dtype, ffn=32, block=block, zero_points=zero_points
    )
    out, (x, ids, w) = run_case(model, spec)
    assert _rel(out, reference_output(reference, spec, x, ids, w)) < 1e-5


def test_int4_weights_of_an_odd_width_fail_the_session_before_any_weight_is_read(capfd):
    import onnxruntime as ort

    model, _, spec = build_case("silu_glu", weight_dtype="int4", hidden=16, ffn=32, block=1)
    node = model.graph.node[0]
    for attribute in node.attribute:  # claims shards of width 15: half a byte past every packed row
        if attribute.name == "ffn":
            attribute.i = 30
    with pytest.raises(Exception, match="ShardedMoEExperts"):  # the provider claims nothing, ORT says so
        ort.InferenceSession(model.SerializeToString(), ndp_ep.session_options(ort.SessionOptions()))
    assert (
        "int4 weights pack two values per byte: hidden 16 and the shard width 15 must be even" in capfd.readouterr().err
    )


def test_expert_ids_out_of_range_fail_the_run_with_a_message():
    import onnxruntime as ort

    model, _, spec = build_case("relu")
    session = ort.InferenceSession(model.SerializeToString(), ndp_ep.session_options())
    feeds = {
        "x": np.zeros((1, spec.hidden), np.float32),
        "ids": np.array([[0, spec.num_experts]], np.int64),
        "w": np.ones((1, 2), np.float32),
    }
    with pytest.raises(Exception, match="expert id 4 out of range 0..3"):
        session.run(None, feeds)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("shards", [1, 2])
def test_quantized_experts_match_onnx_runtime_qmoe_on_the_same_weights(bits, shards):
    import onnxruntime as ort

    experts, hidden, ffn, top_k, tokens, block = 4, 32, 64, 2, 6, 16
    rng = np.random.default_rng(SEED + bits)
    q1 = rng.integers(0, 1 << bits, (experts, ffn, hidden)).astype(np.uint8)  # [E, out, in] as QMoE stores them
    q2 = rng.integers(0, 1 << bits, (experts, hidden, ffn)).astype(np.uint8)
    s1 = (rng.random((experts, ffn, hidden // block)) * 0.05 + 0.01).astype(np.float32)
    s2 = (rng.random((experts, hidden, ffn // block)) * 0.05 + 0.01).astype(np.float32)

    def pack(q: np.ndarray) -> np.ndarray:
        return q if bits == 8 else (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)

    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    logits = rng.standard_normal((tokens, experts)).astype(np.float32)
    qmoe = helper.make_node(
        "QMoE",
        ["x", "logits", "fc1", "s1", "", "fc2", "s2", ""],
        ["y"],
        domain="com.microsoft",
        k=top_k,
        activation_type="relu",
        normalize_routing_weights=1,
        expert_weight_bits=bits,
        block_size=block,
    )
    arrays = {"fc1": pack(q1), "s1": s1, "fc2": pack(q2), "s2": s2}
    graph = helper.make_graph(
        [qmoe],
        "qmoe",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [tokens, hidden]),
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [tokens, experts]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [tokens, hidden])],
        [numpy_helper.from_array(a, n) for n, a in arrays.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    )
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "logits": logits}
    )[0]

    spec = ShardedOpSpec(
        "moe", experts, top_k, hidden, ffn, shards, "relu", weight_dtype=f"int{bits}", quant_block_size=block
    )
    width = ffn // shards
    groups: dict[str, list[np.ndarray]] = {g: [] for g, _ in spec.input_groups()}
    for e in range(experts):
        for s in range(shards):
            rows = slice(s * width, (s + 1) * width)
            groups["first"].append(pack(q1[e, rows]))
            groups["down"].append(pack(q2[e][:, rows]))
            groups["first_scales"].append(s1[e, rows])
            groups["down_scales"].append(s2[e][:, s * width // block : (s + 1) * width // block])
    sharded = sharded_model(spec, groups)
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    ids = np.argsort(-probabilities, axis=1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(probabilities, ids, axis=1)
    weights /= weights.sum(axis=1, keepdims=True)
    session = ort.InferenceSession(sharded.SerializeToString(), ndp_ep.session_options())
    ours = session.run(None, {"x": x, "ids": ids.astype(np.int64), "w": weights.astype(np.float32)})[0]
    # Both sessions run with ORT_QMOE_CPU_QNBIT_GEMM as the environment has it: the provider multiplies as this
    # ONNX Runtime's QMoE does (8-bit: int8 activations from onnxruntime 1.31; tests/convert_real/
    # test_qmoe_onnxruntime_paths.py).
    assert _rel(ours, expected) < 1e-5
