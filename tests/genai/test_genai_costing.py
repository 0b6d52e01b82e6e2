"""The non-expert GPU costing (ndp_ep/costing.py) of the bundled GenAI decoders: every node that is not free is
costed (attention, projections, norms, lm_head), the cost grows with the past length, and decode steps costed
from a fit equal those costed by shape inference."""

from __future__ import annotations

import json

import onnx
import pytest

import ndp_ep
from graph_passes.feeds import random_feeds, read_genai_config
from hw_model.hardware import load_system
from ndp_ep.costing import FREE_OPS, NonExpertCoster
from ndp_ep.genai import step_shapes
from tests.genai.conftest import GENAI_DIR, manifest

FIXTURES = sorted(manifest())
CPU_FIXTURES = sorted(n for n, e in manifest().items() if e["cpu_outputs"])


def _decoder(name: str) -> onnx.ModelProto:
    return onnx.load(str(GENAI_DIR / name / "model.onnx"), load_external_data=False)


def _step(model: onnx.ModelProto, name: str, past: int, tokens: int = 1) -> dict[str, tuple[int, ...]]:
    """Input shapes of a step of ``tokens`` tokens after ``past`` ones (as ``ndp-ep run`` feeds a decoder)."""
    config = read_genai_config(GENAI_DIR / name / "model.onnx")
    feeds = random_feeds(model, seq_len=tokens, config=config, past_len=past)
    return {input_name: value.shape for input_name, value in feeds.items()}


def _kernels(model: onnx.ModelProto) -> int:
    """Nodes that are GPU kernels: not free ops, not the provider's nodes, not fused MoE ops (which the reporter
    costs when they are not converted)."""
    return sum(
        1
        for node in model.graph.node
        if not (node.domain in ("", "ai.onnx") and node.op_type in FREE_OPS)
        and node.domain != "ndp_ep"
        and node.op_type not in ("MoE", "QMoE")
    )


# Qwen3.5's linear-attention ops (com.microsoft LinearAttention, LinearAttentionGate, GatedRMSNorm, GatedAdd,
# CausalConvWithState, MRotaryEmbedding) have no shape inference, so the kernels after them go uncosted
UNCOSTED_ARCHS = {"qwen3_5_moe"}


@pytest.mark.parametrize("name", FIXTURES)
def test_every_kernel_of_a_genai_decoder_is_costed_and_its_cost_grows_with_the_past_length(name):
    if manifest()[name]["arch"] in UNCOSTED_ARCHS:
        pytest.xfail("non-expert costing has no shapes for Qwen3.5's linear-attention ops")
    model = _decoder(name)
    coster = NonExpertCoster(model, load_system("h200"), "bf16")
    prefill = coster.cost(_step(model, name, past=0, tokens=8))
    steps = [coster.cost(_step(model, name, past)) for past in (8, 64, 512)]
    for cost in (prefill, *steps):
        assert (cost.kernels, cost.uncosted) == (_kernels(model), ())
    for shorter, longer in zip(steps, steps[1:], strict=False):
        assert longer.flops > shorter.flops and longer.bytes_moved > shorter.bytes_moved
        assert longer.time_s > shorter.time_s


@pytest.mark.parametrize("name", ["gpt_oss_fp32", "lfm2_moe_fp32"])
def test_a_decoders_report_costs_every_non_expert_kernel_of_the_converted_model(name):
    path = GENAI_DIR / name / "model.onnx"
    model = _decoder(name)
    session = ndp_ep.InferenceSession(path)
    feeds = random_feeds(model, seq_len=8, config=read_genai_config(path))
    session.run(None, feeds)
    cost = session.reporter.non_expert_cost({input_name: value.shape for input_name, value in feeds.items()})
    assert (cost.kernels, cost.uncosted) == (_kernels(session.converted_model), ())
    assert session.last_report.non_expert_gpu_s == cost.time_s
    assert cost.time_s > cost.kernels * session.system.gpu.kernel_overhead_s  # each kernel's work on top


@pytest.mark.parametrize("name", FIXTURES)
def test_decode_steps_costed_from_a_fit_equal_shape_inference(name, monkeypatch):
    model = _decoder(name)
    coster = NonExpertCoster(model, load_system("h200"), "bf16")
    inferred = []
    real = coster._work
    monkeypatch.setattr(coster, "_work", lambda shapes: inferred.append(shapes) or real(shapes))
    reference = NonExpertCoster(model, load_system("h200"), "bf16")
    for past in (8, 9):  # two steps inferred; the fit infers past 8 + 4096 and midway
        assert coster.cost(_step(model, name, past)) == reference._compute(_step(model, name, past))
    assert len(inferred) == 4
    for past in (10, 11, 40, 127, 600, 4104):
        assert coster.cost(_step(model, name, past)) == reference._compute(_step(model, name, past))
    assert len(inferred) == 4  # none of them inferred
    assert coster.cost(_step(model, name, 4105)) == reference._compute(_step(model, name, 4105))
    assert len(inferred) == 7  # beyond the fit: inferred, and a fit from past 9 on inferred at its end and midway
    assert coster.cost(_step(model, name, 8000)) == reference._compute(_step(model, name, 8000))
    assert len(inferred) == 7


def test_decode_steps_equal_shape_inference_while_a_sliding_window_fills_up():
    # gpt-oss layer 0 attends the last 8 keys: a step's cost bends when its past reaches 7 tokens
    model = _decoder("gpt_oss_fp32")
    config = json.loads((GENAI_DIR / "gpt_oss_fp32" / "genai_config.json").read_text())
    shapes = step_shapes(model, config)
    coster = NonExpertCoster(model, load_system("h200"), "bf16")
    inferred = []
    real = coster._work
    coster._work = lambda step_shapes: inferred.append(step_shapes) or real(step_shapes)
    reference = NonExpertCoster(model, load_system("h200"), "bf16")
    for past in (0, *range(3, 42)):  # the 3-token prompt, then a token a step
        step = shapes(3 if past == 0 else 1, past)
        assert coster.cost(step) == reference._compute(step), past
    assert len(inferred) < 40
