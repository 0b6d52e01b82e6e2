"""Each baseline's defining behaviour, the policy registry, DIMM capacity, copy-NDP bandwidth sharing and
weight formats; expectations are hand-computed from the preset's numbers, never from the code under test."""

from __future__ import annotations

import numpy as np
import pytest

from hw_model import load_system
from hw_model.errors import SettingsError, WorkloadError
from hw_model.models import get_model
from hw_model.policies import (
    ExpertCosts,
    Policy,
    get_policy,
    load_aware_order,
    policy_names,
    register,
)
from hw_model.scheduler import PlacementProblem
from hw_model.scheduler import best_prefix as scheduler_best_prefix
from hw_model.settings import SimulationSettings
from hw_model.simulator import MoESimulator
from hw_model.timeline import build_layer_timeline
from hw_model.workload import ExpertShape, MoELayerShape, WeightFormat

QWEN = get_model("qwen3-30b-a3b")
MIXTRAL = get_model("mixtral-8x7b")
# paper preset, DDR4-3200 by hand: a rank streams 25.6 GB/s x (1 - (550 + 13.75) / 7800)
DDR4_ETA = 1 - 563.75 / 7800
CHANNEL_BPS = 25.6e9 * DDR4_ETA
DIMM_BPS = 2 * CHANNEL_BPS


def _sim(policy: str, units: int = 4, model=QWEN, layers: int = 2, residency_fraction=None, **kw) -> MoESimulator:
    knobs = {} if residency_fraction is None else {"residency_fraction": residency_fraction}
    settings = SimulationSettings(hw=load_system("paper", units), policy=policy, **knobs)  # 0 units: GPU only
    return MoESimulator.from_settings(settings, model.moe_layer_shapes()[:layers], **kw)


def test_every_registered_policy_declares_its_protocol_fields():
    names = policy_names()
    assert names and len(set(names)) == len(names)
    for name in names:
        policy = get_policy(name)
        assert policy.name == name and policy.role in ("baseline", "ours", "extension", "ablation", "bound")
        assert policy.description and policy.source
    assert len(policy_names("ours")) == 1
    assert set(policy_names("baseline")) >= {"gpu-offload", "ndp-expert-per-unit", "monde", "monde+cache", "duplex"}
    with pytest.raises(SettingsError, match="unknown policy"):
        get_policy("fastest")


@pytest.mark.parametrize(
    ("name", "role", "error"),
    [("monde", "baseline", "twice"), ("no-role-policy", "favourite", "role")],
    ids=["duplicate-name", "unknown-role"],
)
def test_registering_a_duplicate_or_roleless_policy_is_refused(name, role, error):
    policy = type(name, (Policy,), {"name": name, "role": role, "description": "x", "place": lambda self, *a: None})
    with pytest.raises(TypeError, match=error):
        register(policy)
    assert name not in policy_names() or not isinstance(get_policy(name), policy)  # nothing was registered


def test_monde_moves_the_hottest_expert_of_the_busiest_dimm_first():
    # units' loads 9 and 5: unit 0's experts go first (lowest index on ties), then unit 1's once it is busier
    ndp = np.array([[3.0, 0.0], [0.0, 5.0], [3.0, 0.0], [3.0, 0.0]])
    tokens = np.ones(4, dtype=int)
    assert load_aware_order(ndp, tokens, np.zeros(4, dtype=bool)).tolist() == [0, 2, 1, 3]
    # a hotter expert on the busiest unit goes before a colder one
    assert load_aware_order(ndp, np.array([1, 1, 1, 4]), np.zeros(4, dtype=bool)).tolist()[0] == 3
    # experts already resident on the GPU (no copy) come first
    assert load_aware_order(ndp, tokens, np.array([False, True, False, False])).tolist()[0] == 1


def _items(ndp, copy, transfer, gpu, staged) -> dict[str, np.ndarray]:
    arrays = {"ndp": ndp, "copy": copy, "transfer": transfer, "gpu": gpu, "staged": staged}
    return {key: np.asarray(values, dtype=float) for key, values in arrays.items()}


def best_prefix(items: dict[str, np.ndarray], order: np.ndarray, base_s: float, staging_cap_bytes: float) -> int:
    """MoNDE's prefix over the plain objective: every unit starts ``base_s`` busy, kernels and copy reads summed."""
    units = items["ndp"].shape[1]
    problem = PlacementProblem(
        items["ndp"],
        items["gpu"],
        items["transfer"],
        items["staged"],
        staging_cap_bytes,
        unit_base_s=np.full(units, base_s),
        copy_unit_s=items["copy"],
    )
    return scheduler_best_prefix(problem, order.tolist())


def test_monde_moves_the_prefix_with_the_shortest_makespan_within_the_staging_cap():
    # units' NDP loads 6 and 3; moving expert 0 leaves unit 0 with 6 - 4 + 1 = 3 (its copy's DRAM time), PCIe 2,
    # GPU 1: makespan 3; moving experts 0 and 1 too: PCIe 4; so one move (k = 1) beats none (6) and two (4)
    items = _items([[4, 0], [0, 3], [2, 0]], [[1, 0], [0, 1], [1, 0]], [2, 2, 2], [1, 1, 1], [10, 10, 10])
    order = np.array([0, 1, 2])
    assert best_prefix(items, order, 0.0, 100.0) == 1
    # the activations' transfer (base 5) keeps the units busy longer (11 and 8): one move leaves 8 on both,
    # two leave 8 on unit 0, all three leave 11 - 3 - 1 = 7 on unit 0 with 6 on PCIe: all three move
    assert best_prefix(items, order, 5.0, 100.0) == 3
    assert best_prefix(items, order, 0.0, 5.0) == 0  # one copy (10 B) exceeds the staging cap
    # without NDP units everything moves: the shortest prefix is all of them, even over the cap
    no_units = _items(np.zeros((3, 0)), np.zeros((3, 0)), [2, 2, 2], [1, 1, 1], [10, 10, 10])
    assert best_prefix(no_units, order, 0.0, 100.0) == 1
    assert best_prefix(no_units, order, 0.0, 5.0) == 3


def test_monde_order_and_prefix_agree_with_a_brute_force_on_random_invocations():
    rng = np.random.default_rng(11)
    for _ in range(300):
        n, units = int(rng.integers(1, 12)), int(rng.integers(1, 7))
        whole = rng.random() < 0.5
        resident = rng.random(n) < 0.3
        tokens = rng.integers(1, 4, n)
        ndp, copy = np.zeros((n, units)), np.zeros((n, units))
        for i in range(n):
            home = int(rng.integers(units))
            ndp[i, home if whole else slice(None)] = rng.random()
            copy[i, home] = 0.0 if resident[i] else 0.1 * rng.random()
        items = _items(ndp, copy, np.where(resident, 0.0, 0.3), rng.random(n), np.where(resident, 0.0, 1.0))
        order = load_aware_order(ndp, tokens, resident)
        assert isinstance(order, np.ndarray) and order.dtype == np.int64
        assert sorted(order.tolist()) == list(range(n))
        assert order[: resident.sum()].tolist() == sorted(np.flatnonzero(resident).tolist(), key=lambda i: -tokens[i])
        cap = float(rng.integers(1, n + 1))
        spans = []
        for k in range(n + 1):
            moved = order[:k].tolist()
            unit_left = max(
                0.5 + sum(ndp[i, u] for i in range(n)) - sum(ndp[i, u] - copy[i, u] for i in moved)
                for u in range(units)
            )
            span = max(sum(items["transfer"][moved]), sum(items["gpu"][moved]), unit_left)
            spans.append(span if sum(items["staged"][moved]) <= cap else np.inf)
        assert best_prefix(items, order, 0.5, cap) == spans.index(min(spans))


def test_monde_moves_whole_experts_only():
    rng = np.random.default_rng(5)
    counts = np.bincount(rng.integers(0, MIXTRAL.num_experts, 1024), minlength=MIXTRAL.num_experts)
    result = _sim("monde", model=MIXTRAL).simulate_layer(0, counts, "prefill")
    assert "gpu" in result.placement.values()
    assert all(where == "gpu" or (where.startswith("ndp") and where != "ndp") for where in result.placement.values())


def test_monde_cache_keeps_moved_experts_and_monde_does_not():
    counts = np.zeros(MIXTRAL.num_experts, dtype=int)
    counts[[0, 1, 2, 3]] = [300, 250, 200, 150]
    for policy, copies_again in (("monde", True), ("monde+cache", False)):
        sim = _sim(policy, model=MIXTRAL, layers=1)
        first = sim.simulate_layer(0, counts, "prefill")
        second = sim.simulate_layer(0, counts, "prefill")
        moved = [e for e, where in first.placement.items() if where == "gpu"]
        assert moved, policy
        copies = [e for e in second.events if e.resource == "pcie" and e.label.endswith("weights")]
        assert bool(copies) == copies_again, policy
    assert sim.summary()["cache_hits"] >= len(moved)


def test_duplex_sends_experts_above_the_ndp_ridge_point_to_the_gpu():
    # ridge = 512 GFLOP/s / DIMM bandwidth = 10.78 FLOP/B; a bf16 expert does `tokens` FLOP per weight byte
    ridge = 512e9 / DIMM_BPS
    assert ridge == pytest.approx(10.78, abs=0.01)
    counts = np.zeros(QWEN.num_experts, dtype=int)
    counts[[3, 4]] = [11, 10]
    result = _sim("duplex").simulate_layer(0, counts, "prefill")
    assert dict(result.placement) == {3: "gpu", 4: "ndp"}


def test_gpu_offload_runs_everything_on_the_gpu_with_the_prefetcher():
    sim = _sim("gpu-offload")
    counts = np.zeros(QWEN.num_experts, dtype=int)
    counts[[1, 2, 3]] = 4
    result = sim.simulate_layer(0, counts, "prefill")
    assert set(result.placement.values()) == {"gpu"}
    assert "prefetch_hit_rate" in sim.summary()


def test_dimm_capacity_is_enforced():
    # Mixtral bf16 experts: 32 layers x 8 x 3 x 4096 x 14336 x 2 B = 90.2 GB; 2 DIMMs of 32 GB cannot hold them
    total = 32 * 8 * 3 * 4096 * 14336 * 2
    two = _sim("tp+lb+prefetch", units=2, model=MIXTRAL, layers=32)
    assert not two.capacity.feasible and "per DIMM" in two.capacity.reason
    assert two.capacity.dimm_bytes_needed == pytest.approx(total / 2)
    assert not two.summary()["feasible"]
    assert _sim("tp+lb+prefetch", units=4, model=MIXTRAL, layers=32).capacity.feasible


def test_one_gpu_pool_is_shared_by_residents_and_staging():
    pool = 0.9 * 16e9 - 2e9
    sim = _sim("tp+lb+prefetch", gpu_reserved_bytes=2e9, residency_fraction=0.5)
    assert sim.gpu_pool_bytes == pytest.approx(pool)
    assert sim.residency_cap_bytes + sim.staging_cap_bytes == pytest.approx(pool)
    assert sim.residency_cap_bytes == pytest.approx(pool / 2)
    no_residents = _sim("monde", gpu_reserved_bytes=2e9)
    assert (no_residents.residency_cap_bytes, no_residents.staging_cap_bytes) == (0.0, pytest.approx(pool))


def test_a_copy_from_one_dimm_is_channel_capped_and_from_all_dimms_pcie_capped():
    costs = ExpertCosts(load_system("paper", 4))
    expert = QWEN.expert
    size = 3 * 2048 * 768 * 2
    assert costs.copy_bandwidth(1) == pytest.approx(CHANNEL_BPS)
    assert costs.copy_bandwidth(4) == pytest.approx(55e9)
    assert costs.transfer_s(expert, 1) == pytest.approx(10e-6 + size / CHANNEL_BPS)
    # each of the 4 source DIMMs gives up a quarter of the bytes at its NDP streaming bandwidth
    assert costs.copy_read_s(expert, 4) == pytest.approx(size / 4 / DIMM_BPS)


def test_copy_reads_delay_the_ndp_unit_streaming_the_same_dimm():
    system = load_system("paper", 2)
    layer = MoELayerShape("l", 8, 2, ExpertShape(hidden=64, ffn=64))
    jobs = [[("e0", 1e-3)], [("e1", 1e-3)]]
    alone = build_layer_timeline(system, layer, 1, jobs, [1, 1], [], False, [0.5e-3, 0.5e-3])
    shared = build_layer_timeline(system, layer, 1, jobs, [1, 1], [], False, [3e-3, 0.5e-3])
    ends = [max(e.end_s for e in t.events if e.resource == "ndp0") for t in (alone, shared)]
    start = min(e.start_s for e in alone.events if e.resource == "ndp0")
    assert ends[0] == pytest.approx(start + 1e-3) and ends[1] == pytest.approx(start + 3e-3)
    assert shared.latency_s > alone.latency_s


def test_int4_weights_take_half_a_byte_plus_block_scales():
    assert WeightFormat("int4").bytes_per_weight == pytest.approx(0.5 + 2 / 32)
    assert WeightFormat("int8", block_size=128).bytes_per_weight == pytest.approx(1 + 2 / 128)
    assert WeightFormat("fp32").bytes_per_weight == 4.0 and WeightFormat("bfloat16").bytes_per_weight == 2.0
    with pytest.raises(WorkloadError, match="weight dtype"):
        WeightFormat("int3")
    sim = _sim("gpu-offload", weight_format="int4", quant_block_size=64)
    assert sim.layers[0].expert.weight_bytes() == pytest.approx(3 * 2048 * 768 * (0.5 + 2 / 64))


def test_quantized_weights_make_memory_bound_ndp_kernels_faster():
    counts = np.zeros(QWEN.num_experts, dtype=int)
    counts[[1, 2]] = 1
    bf16 = _sim("ndp-expert-per-unit").simulate_layer(0, counts, "decode")
    int4 = _sim("ndp-expert-per-unit", weight_format="int4").simulate_layer(0, counts, "decode")
    assert int4.busy_s("ndp1") < 0.4 * bf16.busy_s("ndp1")


def test_lookahead_copies_the_predicted_experts_and_runs_them_without_a_copy():
    sim = _sim("tp+lb+prefetch+lookahead", residency_fraction=0.0)
    counts = np.zeros(QWEN.num_experts, dtype=int)
    counts[[3, 70]] = 1
    sim.advance_time_s(1.0)
    sim.simulate_layer(0, counts, "decode")
    sim.predict_next(1, counts)
    sim.advance_time_s(1.0)  # a long idle window: both predicted copies complete
    result = sim.simulate_layer(1, counts, "decode")
    # both run on the GPU from their copies (one of them may have part of its columns split off to the NDP units)
    assert sorted([result.placement[3], result.placement[70]]) in (["gpu", "gpu"], ["gpu", "split"])
    assert not any(e.resource == "pcie" and e.label.endswith("weights") for e in result.events)
    # without the hint the same invocation copies no expert whole and keeps them on the NDP units (but for a split)
    plain = _sim("tp+lb+prefetch", residency_fraction=0.0)
    plain.simulate_layer(0, counts, "decode")
    assert set(plain.simulate_layer(1, counts, "decode").placement.values()) <= {"ndp", "split"}


def test_lookahead_starts_no_copy_that_cannot_finish_before_its_layer():
    sim = _sim("tp+lb+prefetch+lookahead", residency_fraction=0.0)
    counts = np.zeros(QWEN.num_experts, dtype=int)
    counts[np.arange(8) * 7] = 1  # 8 experts on the NDP units: the PCIe link idles only after they finish
    gap_s = 1e-6  # the non-expert time before each layer: far shorter than one expert's copy
    copy_s = QWEN.expert.weight_bytes() / sim.system.host_link.bandwidth_bytes_per_s
    results = []
    for _token in range(2):  # the second token's predictions know the first token's layers
        for layer in (0, 1):
            sim.advance_time_s(gap_s)
            if layer == 0:
                sim.predict_next(1, counts)  # as the bench does: layer 0's hidden state predicts layer 1
            results.append(sim.simulate_layer(layer, counts, "decode"))
    # layer 0 lasts longer than a copy, but its link is busy or waiting on the NDP units for almost all of it
    assert results[2].latency_s > copy_s
    # so no copy is started: one begun in the idle tail would be dropped half done, its bytes moved for nothing
    assert not [e for r in results for e in r.events if e.label == "look-ahead copy"]


def test_the_lookahead_predictor_is_exact_at_accuracy_one_and_always_wrong_at_zero():
    from hw_model.traces import TraceKnobs, predicted_counts, synthetic_trace

    trace = synthetic_trace(2, 16, 4, 4, 4, TraceKnobs(skew=0.5))
    rng = np.random.default_rng(0)
    for token in range(8):
        true = trace.counts(1, token, token + 1)
        assert predicted_counts(trace, 1, token, 1.0, rng).tolist() == true.tolist()
        wrong = predicted_counts(trace, 1, token, 0.0, rng)
        assert wrong.sum() == 4 and not (wrong & true).any()


def test_variable_degree_runs_each_units_coldest_experts_whole_and_stores_experts_twice():
    # 2 units: experts 0, 2, 4 live on unit 0 and 1, 3 on unit 1; the fewest any unit is home to is 2, so each
    # unit runs its two coldest experts whole on itself (equal heat: lowest ids first) and the rest stay sliced.
    # (With 5, 1, 2, 3, 1 tokens slicing them all now packs 0.1 % shorter, as the timeline has it too.)
    counts = np.zeros(QWEN.num_experts, dtype=int)
    counts[[0, 1, 2, 3, 4]] = 1
    result = _sim("tp+lb+prefetch+vtp", units=2, residency_fraction=0.0).simulate_layer(0, counts, "decode")
    whole_or_sliced = {0: "ndp0", 1: "ndp1", 2: "ndp0", 3: "ndp1", 4: "ndp"}
    on_ndp = {e: where for e, where in result.placement.items() if where != "gpu"}
    assert len(on_ndp) >= 3 and all(whole_or_sliced[e] == where for e, where in on_ndp.items())
    assert result.extra["whole_on_unit"] == 4
    # sliced copies plus whole copies on the home units: Mixtral's 90.2 GB no longer fit 4 x 32 GB
    assert not _sim("tp+lb+prefetch+vtp", units=4, model=MIXTRAL, layers=32).capacity.feasible
    assert _sim("tp+lb+prefetch", units=4, model=MIXTRAL, layers=32).capacity.feasible


def test_split_runs_part_of_the_hottest_ndp_expert_on_the_gpu():
    # one Mixtral expert with 32 prefill tokens: sliced over 4 DIMMs it takes ~5.5 ms, its whole copy 6.4 ms
    # (352 MB at 55 GB/s), so the packer keeps it on the NDP units; copying 1/k of it balances the two sides
    counts = np.zeros(MIXTRAL.num_experts, dtype=int)
    counts[3] = 32
    split = _sim("tp+lb+prefetch+split", model=MIXTRAL, layers=1, residency_fraction=0.0)
    plain = _sim("tp+lb", model=MIXTRAL, layers=1, residency_fraction=0.0)  # the packer alone
    result = split.simulate_layer(0, counts, "prefill")
    assert dict(plain.simulate_layer(0, counts, "prefill").placement) == {3: "ndp"}
    assert dict(result.placement) == {3: "split"}
    k = int(result.extra["split_parts"])
    assert 2 <= k <= 8
    assert any(e.resource == "gpu" and e.label == f"e3 1/{k}" for e in result.events)
    assert any(e.resource == "pcie" and e.label == f"e3 1/{k} weights" for e in result.events)
