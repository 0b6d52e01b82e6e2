"""The ``ShardedMoEExperts`` contract: building a node and parsing it back round-trips, and every tampered
attribute or input count is refused with :class:`ShardedOpError`."""

from __future__ import annotations

import pytest
from onnx import helper

from graph_passes.sharded_op import (
    ShardedOpError,
    ShardedOpSpec,
    block_of_node_name,
    get_metadata,
    make_node,
    parse_node,
    parse_shard_name,
)

SPECS = {
    "fp32_gated_biases": ShardedOpSpec(
        "model.layers.0.mlp", 4, 2, 16, 24, 2, "swiglu_clamp", 1.5, 3.0, 0.5, has_first_bias=True, has_down_bias=True
    ),
    "fp16_plain": ShardedOpSpec("blk", 8, 1, 32, 64, 4, "relu", weight_dtype="float16"),
    "int4_zero_points": ShardedOpSpec(
        "q", 4, 2, 64, 128, 4, "silu_glu", weight_dtype="int4", quant_block_size=32, has_zero_points=True
    ),
    "int8_no_zero_points": ShardedOpSpec("q8", 2, 2, 32, 32, 2, "gelu", weight_dtype="int8", quant_block_size=16),
    "fp16_out_in": ShardedOpSpec(
        "blk", 4, 2, 16, 24, 2, "silu_glu", weight_dtype="float16", first_layout="out_in", down_layout="out_in"
    ),
    "bf16_first_out_in": ShardedOpSpec("blk", 4, 2, 16, 24, 3, "gelu", weight_dtype="bfloat16", first_layout="out_in"),
}


def _node(spec: ShardedOpSpec):
    return make_node(spec, "x", "ids", "w", "y", spec.weight_names(), replaced_nodes=["a", "b"], summary={"k": 1})


@pytest.mark.parametrize("name", sorted(SPECS))
def test_build_then_parse_round_trips(name):
    spec = SPECS[name]
    node = _node(spec)
    assert parse_node(node) == spec
    assert block_of_node_name(node.name) == spec.layer
    assert get_metadata(node, "ndp_ep.replaced_nodes") == ["a", "b"]
    # input count written out by hand from the contract's input table
    per_shard = spec.num_experts * spec.shards
    groups = 2 + (2 + 2 * spec.has_zero_points if spec.quantized else 0) + spec.has_first_bias
    assert len(node.input) == 3 + groups * per_shard + spec.has_down_bias * spec.num_experts
    for weight in node.input[3:]:
        parsed = parse_shard_name(weight)
        assert parsed is not None and parsed.block == spec.layer


def _tampered(node, attribute: str, value):
    out = type(node)()
    out.CopyFrom(node)
    kept = [a for a in out.attribute if a.name != attribute]
    del out.attribute[:]
    out.attribute.extend(kept)
    if value is not None:
        out.attribute.append(helper.make_attribute(attribute, value))
    return out


TAMPERED = [
    ("num_experts", 0),
    ("num_experts", None),
    ("top_k", 9),
    ("shards", 5),  # 24 % 5
    ("ffn", "24"),
    ("activation", "softmax"),
    ("weight_dtype", "int3"),
    ("has_first_bias", 2),
    ("quant_block_size", 8),  # quantization attributes on float weights
    ("unknown_attribute", 1),
    ("layer", None),
    ("first_layout", "row_major"),
    ("down_layout", "OUT_IN"),
    ("down_layout", 1),  # a string attribute
]


@pytest.mark.parametrize(("attribute", "value"), TAMPERED, ids=[f"{a}={v}" for a, v in TAMPERED])
def test_a_tampered_attribute_is_refused(attribute, value):
    node = _node(SPECS["fp32_gated_biases"])
    with pytest.raises(ShardedOpError):
        parse_node(_tampered(node, attribute, value))


def test_a_quantized_block_size_that_does_not_divide_the_shard_width_is_refused():
    node = _node(SPECS["int4_zero_points"])  # shard width 128 / 4 = 32
    with pytest.raises(ShardedOpError):
        parse_node(_tampered(node, "quant_block_size", 64))


def test_a_partial_last_quantization_block_is_accepted_where_onnxruntime_accepts_it():
    # hidden 80 = 2.5 blocks of 32 (ONNX Runtime's QMoE ends the rows in a partial block); one shard's ffn may too
    quantized = {"weight_dtype": "int4", "quant_block_size": 32, "has_zero_points": True}
    spec = ShardedOpSpec("q", 4, 2, 80, 88, 1, "silu_glu", **quantized)
    assert parse_node(_node(spec)) == spec
    with pytest.raises(ShardedOpError, match="divide the shard width"):  # 2 shards of 44: no block boundary
        ShardedOpSpec("q", 4, 2, 80, 88, 2, "silu_glu", weight_dtype="int4", quant_block_size=32)


def test_int4_weights_of_an_odd_width_are_refused():
    # two 4-bit values per byte: an odd row would need half a byte (hidden 16, ffn 30 on 2 shards: width 15)
    node = _node(SPECS["int4_zero_points"])
    tampered = _tampered(_tampered(node, "quant_block_size", 1), "ffn", 30)
    with pytest.raises(ShardedOpError, match="int4 weights pack two values per byte"):
        parse_node(_tampered(tampered, "shards", 2))


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("change", [-1, 1])
def test_a_wrong_weight_input_count_is_refused(name, change):
    node = _node(SPECS[name])
    if change < 0:
        node.input.pop()
    else:
        node.input.append("extra")
    with pytest.raises(ShardedOpError):
        parse_node(node)


def test_a_node_of_another_op_is_refused():
    node = _node(SPECS["fp16_plain"])
    node.op_type = "MoE"
    with pytest.raises(ShardedOpError):
        parse_node(node)


def test_make_node_refuses_a_wrong_number_of_weights():
    spec = SPECS["fp16_plain"]
    with pytest.raises(ShardedOpError):
        make_node(spec, "x", "ids", "w", "y", spec.weight_names()[:-1])


def test_a_node_without_layout_attributes_reads_as_in_out_with_x_at_w_shapes():
    node = _node(SPECS["fp32_gated_biases"])  # H 16, I 24, 2 shards, gated
    assert not [a for a in node.attribute if a.name.endswith("_layout")]  # the default is not written
    spec = parse_node(node)
    assert (spec.first_layout, spec.down_layout) == ("in_out", "in_out")
    assert spec.float_shape("first") == (16, 24) and spec.float_shape("down") == (12, 16)


def test_out_in_layouts_are_written_and_transpose_the_float_shapes():
    node = _node(SPECS["fp16_out_in"])  # H 16, I 24, 2 shards, gated
    written = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert written["first_layout"] == b"out_in" and written["down_layout"] == b"out_in"
    spec = parse_node(node)
    assert spec.float_shape("first") == (24, 16) and spec.float_shape("down") == (16, 12)
    assert spec.float_shape("first_bias") == (24,)


@pytest.mark.parametrize("attribute", ["first_layout", "down_layout"])
def test_a_layout_on_quantized_weights_is_refused(attribute):
    node = _node(SPECS["int8_no_zero_points"])
    with pytest.raises(ShardedOpError):
        parse_node(_tampered(node, attribute, "out_in"))
