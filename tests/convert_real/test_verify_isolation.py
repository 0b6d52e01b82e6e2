"""Blocks are proven on their own region, never by guessing whole-model feeds; when a region cannot run alone
the whole-model fallback fails closed (the block is skipped with the error, no traceback)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

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
