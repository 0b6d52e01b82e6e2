"""NonExpertCoster (ndp_ep/costing.py) against costs computed by hand from the h200 preset's numbers."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hw_model.hardware import load_system
from ndp_ep.costing import NonExpertCoster

# h200 preset, by hand: 4.8 TB/s x 0.8805 achievable; 989.4 TFLOP/s bf16 x 0.8281; 1.5 us per kernel
BANDWIDTH = 4.8e12 * 0.8805
FLOPS = 989.4e12 * 0.8281
KERNEL_S = 1.5e-6


def _model() -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.zeros((64, 32), dtype=np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["y"], name="free"),
    ]
    shape = numpy_helper.from_array(np.array([-1, 32], dtype=np.int64), "shape")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[weight, shape],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("batch", [1, 8])
def test_non_expert_cost_matches_a_hand_computed_roofline(batch):
    coster = NonExpertCoster(_model(), load_system("h200"), "bf16")
    cost = coster.cost({"x": (batch, 64)})
    # MatMul [batch,64] x [64,32]: 2 * batch * 32 * 64 FLOPs; reads x and w, writes h; bf16 = 2 bytes
    mm_flops = 2.0 * batch * 32 * 64
    mm_bytes = (batch * 64 + 64 * 32 + batch * 32) * 2
    # Relu: one op per output element; reads h, writes r
    relu_flops = batch * 32
    relu_bytes = 2 * batch * 32 * 2
    assert cost.kernels == 2  # Reshape is free
    assert cost.flops == pytest.approx(mm_flops + relu_flops)
    assert cost.bytes_moved == pytest.approx(mm_bytes + relu_bytes)
    expected = (
        2 * KERNEL_S + max(mm_flops / FLOPS, mm_bytes / BANDWIDTH) + max(relu_flops / FLOPS, relu_bytes / BANDWIDTH)
    )
    assert cost.time_s == pytest.approx(expected, rel=1e-6)


def test_costs_are_cached_per_input_shape():
    coster = NonExpertCoster(_model(), load_system("h200"), "bf16")
    assert coster.cost({"x": (4, 64)}) is coster.cost({"x": (4, 64)})
    assert coster.cost({"x": (4, 64)}) != coster.cost({"x": (5, 64)})


@pytest.mark.parametrize("batch", [1, 1000])
def test_the_working_set_is_the_largest_nodes_inputs_and_outputs_at_their_element_types(batch):
    cost = NonExpertCoster(_model(), load_system("h200"), "bf16").cost({"x": (batch, 64)})
    # float32 (4 bytes), whatever dtype the GPU work is costed in: MatMul holds x, w and h; Relu holds h and r;
    # Reshape holds r, its int64 shape (2 values) and y
    matmul = (batch * 64 + 64 * 32 + batch * 32) * 4
    relu = 2 * batch * 32 * 4
    reshape = 2 * batch * 32 * 4 + 2 * 8
    expected, node = max((matmul, "mm (MatMul)"), (relu, "relu (Relu)"), (reshape, "free (Reshape)"))
    assert (cost.working_set_bytes, cost.working_set_node) == (expected, node)


# -- ONNX Runtime's contrib ops: sized through their stand-ins, costed from their own formulas ------------------------

CONTRIB = "com.microsoft"


def _roofline_s(*works: tuple[int, int]) -> float:
    """Roofline seconds of kernels doing (FLOPs, bytes) each, from the h200 numbers above."""
    return sum(KERNEL_S + max(flops / FLOPS, moved / BANDWIDTH) for flops, moved in works)


def _contrib_model(nodes, inputs, initializers=(), opset: int = 21) -> onnx.ModelProto:
    outputs = [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    imports = [helper.make_opsetid("", opset), helper.make_opsetid(CONTRIB, 1)]
    return helper.make_model(graph, opset_imports=imports)


def _bf16_cost(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]):
    return NonExpertCoster(model, load_system("h200"), "bf16").cost(shapes)


def _float_input(name: str, dims: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


@pytest.mark.parametrize("rows", [1, 6])
def test_matmul_nbits_moves_its_packed_weights_as_stored_and_sizes_the_nodes_after_it(rows):
    # K=32, N=16, 4 bits in blocks of 16: B is (N, K/16 blocks, 16*4/8 bytes) uint8, one scale a block
    initializers = [
        numpy_helper.from_array(np.zeros((16, 2, 8), np.uint8), "b"),
        numpy_helper.from_array(np.ones((16, 2), np.float32), "scales"),
        numpy_helper.from_array(np.zeros(16, np.float32), "bias"),
    ]
    nodes = [
        helper.make_node(
            "MatMulNBits",
            ["x", "b", "scales", "", "", "bias"],
            ["y"],
            "q",
            domain=CONTRIB,
            K=32,
            N=16,
            bits=4,
            block_size=16,
        ),
        helper.make_node("Relu", ["y"], ["r"], name="relu"),
    ]
    cost = _bf16_cost(_contrib_model(nodes, [_float_input("x", ["rows", 32])], initializers), {"x": (rows, 32)})
    # 2*M*K*N FLOPs; x, y, 32 scales and 16 biases at bf16 (2 bytes); the weights as stored, 16*2*8 bytes
    matmul = (2 * rows * 32 * 16, (rows * 32 + rows * 16 + 32 + 16) * 2 + 16 * 2 * 8)
    relu = (rows * 16, 2 * rows * 16 * 2)
    assert (cost.kernels, cost.uncosted) == (2, ())
    assert (cost.flops, cost.bytes_moved) == (matmul[0] + relu[0], matmul[1] + relu[1])
    assert cost.time_s == pytest.approx(_roofline_s(matmul, relu), rel=1e-9)
    # held while it runs, as stored: float32 x and y, uint8 b, float32 scales and bias
    held = (rows * 32 + rows * 16) * 4 + 16 * 2 * 8 + (32 + 16) * 4
    assert (cost.working_set_bytes, cost.working_set_node) == (held, "q (com.microsoft.MatMulNBits)")


def _gqa_model(window: int) -> onnx.ModelProto:
    """4 query heads and 2 KV heads of 8; the total sequence length taken from the attention mask's shape, as
    GenAI's model builder does (by free ops only)."""
    nodes = [
        helper.make_node("Shape", ["attention_mask"], ["total_1d"], start=1, end=2),
        helper.make_node("Squeeze", ["total_1d"], ["total_64"]),
        helper.make_node("Cast", ["total_64"], ["total"], to=TensorProto.INT32),
        helper.make_node(
            "GroupQueryAttention",
            ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total"],
            ["out", "present_key", "present_value"],
            "gqa",
            domain=CONTRIB,
            num_heads=4,
            kv_num_heads=2,
            local_window_size=window,
        ),
        helper.make_node("Relu", ["out"], ["r"], name="relu"),
    ]
    inputs = [
        _float_input("q", [1, "S", 32]),
        _float_input("k", [1, "S", 16]),
        _float_input("v", [1, "S", 16]),
        _float_input("past_key", [1, 2, "P", 8]),
        _float_input("past_value", [1, 2, "P", 8]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "T"]),
    ]
    return _contrib_model(nodes, inputs)


def _gqa_shapes(past: int, queries: int, cache: int | None = None) -> dict[str, tuple[int, ...]]:
    cache = past if cache is None else cache
    return {
        "q": (1, queries, 32),
        "k": (1, queries, 16),
        "v": (1, queries, 16),
        "past_key": (1, 2, cache, 8),
        "past_value": (1, 2, cache, 8),
        "seqlens_k": (1,),
        "attention_mask": (1, past + queries),
    }


# (query, key) pairs by hand: query s of a step at past P attends keys 0..P+s, the last `window` of them when set
@pytest.mark.parametrize(
    ("past", "queries", "window", "pairs", "past_read"),
    [
        (5, 1, -1, 6, 5),  # keys 0..5
        (0, 4, -1, 1 + 2 + 3 + 4, 0),
        (5, 1, 3, 3, 2),  # keys 3..5: the past keys 3 and 4 read
        (0, 4, 3, 1 + 2 + 3 + 3, 0),
    ],
)
def test_group_query_attention_scores_the_keys_each_query_attends_and_reads_the_past_it_needs(
    past, queries, window, pairs, past_read
):
    cost = _bf16_cost(_gqa_model(window), _gqa_shapes(past, queries))
    # QK^T and AV: 2 * 2 * 8 (head size) FLOPs a pair and a query head, 4 query heads
    attention_flops = 4 * 4 * 8 * pairs
    # reads q (32 a token), k and v (16 each), writes the output (32 a token); past keys and values read and new ones
    # written: 2 tensors x 2 KV heads x 8; bf16
    attention_bytes = (queries * (32 + 16 + 16 + 32) + 2 * 2 * 8 * (past_read + queries)) * 2
    relu = (queries * 32, 2 * queries * 32 * 2)
    assert (cost.kernels, cost.uncosted) == (2, ())  # Shape, Squeeze and Cast are free
    assert (cost.flops, cost.bytes_moved) == (attention_flops + relu[0], attention_bytes + relu[1])
    assert cost.time_s == pytest.approx(_roofline_s((attention_flops, attention_bytes), relu), rel=1e-9)


def test_group_query_attention_takes_the_past_from_the_total_length_not_a_shared_buffers_length():
    shared = _bf16_cost(_gqa_model(-1), _gqa_shapes(past=5, queries=1, cache=64))  # a cache of 64 rows, 5 used
    assert shared.flops == 4 * 4 * 8 * 6 + 32  # 6 keys attended, and the Relu


def test_the_working_set_counts_group_query_attention_with_its_caches():
    cost = _bf16_cost(_gqa_model(-1), _gqa_shapes(past=5, queries=1))
    # float32: q 32, k 16, v 16, past key and value 2*5*8 each, output 32, present key and value 2*6*8 each; and
    # the int32 seqlens_k (1) and total length (a scalar)
    held = (32 + 16 + 16 + 2 * 80 + 32 + 2 * 96) * 4 + 2 * 4
    assert (cost.working_set_bytes, cost.working_set_node) == (held, "gqa (com.microsoft.GroupQueryAttention)")


def test_fused_norms_cost_their_operations_per_element_and_pass_their_shapes_on():
    gamma = numpy_helper.from_array(np.ones(8, np.float32), "gamma")
    beta = numpy_helper.from_array(np.zeros(8, np.float32), "beta")
    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["y"], "rms", axis=-1),
        helper.make_node(
            "SkipSimplifiedLayerNormalization", ["y", "x", "gamma"], ["z", "", "", "sum"], "skip_rms", domain=CONTRIB
        ),
        helper.make_node("SkipLayerNormalization", ["z", "sum", "gamma", "beta"], ["w"], "skip_ln", domain=CONTRIB),
    ]
    cost = _bf16_cost(_contrib_model(nodes, [_float_input("x", [2, 3, 8])], [gamma, beta]), {"x": (2, 3, 8)})
    elements = 2 * 3 * 8
    # per element: square, sum, scale by 1/rms, by gamma (4); the Skip norm adds the skip first (5); LayerNorm also
    # takes the mean, centers and adds beta (4 + 1 + 3 = 8). Bytes: every input and output at bf16
    rms = (4 * elements, (elements + 8 + elements) * 2)
    skip_rms = (5 * elements, (2 * elements + 8 + 2 * elements) * 2)
    skip_ln = (8 * elements, (2 * elements + 8 + 8 + elements) * 2)
    assert (cost.kernels, cost.uncosted) == (3, ())
    assert cost.flops == rms[0] + skip_rms[0] + skip_ln[0]
    assert cost.bytes_moved == rms[1] + skip_rms[1] + skip_ln[1]
    assert cost.time_s == pytest.approx(_roofline_s(rms, skip_rms, skip_ln), rel=1e-9)


def test_rotary_embedding_rotates_every_element_reading_its_tokens_cos_and_sin_rows():
    caches = [numpy_helper.from_array(np.ones((16, 4), np.float32), name) for name in ("cos", "sin")]
    nodes = [
        helper.make_node(
            "RotaryEmbedding", ["x", "positions", "cos", "sin"], ["y"], "rope", domain=CONTRIB, num_heads=2
        ),
        helper.make_node("Relu", ["y"], ["r"], name="relu"),
    ]
    inputs = [_float_input("x", [1, 2, 16]), helper.make_tensor_value_info("positions", TensorProto.INT64, [1, 2])]
    cost = _bf16_cost(_contrib_model(nodes, inputs, caches), {"x": (1, 2, 16), "positions": (1, 2)})
    # 2 tokens x 2 heads of 8: 32 elements, two products and a sum each; reads x, a cos and a sin row of 4 a token
    # (bf16) and the 2 int64 positions, writes y
    rope = (3 * 32, (2 * 32 + 2 * 2 * 4) * 2 + 2 * 8)
    relu = (32, 2 * 32 * 2)
    assert (cost.kernels, cost.uncosted) == (2, ())
    assert (cost.flops, cost.bytes_moved) == (rope[0] + relu[0], rope[1] + relu[1])


def test_gather_block_quantized_unpacks_the_rows_it_gathers():
    initializers = [
        numpy_helper.from_array(np.zeros((10, 8), np.uint8), "table"),  # 10 rows of 16 4-bit values
        numpy_helper.from_array(np.ones((10, 1), np.float32), "scales"),  # one block of 16 a row
    ]
    nodes = [
        helper.make_node(
            "GatherBlockQuantized", ["table", "ids", "scales"], ["rows"], "embed", domain=CONTRIB, bits=4, block_size=16
        ),
        helper.make_node("Relu", ["rows"], ["r"], name="relu"),
    ]
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])]
    cost = _bf16_cost(_contrib_model(nodes, inputs, initializers), {"ids": (1, 3)})
    # output (1, 3, 16): 48 values dequantized (subtract the zero point, scale); reads 48 4-bit values (24 bytes),
    # 3 block scales (bf16) and 3 int64 ids, writes 48 bf16 values
    embed = (2 * 48, 24 + 3 * 2 + 3 * 8 + 48 * 2)
    relu = (48, 2 * 48 * 2)
    assert (cost.kernels, cost.uncosted) == (2, ())
    assert (cost.flops, cost.bytes_moved) == (embed[0] + relu[0], embed[1] + relu[1])


@pytest.mark.parametrize(("activation", "activation_flops"), [("none", 0), ("silu", 4)])
def test_causal_conv_with_state_costs_its_taps_and_activation(activation, activation_flops):
    weight = numpy_helper.from_array(np.ones((4, 1, 3), np.float32), "weight")
    nodes = [
        helper.make_node(
            "CausalConvWithState",
            ["x", "weight", "", "past"],
            ["y", "present"],
            "conv",
            domain=CONTRIB,
            activation=activation,
        ),
        helper.make_node("Relu", ["y"], ["r"], name="relu"),
    ]
    inputs = [_float_input("x", [1, 4, "L"]), _float_input("past", [1, 4, 2])]
    cost = _bf16_cost(_contrib_model(nodes, inputs, [weight]), {"x": (1, 4, 3), "past": (1, 4, 2)})
    # 12 outputs of 3 taps (2 FLOPs a tap); reads x, the weight and the past state, writes y and the present state
    conv = ((2 * 3 + activation_flops) * 12, (12 + 12 + 8 + 12 + 8) * 2)
    relu = (12, 2 * 12 * 2)
    assert (cost.kernels, cost.uncosted) == (2, ())
    assert (cost.flops, cost.bytes_moved) == (conv[0] + relu[0], conv[1] + relu[1])


@pytest.mark.parametrize("op", ["MoE", "QMoE"])
def test_fused_moe_ops_pass_their_shape_on_and_are_left_to_the_reporter(op):
    nodes = [
        helper.make_node(op, ["x", "router"], ["y"], "moe", domain=CONTRIB),
        helper.make_node("Relu", ["y"], ["r"], name="relu"),
    ]
    inputs = [_float_input("x", ["tokens", 8]), _float_input("router", ["tokens", 4])]
    cost = _bf16_cost(_contrib_model(nodes, inputs), {"x": (5, 8), "router": (5, 4)})
    assert (cost.kernels, cost.uncosted, cost.flops) == (1, (), 5 * 8)  # the Relu only


def test_nodes_left_unsized_are_named_as_not_costed():
    nodes = [
        helper.make_node("NoSuchOp", ["x"], ["odd_out"], "odd", domain=CONTRIB),
        helper.make_node("Relu", ["odd_out"], ["after_out"], name="after"),
        helper.make_node("Relu", ["x"], ["r"], name="sized"),
    ]
    cost = _bf16_cost(_contrib_model(nodes, [_float_input("x", ["n", 8])]), {"x": (3, 8)})
    assert cost.uncosted == ("odd (com.microsoft.NoSuchOp)", "after (Relu)")
    assert (cost.kernels, cost.flops) == (1, 3 * 8)


def test_below_opset_15_contrib_ops_have_no_stand_ins_and_the_nodes_after_them_are_named_as_not_costed():
    caches = [numpy_helper.from_array(np.ones((16, 4), np.float32), name) for name in ("cos", "sin")]
    nodes = [
        helper.make_node("RotaryEmbedding", ["x", "positions", "cos", "sin"], ["y"], "rope", domain=CONTRIB),
        helper.make_node("Relu", ["y"], ["r"], name="relu"),
    ]
    inputs = [_float_input("x", [1, 2, 16]), helper.make_tensor_value_info("positions", TensorProto.INT64, [1, 2])]
    cost = _bf16_cost(_contrib_model(nodes, inputs, caches, opset=14), {"x": (1, 2, 16), "positions": (1, 2)})
    # the rope is costed from its inputs (see the rotary test above); its output, and so the Relu, is not sized
    assert (cost.kernels, cost.flops, cost.uncosted) == (1, 3 * 32, ("relu (Relu)",))


def test_the_cost_cache_forgets_its_oldest_shapes_beyond_its_bound(monkeypatch):
    import ndp_ep.costing as costing

    monkeypatch.setattr(costing, "MAX_COSTED_SHAPES", 2)
    coster = NonExpertCoster(_model(), load_system("h200"), "bf16")
    computed = []
    real = coster._compute
    monkeypatch.setattr(coster, "_compute", lambda shapes: computed.append(shapes["x"][0]) or real(shapes))
    for batch in (1, 2, 3, 2, 3, 1):
        coster.cost({"x": (batch, 64)})
    assert computed == [1, 2, 3, 1]  # 1 was forgotten when 3 came; 2 and 3 were kept


def _causal_mask_model(step: int) -> onnx.ModelProto:
    """x [1, S, S] plus a causal mask built as exporters build it: Range(0, S, step) compared with itself."""
    constants = [
        numpy_helper.from_array(np.array(1, dtype=np.int64), "one"),
        numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array(step, dtype=np.int64), "step"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "axis0"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        numpy_helper.from_array(np.array(-1e9, dtype=np.float32), "neg"),
        numpy_helper.from_array(np.array(0.0, dtype=np.float32), "fzero"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "one"], ["length"], name="length"),
        helper.make_node("Range", ["zero", "length", "step"], ["positions"], name="range"),
        helper.make_node("Unsqueeze", ["positions", "axis0"], ["row"], name="row"),
        helper.make_node("Unsqueeze", ["positions", "axis1"], ["column"], name="column"),
        helper.make_node("Greater", ["row", "column"], ["future"], name="future"),
        helper.make_node("Where", ["future", "neg", "fzero"], ["mask"], name="mask"),
        helper.make_node("Add", ["x", "mask"], ["y"], name="masked"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", "s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=constants,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("length", [1, 5])
def test_a_causal_mask_over_a_unit_step_range_is_sized_even_for_one_token(length):
    # ONNX does not evaluate Range: left as it is, the mask is unsized and, at one token, so is the Add after it
    # (broadcasting 1 against an unknown dim); the stand-in sizes the Range at length - 0 elements
    cost = NonExpertCoster(_causal_mask_model(step=1), load_system("h200"), "bf16").cost({"x": (1, length, length)})
    assert cost.uncosted == ()
    assert cost.kernels == 4  # Gather, Greater, Where, Add (Shape, Range, Unsqueeze are free)
    # the Add reads x [1, S, S] and the mask [S, S] and writes [1, S, S], at 2 bytes (bf16) each
    masked = 3 * length * length * 2
    assert cost.bytes_moved >= masked


def test_a_range_of_another_step_is_left_to_shape_inference_and_what_it_cannot_size_is_named():
    cost = NonExpertCoster(_causal_mask_model(step=2), load_system("h200"), "bf16").cost({"x": (1, 1, 1)})
    assert {label.split(" ")[0] for label in cost.uncosted} >= {"future", "mask", "masked"}
