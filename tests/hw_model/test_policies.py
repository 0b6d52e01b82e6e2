"""Policies on single layer invocations: what each one places where, and the lower bound holding."""

from __future__ import annotations

import numpy as np
import pytest

from hw_model import load_system
from hw_model.errors import SettingsError, WorkloadError
from hw_model.layout import InvocationLayout, LayoutState
from hw_model.models import get_model
from hw_model.policies import POLICIES
from hw_model.settings import SimulationSettings
from hw_model.simulator import MoESimulator

QWEN = get_model("qwen3-30b-a3b")
MIXTRAL = get_model("mixtral-8x7b")


def _sim(policy: str, units: int = 4, model=QWEN, **kw) -> MoESimulator:
    return MoESimulator(load_system("paper", units), model.moe_layer_shapes()[:2], policy, **kw)


def _random_counts(rng: np.random.Generator, model, tokens: int) -> np.ndarray:
    counts = np.zeros(model.num_experts, dtype=np.int64)
    for _ in range(tokens):
        counts[rng.choice(model.num_experts, model.top_k, replace=False)] += 1
    return counts


@pytest.mark.parametrize("model", [QWEN, MIXTRAL], ids=lambda m: m.name)
def test_lower_bound_is_below_every_policy(model):
    rng = np.random.default_rng(3)
    sims = {p: _sim(p, model=model) for p in POLICIES}
    for tokens in (1, 1, 3, 64, 512):
        counts = _random_counts(rng, model, tokens)
        phase = "decode" if tokens == 1 else "prefill"
        latency = {p: s.simulate_layer(0, counts, phase).latency_s for p, s in sims.items()}
        for policy, value in latency.items():
            assert latency["lower-bound"] <= value * (1 + 1e-9), policy


def test_placement_covers_exactly_the_active_experts():
    rng = np.random.default_rng(4)
    counts = _random_counts(rng, QWEN, 5)
    for policy in POLICIES:
        result = _sim(policy).simulate_layer(0, counts, "prefill")
        assert set(result.placement) == set(np.flatnonzero(counts).tolist()), policy


def test_tp_splits_every_expert_evenly_over_all_units():
    counts = np.zeros(QWEN.num_experts, dtype=int)
    counts[[3, 70]] = [2, 1]
    result = _sim("tp", units=4).simulate_layer(0, counts, "prefill")
    busy = [result.busy_s(f"ndp{u}") for u in range(4)]
    assert busy == pytest.approx([busy[0]] * 4)
    assert set(result.placement.values()) == {"ndp"}
    assert result.busy_s("gpu") > 0  # only the combine kernel runs on the GPU


def test_expert_per_unit_puts_expert_on_its_home_unit():
    counts = np.zeros(QWEN.num_experts, dtype=int)
    counts[[5, 6]] = 1
    result = _sim("ndp-expert-per-unit", units=4).simulate_layer(0, counts, "decode")
    assert dict(result.placement) == {5: "ndp1", 6: "ndp2"}
    assert result.busy_s("ndp0") == 0 and result.busy_s("ndp1") > 0


def test_monde_moves_the_hottest_experts_and_only_whole_experts():
    rng = np.random.default_rng(5)
    counts = _random_counts(rng, MIXTRAL, 512)
    result = _sim("monde", model=MIXTRAL).simulate_layer(0, counts, "prefill")
    on_gpu = [e for e, where in result.placement.items() if where == "gpu"]
    on_ndp = [e for e, where in result.placement.items() if where != "gpu"]
    assert on_gpu, "prefill-sized work should pull hot experts to the GPU"
    if on_ndp:
        assert min(counts[on_gpu]) >= max(counts[on_ndp])
    assert all(where == "gpu" or where.startswith("ndp") and where != "ndp" for where in result.placement.values())


def test_tp_ablation_and_the_packer_use_the_gpu_in_prefill():
    rng = np.random.default_rng(6)
    counts = _random_counts(rng, MIXTRAL, 512)
    for policy in ("tp", "tp+lb"):
        result = _sim(policy, model=MIXTRAL).simulate_layer(0, counts, "prefill")
        assert "gpu" in result.placement.values(), policy
        assert "ndp" in result.placement.values(), policy


def test_gpu_offload_copies_misses_and_hits_its_cache():
    counts = np.zeros(QWEN.num_experts, dtype=int)
    counts[[1, 2]] = 1
    sim = _sim("gpu-offload")
    first = sim.simulate_layer(0, counts, "decode")
    second = sim.simulate_layer(0, counts, "decode")
    assert first.busy_s("pcie") > 0 and second.busy_s("pcie") == 0
    assert second.latency_s < first.latency_s
    assert sim.summary()["cache_hits"] == 2


def test_policies_needing_ndp_refuse_zero_units_and_unknown_policy_is_refused():
    with pytest.raises(WorkloadError, match="NDP unit"):
        _sim("tp", units=0)
    with pytest.raises(SettingsError, match="unknown policy"):
        _sim("fastest")
    result = _sim("gpu-offload", units=0).simulate_layer(0, np.eye(QWEN.num_experts, dtype=int)[0], "decode")
    assert result.placement == {0: "gpu"}


@pytest.mark.parametrize("policy", ["tp+lb+prefetch", "gpu-offload"])
def test_experts_the_prefetcher_holds_stay_out_of_the_staging_cache(policy):
    # an expert the prefetcher holds (or adopts from an on-demand copy) is in GPU memory once: it must not also
    # take staging space or count as a cache miss, so the cache loads only the copies the prefetcher did not adopt
    rng = np.random.default_rng(11)
    layers = QWEN.moe_layer_shapes()[:4]
    system = load_system("paper", 4)
    # prefill copies not adopted: the staging cache then also serves hits (what this test checks both of)
    sim = MoESimulator(system, layers, SimulationSettings(hw=system, policy=policy, adopt_prefill_copies=0))
    sim.simulate_step("prefill", np.stack([_random_counts(rng, QWEN, 256) for _ in range(4)]))
    for _ in range(96):
        sim.simulate_step("decode", np.stack([_random_counts(rng, QWEN, 1) for _ in range(4)]))
    summary = sim.summary()
    copies = round(summary["on_demand_weight_bytes"] / layers[0].expert.weight_bytes())
    assert summary["prefetch_hits"] > 0 and summary["cache_hits"] > 0  # both kinds of residency were used
    assert summary["cache_misses"] <= copies - summary["prefetch_adopted_from_misses"]


def _best_single_split_s(sim: MoESimulator, layer: int, active: list[int], resident: set[int]) -> float:
    """The best sliced-layout placement of one-token experts with at most one split, by brute force over how many
    resident and other experts run on the GPU and which of the rest is split (any side, k in 2..8)."""
    held = [e for e in active if e in resident]
    other = [e for e in active if e not in resident]
    splits = [k for k in range(2, 9)] + [-k for k in range(2, 9)]
    best = float("inf")
    for on_held in range(len(held) + 1):
        for on_other in range(len(other) + 1):
            options = [None] + [(True, k) for k in splits if on_held < len(held)]
            options += [(False, k) for k in splits if on_other < len(other)]
            for split in options:
                out = InvocationLayout(sim.context, LayoutState(), layer, active, [1] * len(active))
                for group, count, res in ((held, on_held, True), (other, on_other, False)):
                    for i, e in enumerate(group):
                        if i < count:
                            out.to_gpu(e, 1, res)
                        elif split is not None and split[0] == res and i == count:
                            out.split(e, 1, split[1], res)
                        else:
                            out.sliced([e], [1])
                best = min(best, out.finish().latency_s)
    return best


@pytest.mark.parametrize("held", [5, 6])
def test_ours_splits_one_expert_to_end_a_decode_layer_as_soon_as_any_single_split_can(held: int) -> None:
    """Qwen3-30B-A3B at 4 units, 8 one-token experts, ``held`` of them resident: whole experts alone leave the GPU or
    the units idle at the end; ours' balancing split ends the layer as soon as the best placement with at most one
    split (brute force), and sooner than the packer's whole experts."""
    active = list(range(0, 16, 2))
    counts = np.zeros(QWEN.num_experts, dtype=int)
    counts[active] = 1
    latency = {}
    for knob in (1, 0):
        settings = SimulationSettings(ndp_units=4, policy="tp+lb+prefetch", balance_split=knob)
        sim = MoESimulator.from_settings(settings, QWEN.moe_layer_shapes()[:2], gpu_reserved_bytes=0)
        sim._state.prefetcher.resident_sets[1] = set(active[:held])  # layer 1: no re-plan before it
        result = sim.simulate_layer(1, counts, "decode")
        latency[knob] = result.latency_s
        splits = [e for e, where in result.placement.items() if where == "split"]
        assert len(splits) == knob
    assert latency[1] == pytest.approx(_best_single_split_s(sim, 1, active, set(active[:held])), rel=1e-12)
    assert latency[1] < latency[0] * 0.99


@pytest.mark.parametrize("tokens", [1, 3, 64, 512])
def test_ours_balancing_split_never_lengthens_an_invocation(tokens: int) -> None:
    """The split is kept only where the laid-out invocation ends sooner (prefill-sized ones screen the candidates by
    the packer's objective first): on fresh simulators, ours is never slower than ours without it."""
    rng = np.random.default_rng(11 + tokens)
    phase = "decode" if tokens == 1 else "prefill"
    for model in (QWEN, MIXTRAL):
        counts = _random_counts(rng, model, tokens)
        latency = {}
        for knob in (0, 1):
            settings = SimulationSettings(ndp_units=4, policy="tp+lb+prefetch", balance_split=knob)
            sim = MoESimulator.from_settings(settings, model.moe_layer_shapes()[:2], gpu_reserved_bytes=0)
            latency[knob] = sim.simulate_layer(1, counts, phase).latency_s
        assert latency[1] <= latency[0], model.name
