"""``MoESimulator.simulate_step`` (a forward step's layers at once) against the same calls made layer by layer,
and memoised layer summaries against the timelines laid out for them."""

from __future__ import annotations

import numpy as np
import pytest

import hw_model.simulator as simulator_module
from hw_model import load_system
from hw_model.errors import WorkloadError
from hw_model.policies import policy_names
from hw_model.settings import SimulationSettings
from hw_model.simulator import MoESimulator
from hw_model.traces import TraceKnobs, predicted_counts, synthetic_trace
from hw_model.workload import ExpertShape, MoELayerShape

LAYERS = [MoELayerShape(f"l{i}", 16, 4, ExpertShape(hidden=1024, ffn=512)) for i in range(4)]
GAP_S = 20e-6


def _trace():
    return synthetic_trace(len(LAYERS), 16, 4, 24, 40, TraceKnobs(skew=0.8, seed=5))


def _sim(policy: str) -> MoESimulator:
    # a small GPU pool so that residency, staging and prefetch copies all come into play
    return MoESimulator(load_system("paper", 4), LAYERS, policy, gpu_reserved_bytes=0.899 * 16e9)


def _without_wall_times(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "decision_time_median_s"}


@pytest.mark.parametrize("policy", policy_names())
def test_a_step_equals_the_same_invocations_made_layer_by_layer(policy):
    trace = _trace()
    stepped, single = _sim(policy), _sim(policy)
    rng_stepped, rng_single = np.random.default_rng(1), np.random.default_rng(1)
    prefill = trace.prefill_step_counts()
    latencies_stepped = list(stepped.simulate_step("prefill", prefill, gap_before_layer_s=GAP_S).latencies_s)
    latencies_single = []
    for layer in range(len(LAYERS)):
        single.advance_time_s(GAP_S)
        latencies_single.append(single.simulate_layer(layer, prefill[layer], "prefill").latency_s)
    for token in range(trace.prompt_tokens, trace.num_tokens):
        predictions = [
            predicted_counts(trace, layer + 1, token, 0.7, rng_stepped) if layer + 1 < len(LAYERS) else None
            for layer in range(len(LAYERS))
        ]
        step = stepped.simulate_step(
            "decode", trace.token_counts(token), gap_before_layer_s=GAP_S, predictions=predictions
        )
        latencies_stepped += step.latencies_s
        for layer in range(len(LAYERS)):
            single.advance_time_s(GAP_S)
            if layer + 1 < len(LAYERS):
                single.predict_next(layer + 1, predicted_counts(trace, layer + 1, token, 0.7, rng_single))
            latencies_single.append(
                single.simulate_layer(layer, trace.counts(layer, token, token + 1), "decode").latency_s
            )
    assert latencies_stepped == latencies_single
    assert _without_wall_times(stepped.summary()) == _without_wall_times(single.summary())


@pytest.mark.parametrize("policy", policy_names())
def test_memoised_layer_summaries_match_their_laid_out_timelines(policy):
    trace = _trace()
    sim = _sim(policy)
    sim.simulate_step("prefill", trace.prefill_step_counts())
    for token in range(trace.prompt_tokens, trace.num_tokens):
        for result in sim.simulate_step("decode", trace.token_counts(token)):
            timeline = result.timeline  # laid out now, with this invocation's experts
            assert result.latency_s == timeline.latency_s
            busy: dict[str, float] = {}
            for resource, start_s, end_s, _ in timeline.events:
                busy[resource] = busy.get(resource, 0.0) + (end_s - start_s)
            expected = result.busy_by_resource()
            for event in result.added_events:  # prefetch copies are not part of the layer's own timeline
                expected[event.resource] -= event.end_s - event.start_s
            assert busy.keys() == {r for r, s in expected.items() if s > 0 or r in busy}
            for resource, seconds in busy.items():
                assert seconds == pytest.approx(expected[resource], rel=1e-12, abs=1e-18), resource
            active = set(np.flatnonzero(trace.counts(result.layer_index, token, token + 1)).tolist())
            assert set(result.placement) == active


@pytest.mark.parametrize("policy", ["tp+lb+prefetch", "gpu-offload"])
def test_a_step_in_any_layer_order_equals_the_same_calls_one_by_one(policy):
    trace = _trace()
    order = [2, 0, 3, 1]  # layer 0 (where the prefetcher re-plans, here at every token) in the middle
    stepped, single = (
        MoESimulator.from_settings(
            SimulationSettings(ndp_units=4, policy=policy, prefetch_interval_tokens=1),
            LAYERS,
            gpu_reserved_bytes=0.899 * 16e9,
        )
        for _ in range(2)
    )
    for sim in (stepped, single):
        sim.simulate_step("prefill", trace.prefill_step_counts())
    for token in range(trace.prompt_tokens, trace.num_tokens):
        counts = trace.token_counts(token)[order]
        got = stepped.simulate_step("decode", counts, layers=order).latencies_s
        expected = [
            single.simulate_layer(layer, row, "decode").latency_s for layer, row in zip(order, counts, strict=True)
        ]
        assert got == expected
    assert _without_wall_times(stepped.summary()) == _without_wall_times(single.summary())


@pytest.mark.parametrize("policy", ["tp+lb+prefetch", "monde+cache"])
def test_a_step_naming_every_layer_equals_the_default_step_over_all_layers(policy):
    trace = _trace()
    default, named = _sim(policy), _sim(policy)
    every = list(range(len(LAYERS)))  # the default is a range: its rows are a slice of the per-layer arrays
    default.simulate_step("prefill", trace.prefill_step_counts())
    named.simulate_step("prefill", trace.prefill_step_counts(), layers=every)
    for token in range(trace.prompt_tokens, trace.num_tokens):
        got = default.simulate_step("decode", trace.token_counts(token)).latencies_s
        assert got == named.simulate_step("decode", trace.token_counts(token), layers=every).latencies_s
    assert _without_wall_times(default.summary()) == _without_wall_times(named.summary())


def test_a_result_read_later_does_not_see_the_callers_buffer_change():
    sim = _sim("tp+lb+prefetch")
    counts = np.zeros(16, dtype=np.int64)
    counts[[1, 5, 9, 12]] = 3
    results = [sim.simulate_layer(0, counts, "prefill") for _ in range(5)]
    result = next(r for r in results if not r.timeline_built)  # a memo hit: laid out when first read
    counts[:] = 0
    counts[[0, 2, 4, 6]] = 50  # the caller reuses its buffer before reading the timeline
    assert set(result.placement) == {1, 5, 9, 12}
    assert result.timeline.latency_s == result.latency_s


def test_step_rejects_bad_counts_and_layers():
    sim = _sim("tp+lb+prefetch")
    ones = np.ones((2, 16), dtype=np.int64)
    with pytest.raises(WorkloadError, match="at most once"):
        sim.simulate_step("decode", ones, layers=[1, 1])
    with pytest.raises(WorkloadError, match="out of range"):
        sim.simulate_step("decode", ones, layers=[3, 4])
    with pytest.raises(WorkloadError, match="shape"):
        sim.simulate_step("decode", np.ones((2, 17), dtype=np.int64), layers=[0, 1])
    with pytest.raises(WorkloadError, match="non-negative"):
        sim.simulate_step("decode", -ones, layers=[0, 1])
    with pytest.raises(WorkloadError, match="phase"):
        sim.simulate_step("warmup", ones, layers=[0, 1])


@pytest.mark.parametrize("scan_in_python", [64, 0])  # active experts listed in Python or found with numpy
def test_step_rejects_one_negative_count_and_tokens_beyond_a_narrow_layers_experts(monkeypatch, scan_in_python):
    monkeypatch.setattr(simulator_module, "_SCAN_IN_PYTHON", scan_in_python)
    one_negative = np.zeros((2, 16), dtype=np.int64)
    one_negative[1, 7] = -1
    with pytest.raises(WorkloadError, match="non-negative"):
        _sim("tp+lb+prefetch").simulate_step("decode", one_negative, layers=[0, 1])
    shape = ExpertShape(hidden=64, ffn=128)
    sim = MoESimulator(
        load_system("paper", 2), [MoELayerShape("wide", 8, 2, shape), MoELayerShape("narrow", 4, 2, shape)]
    )
    counts = np.zeros((2, 8), dtype=np.int64)
    counts[:, [1, 3]] = 1
    assert len(sim.simulate_step("decode", counts)) == 2  # within both layers' experts
    counts[1, 5] = 1
    with pytest.raises(WorkloadError, match="narrow: tokens routed beyond its 4 experts"):
        sim.simulate_step("decode", counts)
    counts[0, 6] = 1  # the wide layer may use all 8
    with pytest.raises(WorkloadError, match="narrow"):
        sim.simulate_step("decode", counts)


class _Forgetful(dict):
    """A memo that never remembers: every decision is computed afresh."""

    def __setitem__(self, key, value) -> None:
        return None


WIDE = [MoELayerShape(f"w{i}", 32, 8, ExpertShape(hidden=1024, ffn=512)) for i in range(4)]


@pytest.mark.parametrize("policy", policy_names())
def test_memoised_decisions_equal_decisions_made_afresh(policy):
    # top-8 of 32 experts on 2 units: several selected experts share a home unit, so the memoised choices must
    # pick the same ones among equals as the rule does
    trace = synthetic_trace(len(WIDE), 32, 8, 24, 40, TraceKnobs(skew=0.8, seed=6))
    memoised, afresh = (
        MoESimulator(load_system("paper", 2), WIDE, policy, gpu_reserved_bytes=0.899 * 16e9) for _ in range(2)
    )
    afresh._state.pack_memo = _Forgetful()
    afresh._state.layout_memo = _Forgetful()
    afresh._state.item_memo = _Forgetful()  # tp+lb's summaries by items, whose decisions are recorded when read
    prefill = trace.prefill_step_counts()
    results = [sim.simulate_step("prefill", prefill, gap_before_layer_s=GAP_S) for sim in (memoised, afresh)]
    assert results[0].latencies_s == results[1].latencies_s
    for token in range(trace.prompt_tokens, trace.num_tokens):
        steps = [
            sim.simulate_step("decode", trace.token_counts(token), gap_before_layer_s=GAP_S)
            for sim in (memoised, afresh)
        ]
        assert steps[0].latencies_s == steps[1].latencies_s
        assert [dict(r.placement) for r in steps[0]] == [dict(r.placement) for r in steps[1]]
    summaries = [_without_wall_times(sim.summary()) for sim in (memoised, afresh)]
    busy = [summary.pop("busy_s") for summary in summaries]
    assert summaries[0] == summaries[1]
    # busy time is added per memoised summary (count x seconds), so only the summation order differs
    assert busy[0] == pytest.approx(busy[1], rel=1e-12)
