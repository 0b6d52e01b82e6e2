"""Blocks are proven on their own region, never by guessing whole-model feeds; when a region cannot run alone
the whole-model fallback fails closed (the block is skipped with the error, no traceback)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from graph_passes import convert as convert_module
from graph_passes import verify
from graph_passes.convert import plan_conversion
from graph_passes.graph_index import GraphIndex
from graph_passes.rules.fused_moe import FusedMoERule

ROOT = Path(__file__).resolve().parents[2] / "sample_models"
GENAI_GPT_OSS = ROOT / "genai" / "gpt_oss_fp32" / "model.onnx"


def _no_whole_model_feeds(*args, **kwargs):
    raise AssertionError("the whole model was run on guessed feeds")


@pytest.mark.parametrize(
    "path",
    [GENAI_GPT_OSS, ROOT / "genai" / "lfm2_moe_int4" / "model.onnx", ROOT / "hf" / "mixtral_model_dynamo.onnx"],
    ids=lambda p: p.parent.name if p.name == "model.onnx" else p.stem,
)
def test_every_block_is_checked_on_its_own_region(path, monkeypatch):
    monkeypatch.setattr(verify, "random_feeds", _no_whole_model_feeds)
    seen = []
    judge = verify._judge

    def spy(candidate, store, captured, isolated):
        seen.append(isolated)
        return judge(candidate, store, captured, isolated)

    monkeypatch.setattr(verify, "_judge", spy)
    report = plan_conversion(path).report
    assert report.blocks and report.skipped == ()
    assert seen == [True] * len(report.blocks)


def test_the_isolated_region_of_a_fused_op_reads_only_hidden_and_logits():
    model = onnx.load(str(GENAI_GPT_OSS), load_external_data=False)
    index = GraphIndex(model)
    plan = FusedMoERule().find(index)[0]
    (fused,) = [n for n in model.graph.node if n.name == plan.replaced_nodes[0]]
    region = verify.isolated_region(model, index, plan)
    assert sorted(i.name for i in region.graph.input) == sorted([fused.input[0], fused.input[1]])
    assert len(region.graph.node) == 1 + len(plan.router_nodes)  # the op itself and the router the plan adds
    weights = {i for i in fused.input[2:] if i}
    assert {t.name for t in region.graph.initializer} >= weights


def test_a_region_that_cannot_run_alone_falls_back_and_fails_closed(monkeypatch):
    def broken_feeds(model, **kwargs):
        return {}  # nothing fed: ONNX Runtime refuses the run

    monkeypatch.setattr(verify, "isolated_region", lambda *args: None)
    monkeypatch.setattr(verify, "random_feeds", broken_feeds)
    report = plan_conversion(GENAI_GPT_OSS).report
    assert report.blocks == ()
    assert len(report.skipped) == 2
    for skip in report.skipped:
        assert "its region cannot run alone and the whole model failed on random feeds" in skip.reason


def test_a_model_without_moe_blocks_says_why_nothing_anchored():
    from onnx import helper

    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "dense", [x], [y])
    report = plan_conversion(helper.make_model(graph)).report
    (note,) = report.notes
    assert note.startswith("no MoE block anchored: 0 com.microsoft.MoE/QMoE node(s), 0 TopK/ArgMax router(s)")
    assert "does not look like an MoE model" in note


def test_the_check_budget_counts_the_per_slot_weight_copies_of_a_gathered_block():
    path = ROOT / "hf" / "mixtral_block_dynamo.onnx"
    planned = plan_conversion(path)
    (plan,) = planned.plans
    weights = verify._weight_bytes(plan, planned.store)
    # the weights alone fit, the copies a gathered block makes per routed slot do not: accepted on structure
    report = plan_conversion(path, max_check_weight_bytes=weights + 1).report
    (block,) = report.blocks
    assert not block.checked_numerically
    assert any("weights too large for the numeric check" in note for note in report.notes)
    per_slot = verify.PROBE_SEQ_LEN * plan.top_k * (weights // plan.num_experts)
    assert plan_conversion(path, max_check_weight_bytes=weights + per_slot).report.blocks[0].checked_numerically


def test_the_whole_model_fallback_feeds_a_decoder_from_its_genai_config(monkeypatch):
    monkeypatch.setattr(verify, "isolated_region", lambda *args: None)
    report = plan_conversion(GENAI_GPT_OSS).report
    assert len(report.blocks) == 2 and report.skipped == ()
    assert all(b.checked_numerically and not b.checked_in_isolation for b in report.blocks)


def _whole_check_bytes(path):
    planned = plan_conversion(path)
    return [verify._check_bytes(plan, planned.store) for plan in planned.plans], planned.plans


@pytest.mark.parametrize(
    "path",
    [ROOT / "hf" / "mixtral_block_dynamo.onnx", GENAI_GPT_OSS, ROOT / "genai" / "lfm2_moe_int4" / "model.onnx"],
    ids=lambda p: p.parent.name if p.name == "model.onnx" else p.stem,
)
def test_a_block_too_large_to_check_whole_is_proven_on_its_first_experts(path, monkeypatch):
    sizes, plans = _whole_check_bytes(path)
    experts = verify.sampled_expert_count(plans[0])
    assert experts < plans[0].num_experts
    budget = max(size * experts // plan.num_experts for size, plan in zip(sizes, plans, strict=True))
    assert budget < min(sizes)  # no block fits whole: every one goes through the sampled check
    stacked = {m.initializer for p in plans for m in (p.weights.up, p.weights.gate, p.weights.down) if m}
    read, whole = [], []
    expert, full = verify.WeightStore.expert, verify.WeightStore.full

    choose = convert_module.choose_readings

    def audited(model, candidates, store, **kwargs):  # what the check reads, once the store is built
        def spy_expert(name, e):
            read.append(e)
            return expert(store, name, e)

        def spy_full(name):
            whole.append(name)
            return full(store, name)

        store.expert, store.full = spy_expert, spy_full
        return choose(model, candidates, store, **kwargs)

    monkeypatch.setattr(convert_module, "choose_readings", audited)
    report = plan_conversion(path, max_check_weight_bytes=budget).report
    assert report.skipped == () and len(report.blocks) == len(plans)
    assert all(b.checked_numerically and b.checked_in_isolation for b in report.blocks)
    for plan in plans:
        wanted = f"{plan.name}: weights too large to check whole: checked on its first {experts} of {plan.num_experts}"
        assert any(note.startswith(wanted) for note in report.notes)
    assert read and max(read) < experts  # only the sampled experts' bytes were read
    assert not stacked & set(whole)
    assert not any("accepted on data-flow structure" in note for note in report.notes)


def test_a_wrong_reading_of_a_block_checked_on_its_first_experts_is_skipped(monkeypatch):
    path = ROOT / "hf" / "mixtral_block_dynamo.onnx"
    (size,), (plan,) = _whole_check_bytes(path)
    budget = size * verify.sampled_expert_count(plan) // plan.num_experts
    reference = verify.reference_block

    def off_by_ten_percent(*args, **kwargs):
        return reference(*args, **kwargs) * 1.1

    monkeypatch.setattr(verify, "reference_block", off_by_ten_percent)
    report = plan_conversion(path, max_check_weight_bytes=budget).report
    assert report.blocks == ()
    (skip,) = report.skipped
    assert "no reading of the expert computation reproduces its output" in skip.reason


def test_a_block_whose_cut_down_region_does_not_run_keeps_its_structural_reading(monkeypatch):
    path = ROOT / "hf" / "mixtral_block_dynamo.onnx"
    (size,), (plan,) = _whole_check_bytes(path)
    budget = size * verify.sampled_expert_count(plan) // plan.num_experts

    def refuse(*args, **kwargs):
        raise RuntimeError("ONNX Runtime refuses the region")

    monkeypatch.setattr(verify, "_capture", refuse)
    report = plan_conversion(path, max_check_weight_bytes=budget).report
    (block,) = report.blocks
    assert not block.checked_numerically
    assert any("weights too large for the numeric check; accepted on data-flow structure" in n for n in report.notes)


def _probe_with_external(weights: dict[str, tuple[int, list[int]]], nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    """A probe whose ``weights`` (name -> (data type, dims)) are external headers, as a sampled check builds it."""
    headers = []
    for name, (data_type, dims) in weights.items():
        header = onnx.TensorProto(name=name, data_type=data_type, dims=dims)
        header.data_location = onnx.TensorProto.EXTERNAL
        header.external_data.add(key="location", value=verify.SAMPLED_LOCATION)
        headers.append(header)
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])
    y = onnx.helper.make_empty_tensor_value_info("y")
    graph = onnx.helper.make_graph(nodes, "probe", [x], [y], headers)
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


def test_only_float_weights_of_standard_ops_are_fed_as_inputs():
    f32, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    nodes = [
        onnx.helper.make_node("MatMul", ["x", "w"], ["h"]),
        onnx.helper.make_node("Gather", ["h", "idx"], ["g"]),
        onnx.helper.make_node("QMoE", ["g", "q"], ["y"], domain="com.microsoft"),
    ]
    probe = _probe_with_external({"w": (f32, [4, 3]), "idx": (i64, [2]), "q": (f32, [3, 3])}, nodes)
    # q feeds a contrib op (which may need constant weights), idx is not a float weight
    assert verify._fed_weights(probe, ["w", "idx", "q"]) == {"w"}
    branch = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["w"], ["b"])], "b", [], [])
    probe.graph.node.append(onnx.helper.make_node("If", ["c"], ["z"], then_branch=branch, else_branch=branch))
    assert verify._fed_weights(probe, ["w", "idx", "q"]) == set()  # a subgraph may read any of them


def test_a_fed_weight_computes_what_the_handed_over_initializer_did():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    probe = _probe_with_external(
        {"w": (onnx.TensorProto.FLOAT, [4, 3])}, [onnx.helper.make_node("MatMul", ["x", "w"], ["y"])]
    )
    captured = verify._capture(probe, store=None, feeds={"x": x}, arrays={"w": w})
    assert set(captured) == {"x", "y"}  # the weight is an input of the run, not a value the check compares
    np.testing.assert_allclose(captured["y"], x @ w, rtol=1e-6)
    assert [t.name for t in probe.graph.initializer] == ["w"]  # the caller's probe is left as it was
