"""The diff classifies the sample pairs exactly: identical, renamed-only, one node changed, ndp-ep rewrite."""

from __future__ import annotations

import json

import numpy as np
import onnx
from diff_sample_pairs import EXPERT_NODE_NAMES, EXPERTS, SHARDS, mlp_model
from onnx import helper, numpy_helper

from ndp_ep.diff import diff_models


def test_identical_models_have_no_differences(sample_pairs):
    result = diff_models(*sample_pairs["identical"])
    assert result.equivalent
    assert dict(result.node_counts) == {"unchanged": 6, "renamed": 0, "changed": 0, "removed": 0, "added": 0}
    assert result.initializer_counts["unchanged"] == 3
    assert result.nodes == () and result.initializers == () and result.regions == ()


def test_renamed_only_pair_is_equivalent_and_every_node_is_matched_by_structure(sample_pairs):
    result = diff_models(*sample_pairs["renamed"])
    assert result.equivalent
    assert dict(result.node_counts) == {"unchanged": 0, "renamed": 6, "changed": 0, "removed": 0, "added": 0}
    pairs = {(n.a.name, n.b.name) for n in result.nodes}
    assert ("head/Softmax", "r_head/Softmax") in pairs and ("fc1/MatMul", "r_fc1/MatMul") in pairs
    assert all(n.a.name == n.b.name.removeprefix("r_") for n in result.nodes)
    assert {n.match for n in result.nodes} <= {"structure", "neighbours"}
    assert sorted(i.summary for i in result.initializers) == [
        "fc1.bias → r_fc1.bias",
        "fc1.weight → r_fc1.weight",
        "fc2.weight → r_fc2.weight",
    ]
    assert {i.status for i in result.initializers} == {"renamed"}


def test_one_changed_attribute_is_the_only_difference(sample_pairs):
    result = diff_models(*sample_pairs["one_node_changed"])
    assert not result.equivalent
    assert dict(result.node_counts) == {"unchanged": 5, "renamed": 0, "changed": 1, "removed": 0, "added": 0}
    (changed,) = result.nodes
    assert (changed.status, changed.a.name, changed.match) == ("changed", "head/Softmax", "name")
    assert [(c.field, c.key, c.a, c.b) for c in changed.changes] == [("attribute", "axis", "-1", "0")]
    assert len(result.regions) == 1 and [n.name for n in result.regions[0].a_nodes] == ["head/Softmax"]


def test_ndp_ep_rewrite_is_shown_as_one_moe_block(sample_pairs):
    result = diff_models(*sample_pairs["ndp_ep_rewrite"])
    assert not result.equivalent
    assert dict(result.node_counts) == {"unchanged": 4, "renamed": 0, "changed": 0, "removed": 10, "added": 1}
    (block,) = result.moe_blocks
    assert (block.block, block.direction, block.replaced_source) == ("moe0", "rewrite", "metadata")
    assert (block.num_experts, block.top_k, block.shards, block.hidden, block.ffn) == (4, 2, 2, 8, 4)
    assert block.activation == "silu_glu" and dict(block.placement) == {"device": "ndp", "units": [0, 1]}
    assert block.contract_error is None
    assert [r.name for r in block.replaced_nodes] == list(EXPERT_NODE_NAMES)
    assert [r.op_type for r in block.new_nodes] == ["ShardedMoEExperts"]
    splits = [i for i in block.initializers if i.status == "split"]
    assert [i.summary for i in splits] == [
        "moe0 experts gate_up [4, 8, 8] → 4 experts × 2 shards of [8, 4]",
        "moe0 experts down [4, 8, 4] → 4 experts × 2 shards of [2, 8]",
    ]
    assert all(len(i.b) == EXPERTS * SHARDS and i.a_bytes == i.b_bytes for i in splits)
    assert {i.summary for i in block.initializers if i.status == "removed"} == {
        "moe0.experts.zeros [3, 4]",
        "moe0.experts.axis1 [1]",
        "moe0.experts.axis2 [1]",
    }
    # Every removed node belongs to the block, every added node too; the router is untouched.
    assert {n.block for n in result.nodes} == {"moe0"}
    assert [(o.domain, o.a, o.b) for o in result.opsets] == [("ndp_ep", None, 1)]
    assert len(result.regions) == 1 and result.regions[0].block == "moe0"


def test_block_without_replaced_nodes_metadata_is_inferred_from_names(tmp_path):
    from diff_sample_pairs import moe_original, moe_rewritten

    a, gate_up, down = moe_original()
    b = moe_rewritten(gate_up, down, placement=False)
    sharded = next(n for n in b.graph.node if n.op_type == "ShardedMoEExperts")
    kept = [p for p in sharded.metadata_props if p.key != "ndp_ep.replaced_nodes"]
    del sharded.metadata_props[:]
    sharded.metadata_props.extend(kept)
    onnx.save(a, tmp_path / "a.onnx")
    onnx.save(b, tmp_path / "b.onnx")
    (block,) = diff_models(tmp_path / "a.onnx", tmp_path / "b.onnx").moe_blocks
    assert block.replaced_source == "inferred"
    assert sorted(r.name for r in block.replaced_nodes) == sorted(EXPERT_NODE_NAMES)
    assert block.placement is None


def test_rewritten_sample_computes_what_the_original_computes():
    """The pair's model B is a real conversion's form: the provider runs it and matches stock ONNX Runtime on A."""
    import onnxruntime as ort
    from diff_sample_pairs import HIDDEN, TOKENS, moe_original, moe_rewritten

    import ndp_ep

    a, gate_up, down = moe_original()
    x = np.random.default_rng(1).standard_normal((TOKENS, HIDDEN)).astype(np.float32)
    expected = ort.InferenceSession(a.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ndp_ep.InferenceSession(moe_rewritten(gate_up, down)).run(None, {"x": x})[0]
    assert np.max(np.abs(got - expected)) <= 1e-5 * np.max(np.abs(expected))


def test_sharded_node_that_breaks_the_contract_is_still_shown_with_the_reason(tmp_path):
    from diff_sample_pairs import moe_original, moe_rewritten

    a, gate_up, down = moe_original()
    b = moe_rewritten(gate_up, down)
    sharded = next(n for n in b.graph.node if n.op_type == "ShardedMoEExperts")
    for attribute in sharded.attribute:
        if attribute.name == "shards":
            attribute.i = 3  # 4 experts x 3 shards no longer matches the 16 weight inputs, nor ffn 4
    onnx.save(a, tmp_path / "a.onnx")
    onnx.save(b, tmp_path / "b.onnx")
    (block,) = diff_models(tmp_path / "a.onnx", tmp_path / "b.onnx").moe_blocks
    assert block.contract_error is not None and "not divisible by 3 shards" in block.contract_error
    assert (block.block, block.num_experts, block.shards) == ("moe0", EXPERTS, SHARDS)  # from the block summary


def test_values_change_reshape_and_generic_split_of_initializers(tmp_path):
    a = mlp_model()
    b = mlp_model()
    weights = {t.name: numpy_helper.to_array(t) for t in b.graph.initializer}
    del b.graph.initializer[:]
    b.graph.initializer.extend(
        [
            numpy_helper.from_array(weights["fc1.weight"] + 1.0, "fc1.weight"),
            numpy_helper.from_array(weights["fc1.bias"].reshape(1, 16), "fc1.bias"),
            numpy_helper.from_array(np.ascontiguousarray(weights["fc2.weight"][:8]), "fc2.weight.part0"),
            numpy_helper.from_array(np.ascontiguousarray(weights["fc2.weight"][8:]), "fc2.weight.part1"),
        ]
    )
    concat = helper.make_node("Concat", ["fc2.weight.part0", "fc2.weight.part1"], ["fc2.weight"], axis=0)
    b.graph.node.insert(0, concat)
    onnx.save(a, tmp_path / "a.onnx")
    onnx.save(b, tmp_path / "b.onnx")
    result = diff_models(tmp_path / "a.onnx", tmp_path / "b.onnx")
    by_status = {i.status: i.summary for i in result.initializers}
    assert by_status == {
        "values_changed": "fc1.weight values changed",
        "reshaped": "fc1.bias [16] → [1, 16]",
        "split": "fc2.weight [16, 8] → 2 shards of 2 × [8, 8]",
    }
    assert dict(result.node_counts)["added"] == 1 and not result.equivalent


def test_repeated_identical_layers_are_told_apart_when_renamed(tmp_path):
    """40 structurally identical layers sharing one weight: WL hashes collide, anchors separate them."""

    def chain(prefix: str) -> onnx.ModelProto:
        nodes, tensor = [], "x"
        for layer in range(40):
            nodes.append(
                helper.make_node("MatMul", [tensor, prefix + "w"], [f"{prefix}m{layer}"], name=f"{prefix}mm{layer}")
            )
            nodes.append(
                helper.make_node("Relu", [f"{prefix}m{layer}"], [f"{prefix}r{layer}"], name=f"{prefix}act{layer}")
            )
            tensor = f"{prefix}r{layer}"
        nodes.append(helper.make_node("Identity", [tensor], ["y"], name=prefix + "out"))
        w = numpy_helper.from_array(np.eye(4, dtype=np.float32), prefix + "w")
        graph = helper.make_graph(
            nodes,
            "chain",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
            initializer=[w],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    onnx.save(chain(""), tmp_path / "a.onnx")
    onnx.save(chain("v2_"), tmp_path / "b.onnx")
    result = diff_models(tmp_path / "a.onnx", tmp_path / "b.onnx")
    assert result.equivalent and result.node_counts["renamed"] == 81
    assert all(n.b.name == "v2_" + n.a.name for n in result.nodes)


def test_metadata_json_is_read_defensively(tmp_path):
    from diff_sample_pairs import moe_original, moe_rewritten

    a, gate_up, down = moe_original()
    b = moe_rewritten(gate_up, down)
    sharded = next(n for n in b.graph.node if n.op_type == "ShardedMoEExperts")
    for prop in sharded.metadata_props:
        prop.value = "{not json" if prop.key == "ndp_ep.placement" else prop.value
    for attribute in sharded.attribute:
        if attribute.name == "top_k":
            attribute.s = b"two"
    onnx.save(a, tmp_path / "a.onnx")
    onnx.save(b, tmp_path / "b.onnx")
    (block,) = diff_models(tmp_path / "a.onnx", tmp_path / "b.onnx").moe_blocks
    assert block.placement is None and block.top_k == json.loads(sharded.metadata_props[1].value)["top_k"]


def test_fused_moe_rewrite_with_biases_maps_fc_weights_to_shards(tmp_path):
    """A com.microsoft::MoE node with fc1/fc2 weights and biases, rewritten with bias shards."""
    experts, hidden, ffn, shards, block = 4, 16, 24, 2, "layers.0.moe"
    rng = np.random.default_rng(3)
    fc1 = rng.standard_normal((experts, 2 * ffn, hidden)).astype(np.float32)
    fc1_bias = rng.standard_normal((experts, 2 * ffn)).astype(np.float32)
    fc2 = rng.standard_normal((experts, hidden, ffn)).astype(np.float32)
    fc2_bias = rng.standard_normal((experts, hidden)).astype(np.float32)
    router = numpy_helper.from_array(
        rng.standard_normal((experts, hidden)).astype(np.float32), f"{block}.router.weight"
    )
    gemm = helper.make_node("Gemm", ["x", router.name], ["logits"], name=f"{block}/router/Gemm", transB=1)
    io = (
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [5, hidden])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [5, hidden])],
    )
    weights_a = [numpy_helper.from_array(t, f"{block}.{n}") for t, n in ((fc1, "fc1"), (fc1_bias, "fc1_bias"))]
    weights_a += [numpy_helper.from_array(t, f"{block}.{n}") for t, n in ((fc2, "fc2"), (fc2_bias, "fc2_bias"))]
    fused = helper.make_node(
        "MoE", ["x", "logits", *(w.name for w in weights_a)], ["y"], name=f"{block}/MoE", domain="com.microsoft", k=2
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    a = helper.make_model(
        helper.make_graph([gemm, fused], "a", *io, initializer=[router, *weights_a]), opset_imports=opsets
    )

    step, shard_inits = ffn // shards, []
    for e in range(experts):
        for s in range(shards):
            cols = np.r_[s * step : (s + 1) * step, ffn + s * step : ffn + (s + 1) * step]
            prefix = f"{block}.experts.{e}.shard{s}"
            shard_inits.append(numpy_helper.from_array(np.ascontiguousarray(fc1[e][cols].T), f"{prefix}.gate_up"))
            shard_inits.append(
                numpy_helper.from_array(np.ascontiguousarray(fc1_bias[e][cols]), f"{prefix}.gate_up_bias")
            )
            shard_inits.append(
                numpy_helper.from_array(np.ascontiguousarray(fc2[e][:, s * step : (s + 1) * step].T), f"{prefix}.down")
            )
        shard_inits.append(numpy_helper.from_array(fc2_bias[e], f"{block}.experts.{e}.down_bias"))
    topk = [
        helper.make_node("TopK", ["logits", "k"], ["rw", "ids"], name=f"{block}/ndp_ep/router/TopK"),
    ]
    inputs = ["x", "ids", "rw", *(t.name for t in shard_inits)]
    sharded = helper.make_node(
        "ShardedMoEExperts", inputs, ["y"], name=f"{block}/ShardedMoEExperts", domain="ndp_ep",
        layer=block, num_experts=experts, top_k=2, shards=shards, hidden=hidden, ffn=ffn,
    )  # fmt: skip
    entry = sharded.metadata_props.add()
    entry.key, entry.value = "ndp_ep.replaced_nodes", json.dumps([f"{block}/MoE"])
    k = numpy_helper.from_array(np.array([2], dtype=np.int64), "k")
    b = helper.make_model(
        helper.make_graph([gemm, *topk, sharded], "b", *io, initializer=[router, k, *shard_inits]),
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("ndp_ep", 1)],
    )
    onnx.save(a, tmp_path / "a.onnx")
    onnx.save(b, tmp_path / "b.onnx")
    result = diff_models(tmp_path / "a.onnx", tmp_path / "b.onnx")
    (block_diff,) = result.moe_blocks
    assert [r.name for r in block_diff.replaced_nodes] == [f"{block}/MoE"]
    assert sorted(r.op_type for r in block_diff.new_nodes) == ["ShardedMoEExperts", "TopK"]
    assert [i.summary for i in block_diff.initializers] == [
        f"{block} experts gate_up [4, 48, 16] → 4 experts × 2 shards of [16, 24]",
        f"{block} experts gate_up_bias [4, 48] → 4 experts × 2 shards of [24]",
        f"{block} experts down [4, 16, 24] → 4 experts × 2 shards of [12, 16]",
        f"{block} experts down_bias [4, 16] → 4 experts of [16]",
    ]
    assert {(o.domain, o.a, o.b) for o in result.opsets} == {("com.microsoft", 1, None), ("ndp_ep", None, 1)}
    assert result.initializer_counts["removed"] == 0 and result.initializer_counts["added"] == 1  # the TopK's k


def _save_pair(tmp_path, a: onnx.ModelProto, b: onnx.ModelProto):
    onnx.save(a, tmp_path / "a.onnx")
    onnx.save(b, tmp_path / "b.onnx")
    return diff_models(tmp_path / "a.onnx", tmp_path / "b.onnx")


def test_operator_replaced_under_the_same_name_is_a_change(tmp_path):
    b = mlp_model()
    relu = next(n for n in b.graph.node if n.op_type == "Relu")
    relu.op_type = "Sigmoid"
    result = _save_pair(tmp_path, mlp_model(), b)
    (changed,) = result.nodes
    assert (changed.status, changed.match, changed.a.name) == ("changed", "name", "act/Relu")
    assert [(c.field, c.a, c.b) for c in changed.changes] == [("op_type", "Relu", "Sigmoid")]


def test_shifted_generated_names_do_not_pair_unrelated_nodes(tmp_path):
    """B inserts an Identity first and every generated name node_<i> shifts by one."""
    a, b = mlp_model(), mlp_model()
    b.graph.node.insert(0, helper.make_node("Identity", ["x"], ["x_copy"]))
    b.graph.node[1].input[0] = "x_copy"
    for model in (a, b):
        for position, node in enumerate(model.graph.node):
            node.name = f"node_{position}"
    result = _save_pair(tmp_path, a, b)
    assert result.node_counts["added"] == 1 and result.node_counts["removed"] == 0
    (added,) = [n for n in result.nodes if n.status == "added"]
    assert added.b.op_type == "Identity"
    changed = [n for n in result.nodes if n.status == "changed"]
    # The first MatMul now reads x_copy instead of x: the only other real difference.
    assert [(n.a.op_type, [(c.field, c.key) for c in n.changes]) for n in changed] == [("MatMul", [("input", "#0")])]
    assert all(n.a.op_type == n.b.op_type for n in result.nodes if n.a and n.b)


def test_duplicate_and_empty_names_fall_back_to_structure(tmp_path):
    a, b = mlp_model(), mlp_model()
    for node in a.graph.node:
        node.name = "dup"
    for node in b.graph.node:
        node.name = ""
    result = _save_pair(tmp_path, a, b)
    assert result.equivalent and result.node_counts["renamed"] == 6


def test_graph_input_rename_and_opset_bump_make_models_differ(tmp_path):
    b = mlp_model()
    b.graph.input[0].name = "features"
    b.graph.node[0].input[0] = "features"
    b.opset_import[0].version = 18
    result = _save_pair(tmp_path, mlp_model(), b)
    assert not result.equivalent
    assert [(v.kind, v.status) for v in result.values] == [("input", "renamed")]
    assert [(o.domain, o.a, o.b) for o in result.opsets] == [("ai.onnx", 17, 18)]


def test_typed_field_initializers_are_compared_by_content(tmp_path):
    a, b = mlp_model(), mlp_model()
    for model, value in ((a, 1.0), (b, 2.0)):
        model.graph.initializer.append(helper.make_tensor("scale", onnx.TensorProto.FLOAT, [2], [value, 3.0]))
    result = _save_pair(tmp_path, a, b)
    assert [(i.status, i.summary) for i in result.initializers] == [("values_changed", "scale values changed")]


def test_reversed_pair_shows_the_block_restored_and_shards_merged(sample_pairs):
    a, b = sample_pairs["ndp_ep_rewrite"]
    result = diff_models(b, a)
    (block,) = result.moe_blocks
    assert block.direction == "reverse" and [r.name for r in block.replaced_nodes] == list(EXPERT_NODE_NAMES)
    assert [i.summary for i in block.initializers if i.status == "merged"] == [
        "moe0 experts gate_up 4 experts × 2 shards of [8, 4] → [4, 8, 8]",
        "moe0 experts down 4 experts × 2 shards of [2, 8] → [4, 8, 4]",
    ]
    assert dict(result.node_counts) == {"unchanged": 4, "renamed": 0, "changed": 0, "removed": 1, "added": 10}
    assert [(o.domain, o.a, o.b) for o in result.opsets] == [("ndp_ep", 1, None)]
