"""The real-exporter detection rules, checked in-process: every plan is recomputed from the plan alone
(tests/convert_real/plan_reference.py) and must reproduce the block output the original graph computes."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest

from graph_passes.graph_index import GraphIndex
from graph_passes.plan import MoEBlockPlan, Skip
from graph_passes.rules.fused_moe import FusedMoERule
from graph_passes.rules.onehot_experts import OneHotExpertsRule
from graph_passes.shape_eval import ShapeEvaluator
from tests.convert_real.cases import (
    EAGER_REASON,
    HF_DIR,
    extra_cases,
    fused_cases,
    hf_cases,
    scale_gathered_weight,
    unweighted_combine,
)
from tests.convert_real.plan_reference import evaluate_plan

ATOL = 1e-4


def _feeds(case) -> dict[str, np.ndarray]:
    return dict(np.load(case.inputs))


def _shape(plan: MoEBlockPlan) -> tuple[int, int, int, int]:
    return (plan.num_experts, plan.top_k, plan.hidden, plan.ffn)


@pytest.mark.parametrize("case", hf_cases() + extra_cases(), ids=lambda c: c.stem)
def test_hf_fixture_plans_reproduce_the_block_outputs(case):
    model = onnx.load(case.path)
    # claim_gathernd: also match the dynamo form (by default left to the general gathered-experts rule)
    found = OneHotExpertsRule(claim_gathernd=True).find(GraphIndex(model))
    plans = [f for f in found if isinstance(f, MoEBlockPlan)]
    skips = [f for f in found if isinstance(f, Skip)]
    assert sorted(_shape(p) for p in plans) == sorted(case.blocks)
    if case.blocks:
        assert not skips, [s.reason for s in skips]
    else:
        assert len(skips) == case.skipped
        assert all(case.skip_reason in s.reason for s in skips)
    for plan in plans:
        original, recomputed = evaluate_plan(model, _feeds(case), plan)
        assert np.abs(original).max() > 0.1  # outputs are O(1): the tolerance below means something
        np.testing.assert_allclose(recomputed, original, atol=ATOL, rtol=0)


def test_gathernd_blocks_are_left_to_the_general_rule_by_default():
    model = onnx.load(HF_DIR / "mixtral_block_dynamo.onnx")
    assert OneHotExpertsRule().find(GraphIndex(model)) == []


def test_hf_block_names_come_from_module_paths():
    for stem in ("mixtral_model_dynamo", "mixtral_model_torchscript"):
        found = OneHotExpertsRule(claim_gathernd=True).find(GraphIndex(onnx.load(HF_DIR / f"{stem}.onnx")))
        assert sorted(p.name for p in found) == ["model.model.layers.0.mlp", "model.model.layers.1.mlp"]


def test_gpt_oss_plan_reads_the_clamp_limit_and_interleaved_columns():
    (plan,) = OneHotExpertsRule().find(GraphIndex(onnx.load(HF_DIR / "gpt_oss_block_torchscript.onnx")))
    assert plan.activation == "swiglu_clamp"
    assert plan.activation_limit == pytest.approx(1.5)
    assert plan.activation_alpha == pytest.approx(1.702)
    assert (plan.weights.gate.columns, plan.weights.up.columns) == ("even", "odd")
    assert plan.weights.up.layout == "in_out" and plan.weights.down_bias is not None


@pytest.mark.parametrize("case", fused_cases(), ids=lambda c: c.stem)
def test_fused_moe_plans_reproduce_onnxruntime(case):
    model = onnx.load(case.path)
    found = FusedMoERule().find(GraphIndex(model))
    plans = [f for f in found if isinstance(f, MoEBlockPlan)]
    skips = [f for f in found if isinstance(f, Skip)]
    assert [_shape(p) for p in plans] == list(case.blocks)
    assert len(skips) == case.skipped and all(case.skip_reason in s.reason for s in skips)
    for plan in plans:
        assert plan.replaced_nodes == (next(n.name for n in model.graph.node if n.output[0] == plan.output_value),)
        original, recomputed = evaluate_plan(model, _feeds(case), plan)
        np.testing.assert_allclose(recomputed, original, atol=ATOL, rtol=0)


TAMPERINGS = {
    scale_gathered_weight: (
        "feeds Mul, expected one MatMul",
        ("mixtral_block_torchscript", "mixtral_block_dynamo", "gpt_oss_block_torchscript"),
    ),
    unweighted_combine: (
        "^combine is not the routing-weighted sum over the top-k slots",
        ("mixtral_block_torchscript", "qwen2_moe_block_dynamo", "gpt_oss_block_dynamo"),
    ),
}


@pytest.mark.parametrize(
    ("tamper", "stem", "reason"),
    [
        pytest.param(tamper, stem, reason, id=f"{tamper.__name__}-{stem}")
        for tamper, (reason, stems) in TAMPERINGS.items()
        for stem in stems
    ],
)
def test_a_tampered_block_is_skipped_with_the_reason(tamper, stem, reason):
    """A gathered weight scaled before its MatMul, or a combine that drops the routing weights: no plan."""
    model = tamper(onnx.load(HF_DIR / f"{stem}.onnx"))
    found = OneHotExpertsRule(claim_gathernd=True).find(GraphIndex(model))
    assert not [f for f in found if isinstance(f, MoEBlockPlan)]
    (skip,) = found
    assert re.search(reason, skip.reason)


def test_eager_unrolled_exports_are_reported_with_the_number_of_unrolled_experts():
    found = OneHotExpertsRule().find(GraphIndex(onnx.load(HF_DIR / "mixtral_block_eager_torchscript.onnx")))
    (skip,) = found
    assert skip.reason.startswith(EAGER_REASON)
    assert "2 unrolled expert branch(es)" in skip.reason  # traced on one token: top-2 of 4 experts


def test_fused_rule_skips_what_the_plan_cannot_express():
    model = onnx.load(next(c.path for c in fused_cases() if c.stem == "fused_moe_relu_k1"))
    node = next(n for n in model.graph.node if n.op_type == "MoE")
    node.attribute.append(onnx.helper.make_attribute("use_sparse_mixer", 1))
    (skip,) = FusedMoERule().find(GraphIndex(model))
    assert "use_sparse_mixer" in skip.reason
    node.attribute.pop()
    node.attribute.append(onnx.helper.make_attribute("activation_type", "identity"))
    del node.attribute[[a.name for a in node.attribute].index("activation_type")]
    (skip,) = FusedMoERule().find(GraphIndex(model))
    assert "identity" in skip.reason


def test_fused_router_nodes_are_a_softmax_topk_router():
    model = onnx.load(next(c.path for c in fused_cases() if c.stem == "fused_moe_relu_k2_norm_bias"))
    (plan,) = FusedMoERule().find(GraphIndex(model))
    ops = [n.op_type for n in plan.router_nodes]
    assert ops == ["Constant", "Constant", "Softmax", "TopK", "ReduceSum", "Div"]
    assert plan.expert_ids_value == plan.router_nodes[3].output[1]
    assert plan.routing_weights_value == plan.router_nodes[-1].output[0]


def test_shape_evaluator_resolves_the_torchscript_chunk_bounds():
    model = onnx.load(HF_DIR / "mixtral_block_torchscript.onnx")
    index = GraphIndex(model)
    evaluator = ShapeEvaluator(index)
    slices = [n for n in model.graph.node if n.op_type == "Slice" and (index.shape(n.input[0]) or (0,))[-1] == 96]
    bounds = sorted((evaluator.ints(n.input[1])[0], evaluator.ints(n.input[2])[0]) for n in slices)
    assert bounds == [(0, 48), (48, 96)]


def test_stacked_experts_rule_claims_only_the_dynamo_form():
    from tests.convert_real.stacked_experts_rule import StackedExpertsRule

    dynamo = StackedExpertsRule().find(GraphIndex(onnx.load(HF_DIR / "qwen2_moe_model_dynamo.onnx")))
    assert [type(f).__name__ for f in dynamo] == ["MoEBlockPlan", "MoEBlockPlan"]
    for stem in ("qwen2_moe_model_torchscript", "mixtral_block_eager_torchscript"):
        assert StackedExpertsRule().find(GraphIndex(onnx.load(HF_DIR / f"{stem}.onnx"))) == []


# generalisation fixtures the default rule set does not convert yet, by stem, with the reason (xfail until it does)
DEFAULT_RULES_GAPS: dict[str, str] = {}


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, id=c.stem, marks=[pytest.mark.xfail(strict=False, reason=DEFAULT_RULES_GAPS[c.stem])])
        if c.stem in DEFAULT_RULES_GAPS
        else pytest.param(c, id=c.stem)
        for c in extra_cases()
    ],
)
def test_generalisation_fixtures_convert_with_the_default_rules(case):
    from graph_passes.convert import convert

    _, report = convert(str(case.path), shards=2)
    assert [(b.num_experts, b.top_k, b.hidden, b.ffn) for b in report.blocks] == list(case.blocks)
    assert all(b.checked_numerically and b.max_abs_error < ATOL for b in report.blocks)


def test_an_activation_the_plan_cannot_express_is_skipped():
    """Squared ReLU (NemotronH's relu2) between the projections: no plan activation matches it."""
    from tests.convert_real.cases import EXTRA_DIR

    model = onnx.load(EXTRA_DIR / "plain_relu_block_torchscript.onnx")
    relu = next(n for n in model.graph.node if n.op_type == "Relu")
    squared = relu.output[0] + "/squared"
    for node in model.graph.node:
        for i, value in enumerate(node.input):
            if value == relu.output[0]:
                node.input[i] = squared
    position = list(model.graph.node).index(relu)
    model.graph.node.insert(position + 1, onnx.helper.make_node("Mul", [relu.output[0]] * 2, [squared], name="relu2"))
    (skip,) = OneHotExpertsRule().find(GraphIndex(model))
    assert "unrecognised elementwise expert activation" in skip.reason


def test_a_float_moe_relabelled_qmoe_is_reported_not_ignored():
    model = onnx.load(next(c.path for c in fused_cases() if c.stem == "fused_moe_relu_k1"))
    node = next(n for n in model.graph.node if n.op_type == "MoE")
    node.op_type = "QMoE"
    node.attribute.append(onnx.helper.make_attribute("expert_weight_bits", 4))
    (skip,) = FusedMoERule().find(GraphIndex(model))
    # without a block_size attribute the scales would be per row, which the sharded op does not express
    assert skip.reason.startswith("com.microsoft.QMoE: per-row (block_size=0) quantization is not supported")
    node.attribute.append(onnx.helper.make_attribute("block_size", 16))
    (skip,) = FusedMoERule().find(GraphIndex(model))
    # QMoE's sixth input is fc2: the float MoE's fc2 bias sits there, so no [E, out, in] stack
    assert skip.reason.startswith("com.microsoft.QMoE: ") and "are not [E, out, in] stacks" in skip.reason
