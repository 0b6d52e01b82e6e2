"""The simulator's public behaviour: API, timeline sanity, drift-based recomputation, prefetch, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from hw_model import load_system
from hw_model.errors import SettingsError, WorkloadError
from hw_model.models import get_model
from hw_model.settings import DEFAULT_POLICY, SimulationSettings
from hw_model.simulator import MoESimulator, gpu_op_time_s
from hw_model.traces import TraceKnobs, synthetic_trace

OLMOE = get_model("olmoe-1b-7b")


def _sim(policy: str = DEFAULT_POLICY, **knobs) -> MoESimulator:
    return MoESimulator.from_settings(SimulationSettings(ndp_units=4, policy=policy, **knobs), OLMOE.moe_layer_shapes())


def _one_hot(experts: list[int]) -> np.ndarray:
    counts = np.zeros(OLMOE.num_experts, dtype=int)
    counts[experts] = 1
    return counts


def test_default_policy_is_the_complete_framework():
    sim = MoESimulator(load_system("paper"), OLMOE.moe_layer_shapes())
    assert sim.policy == "tp+lb+prefetch"


def test_events_never_overlap_on_one_resource_and_end_by_the_layer_latency():
    trace = synthetic_trace(OLMOE.moe_layers, OLMOE.num_experts, OLMOE.top_k, 64, 16, TraceKnobs(skew=0.8))
    for policy in ("monde", "tp", "tp+lb", "tp+lb+prefetch", "gpu-offload"):
        sim = _sim(policy)
        results = [sim.simulate_layer(layer, trace.prefill_counts(layer), "prefill") for layer in range(4)]
        results += [sim.simulate_layer(0, trace.counts(0, t, t + 1), "decode") for t in range(64, 80)]
        for result in results:
            by_resource: dict[str, list] = {}
            for event in result.events:
                assert 0 <= event.start_s <= event.end_s <= result.latency_s * (1 + 1e-12)
                by_resource.setdefault(event.resource, []).append((event.start_s, event.end_s))
            for spans in by_resource.values():
                spans.sort()
                for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
                    assert start >= end - 1e-15


def test_placement_is_reused_until_the_smoothed_histogram_drifts():
    # smoothing 0.1: after k invocations of a disjoint histogram the smoothed one has moved 2 * (1 - 0.9**k)
    # in L1 from the plan's: 0.19 (reuse at threshold 0.25), then 0.361 (recompute)
    # the drift rule alone (tp+lb keeps nothing resident: every plan that moves an expert copies it)
    sim = _sim("tp+lb", drift_threshold=0.25, drift_smoothing=0.1, replan_on_residency=0, replan_on_copies=0)
    first = _one_hot([0, 1, 2, 3, 4, 5, 6, 7])
    other = _one_hot([10, 11, 12, 13, 14, 15, 16, 17])
    recomputed = [sim.simulate_layer(0, c, "decode").extra["recomputed"] for c in (first, first, other, other)]
    assert recomputed == [1.0, 0.0, 0.0, 1.0]
    summary = sim.summary()
    assert (summary["placement_recomputations"], summary["placement_reuses"]) == (2, 2)


def test_a_reused_plan_runs_resident_experts_on_the_gpu():
    sim = _sim("tp+lb+prefetch", drift_threshold=0.5, replan_on_residency=0, replan_on_copies=0)
    sim.simulate_layer(0, _one_hot([0, 1, 2, 3, 4, 5, 6, 7]), "decode")
    prefetcher = sim._state.prefetcher
    prefetcher.resident_sets[0].add(9)  # expert 9 of layer 0 became resident
    result = sim.simulate_layer(0, _one_hot([0, 1, 2, 3, 4, 5, 6, 9]), "decode")
    assert result.extra["recomputed"] == 0.0
    assert result.placement[9] == "gpu"
    assert not any(e.resource == "pcie" and e.label == "e9 weights" for e in result.events)


def test_a_plan_is_replanned_when_residency_disagrees_with_it():
    """replan_on_residency: the same drift-free histogram, but an active expert became resident after the plan put it
    on the NDP units: re-planned (with the knob off the plan is reused, as above)."""
    sim = _sim("tp+lb+prefetch", drift_threshold=0.5)
    first = sim.simulate_layer(0, _one_hot([0, 1, 2, 3, 4, 5, 6, 7]), "decode")
    assert first.placement[7] == "ndp"
    again = sim.simulate_layer(0, _one_hot([0, 1, 2, 3, 4, 5, 6, 7]), "decode")
    assert again.extra["recomputed"] == 0.0  # residency agrees with the plan: reused
    sim._state.prefetcher.resident_sets[0].add(7)
    result = sim.simulate_layer(0, _one_hot([0, 1, 2, 3, 4, 5, 6, 7]), "decode")
    assert result.extra["recomputed"] == 1.0
    assert result.placement[7] == "gpu"


def test_a_plan_that_copied_experts_is_not_reused_for_other_experts():
    """replan_on_copies: a plan that copied experts is re-made for an invocation that does not select them, within
    the drift threshold and with residency agreeing (nothing resident): reused, it would copy none of the new experts
    and run all of them on the NDP units."""
    kept = _sim("tp+lb", drift_threshold=10.0, replan_on_copies=0)
    fresh = _sim("tp+lb", drift_threshold=10.0)
    first = _one_hot([0, 1, 2, 3, 4, 5, 6, 7])
    other = _one_hot([10, 11, 12, 13, 14, 15, 16, 17])
    for sim in (kept, fresh):
        planned = sim.simulate_layer(0, first, "decode")
        assert "gpu" in planned.placement.values()  # the packer copies some experts to the GPU
    reused = kept.simulate_layer(0, other, "decode")
    remade = fresh.simulate_layer(0, other, "decode")
    assert reused.extra["recomputed"] == 0.0 and set(reused.placement.values()) == {"ndp"}
    assert remade.extra["recomputed"] == 1.0
    assert sorted(remade.placement.values()) == sorted(planned.placement.values())  # the same items: the same plan
    assert remade.latency_s < reused.latency_s


def test_prefetch_makes_popular_experts_resident_and_reports_hits_and_bytes():
    trace = synthetic_trace(
        OLMOE.moe_layers, OLMOE.num_experts, OLMOE.top_k, 128, 64, TraceKnobs(skew=1.2, shift_at=None)
    )
    sim = _sim("tp+lb+prefetch")
    for layer in range(OLMOE.moe_layers):
        sim.simulate_layer(layer, trace.prefill_counts(layer), "prefill")
    sim.advance_time_s(1.0)  # idle PCIe time (attention etc.) lets the first copies complete
    for token in range(128, 192):
        for layer in range(OLMOE.moe_layers):
            sim.simulate_layer(layer, trace.counts(layer, token, token + 1), "decode")
    summary = sim.summary()
    assert summary["prefetch_hits"] > 0
    assert summary["prefetch_bytes_moved"] > 0
    assert summary["prefetch_hits"] + summary["prefetch_misses"] == 64 * OLMOE.moe_layers * OLMOE.top_k
    resident_bytes = summary["resident_experts"] * OLMOE.expert.weight_bytes()
    assert resident_bytes <= summary["residency_cap_bytes"]


def test_prefetch_beats_no_prefetch_on_a_skewed_trace():
    trace = synthetic_trace(
        OLMOE.moe_layers, OLMOE.num_experts, OLMOE.top_k, 128, 64, TraceKnobs(skew=1.2, shift_at=None)
    )
    totals = {}
    for policy in ("tp+lb", "tp+lb+prefetch"):
        sim = _sim(policy)
        total = sum(sim.simulate_layer(layer, trace.prefill_counts(layer), "prefill").latency_s for layer in range(16))
        for token in range(128, 192):
            sim.advance_time_s(1e-4)
            total += sum(
                sim.simulate_layer(layer, trace.counts(layer, token, token + 1), "decode").latency_s
                for layer in range(16)
            )
        totals[policy] = total
    assert totals["tp+lb+prefetch"] < totals["tp+lb"]


def test_same_inputs_same_results():
    trace = synthetic_trace(4, OLMOE.num_experts, OLMOE.top_k, 32, 8, TraceKnobs(skew=0.5, seed=3))
    runs = []
    for _ in range(2):
        sim = _sim()
        runs.append(
            [
                sim.simulate_layer(layer, trace.counts(layer, t, t + 1), "decode").latency_s
                for t in range(32, 40)
                for layer in range(4)
            ]
        )
    assert runs[0] == runs[1]


def test_bad_input_is_refused():
    sim = _sim()
    with pytest.raises(WorkloadError, match="phase"):
        sim.simulate_layer(0, _one_hot([1]), "train")
    with pytest.raises(WorkloadError, match="out of range"):
        sim.simulate_layer(99, _one_hot([1]), "decode")
    with pytest.raises(WorkloadError, match="expert token counts"):
        sim.simulate_layer(0, [1, 2, 3], "decode")
    with pytest.raises(SettingsError, match="residency_fraction"):
        _sim(residency_fraction=2.0)


def test_gpu_op_time_is_positive_and_grows_with_bytes():
    system = load_system("paper")
    assert 0 < gpu_op_time_s(system, 1e6, 1e6, "bf16") < gpu_op_time_s(system, 1e6, 1e9, "bf16")


@pytest.mark.parametrize("size", [1, 2, 7, 8, 101])
def test_median_equals_the_standard_librarys(size):
    import statistics

    from hw_model.simulator import median

    values = np.random.default_rng(size).random(size).tolist()
    assert median(values) == statistics.median(values)


def test_a_dimm_too_small_for_the_experts_is_flagged_with_readable_sizes():
    import dataclasses

    paper = load_system("paper", 4)
    small = dataclasses.replace(paper, ndp_unit=dataclasses.replace(paper.ndp_unit, memory_capacity_bytes=2**20))
    sim = MoESimulator(small, OLMOE.moe_layer_shapes()[:1], "tp")
    # one OLMoE layer: 64 experts of gate, up and down 2048 x 1024 in bf16, sliced over 4 DIMMs: 192.0 MiB each
    assert not sim.capacity.feasible
    assert sim.capacity.reason == "experts need 192.0 MiB per DIMM, a DIMM holds 1.0 MiB (4 DIMMs)"
