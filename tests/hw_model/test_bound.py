"""The tight bound (hw_model/bound.py, hw_model/bench_bound.py): valid against every registered policy on every
invocation of several seeded traces (adversarial ones included), and tight against schedules found by brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hw_model.bench_bound import PoolFill, _decode_bound_s, _Memo, likely_selections, phase_residency, trace_bound
from hw_model.bound import (
    Invocation,
    bound_context,
    gpu_share_terms_s,
    invocation_bound_s,
    joint_bound_s,
    whole_floor_s,
)
from hw_model.cost import expert_shard_time_s
from hw_model.layout import InvocationLayout, LayoutState
from hw_model.models import get_model, sweep_model
from hw_model.policies import SPLIT_PARTS, get_policy, policy_names
from hw_model.settings import SimulationSettings
from hw_model.simulator import USABLE_GPU_MEMORY_FRACTION, MoESimulator
from hw_model.traces import RoutingTrace, TraceKnobs, synthetic_trace

POLICIES = [p for p in policy_names() if get_policy(p).role != "bound"]
CAUSAL = [p for p in POLICIES if not get_policy(p).lookahead]
LAYERS, EXPERTS, TOP_K = 4, 16, 2
POOL_EXPERTS = 9  # the GPU pool holds 9 of the 64 experts


def model_layers(hidden: int = 1024):
    return sweep_model(EXPERTS, hidden, top_k=TOP_K, layers=LAYERS).moe_layer_shapes()


def simulator(policy: str, units: int = 4, hidden: int = 1024) -> MoESimulator:
    layers = model_layers(hidden)
    settings = SimulationSettings(hw="paper", ndp_units=units, policy=policy)
    gpu = settings.system.gpu.memory_capacity_bytes * USABLE_GPU_MEMORY_FRACTION
    reserved = gpu - POOL_EXPERTS * layers[0].expert.weight_bytes()
    return MoESimulator.from_settings(settings, layers, gpu_reserved_bytes=reserved)


def traces() -> dict[str, RoutingTrace]:
    """Seeded traces: typical and extreme skews, temporal locality (an LRU's best case), every token routed to the
    same experts, experts whose home units collide."""
    out = {}
    for name, knobs in {
        "typical": TraceKnobs(skew=0.3, seed=1),
        "uniform": TraceKnobs(skew=0.0, seed=2),
        "high-skew": TraceKnobs(skew=2.0, seed=3),
        "locality": TraceKnobs(skew=0.2, locality=0.9, seed=4),
    }.items():
        out[name] = synthetic_trace(LAYERS, EXPERTS, TOP_K, 24, 40, knobs)
    same = np.zeros((LAYERS, 64, TOP_K), dtype=np.int32)
    same[:, :, 1] = 4  # experts 0 and 4: the same home unit of 4
    out["same-experts"] = RoutingTrace(same, EXPERTS, 24)
    return out


def replay(sim: MoESimulator, trace: RoutingTrace):
    """The trace through ``sim`` as the bench runs it (prefill, then one decode step per token); yields each
    invocation's result."""
    yield from sim.simulate_step("prefill", trace.prefill_step_counts(LAYERS))
    for token in range(trace.prompt_tokens, trace.num_tokens):
        yield from sim.simulate_step("decode", trace.token_counts(token, LAYERS), gap_before_layer_s=1e-4)


def resident_on_gpu(result) -> set[int]:
    """The experts an invocation ran on the GPU, whole or a split's part, without copying their weights (from its
    public timeline)."""
    copied = {e.label.split()[0] for e in result.events if e.resource == "pcie" and e.label.endswith(" weights")}
    return {e for e, where in result.placement.items() if where in ("gpu", "split") and f"e{e}" not in copied}


@pytest.mark.parametrize("units", [2, 4])
@pytest.mark.parametrize("trace_name", list(traces()))
def test_bound_is_below_every_policy_on_every_invocation_given_its_residency(trace_name: str, units: int) -> None:
    trace = traces()[trace_name]
    checked = 0
    memo = None  # the bounds memoised by what they depend on (hw_model.bench_bound), shared by the policies
    for policy in POLICIES:
        sim = simulator(policy, units)
        memo = memo or _Memo(bound_context(sim.context))
        for result in replay(sim, trace):
            active = sorted(result.placement)
            tokens = _tokens_of(trace, result)
            resident = resident_on_gpu(result)
            bound = memo.bound_s(
                result.layer_index, active, [tokens[e] for e in active], [e in resident for e in active]
            )
            assert bound <= result.latency_s * (1 + 1e-9), (policy, result, bound)
            checked += 1
    assert checked == len(POLICIES) * LAYERS * (1 + trace.generated_tokens)


def _tokens_of(trace: RoutingTrace, result) -> dict[int, int]:
    """Tokens per expert of the invocation ``result`` (its phase's rows of the trace)."""
    if result.phase == "prefill":
        row = trace.prefill_counts(result.layer_index)
        return {e: int(row[e]) for e in np.flatnonzero(row)}
    return {e: 1 for e in result.placement}


@pytest.mark.parametrize("trace_name", ["typical", "uniform", "high-skew", "same-experts"])
def test_trace_bounds_are_below_every_policy_total(trace_name: str) -> None:
    """On traces drawn from one routing distribution per phase (no temporal locality): the causal bound is below
    every policy that cannot see future routing, the foresight bound below every policy (look-ahead included)."""
    trace = traces()[trace_name]
    shift = [trace.prompt_tokens + trace.generated_tokens // 2] if trace_name != "same-experts" else []
    bound = trace_bound(simulator(POLICIES[0]), trace, shift)
    assert bound.foresight_s <= bound.causal_s * (1 + 1e-12)
    for policy in POLICIES:
        total = sum(result.latency_s for result in replay(simulator(policy), trace))
        assert bound.foresight_s <= total * (1 + 1e-9), policy
        if policy in CAUSAL:
            assert bound.causal_s <= total * (1 + 1e-9), policy


def best_schedule_s(ctx, inv: Invocation, resident: list[bool]) -> float:
    """The best placement the simulator can lay out for ``inv`` in the sliced layout, by brute force: per active
    expert, on the GPU (from residency if resident, else copied), sliced over every unit, or split with 1/k on the
    GPU or all but 1/k (every k the split extension uses; computed from the GPU's copy if resident, else that part
    copied)."""
    modes: list[tuple[str, int]] = [("gpu", 0), ("sliced", 0)] + [("split", k) for k in SPLIT_PARTS]
    modes += [("split", -k) for k in SPLIT_PARTS]
    best = float("inf")
    for choice in itertools.product(modes, repeat=len(inv.active)):
        out = InvocationLayout(ctx, LayoutState(), inv.layer_index, list(inv.active), list(inv.tokens))
        for (mode, k), e, tokens, res in zip(choice, inv.active, inv.tokens, resident, strict=True):
            if mode == "gpu":
                out.to_gpu(e, tokens, res)
            elif mode == "sliced":
                out.sliced([e], [tokens])
            else:
                out.split(e, tokens, k, res)
        best = min(best, out.finish().latency_s)
    return best


# stated in docs/bench.md: on Mixtral-wide experts (hidden 4096, FFN 14336), a brute-forced schedule within 5 % of the
# bound for decode invocations (one token per expert) and within 20 % for prefill-like ones (the LP's fractions
# against the simulator's 1/k and (k-1)/k splits)
DECODE_MARGIN, MULTI_TOKEN_MARGIN = 0.05, 0.20


@pytest.mark.parametrize("seed", range(8))
def test_bound_is_within_the_margin_of_a_brute_forced_schedule(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sim = simulator("tp+lb+prefetch", units=int(rng.choice([2, 4, 6])), hidden=4096)
    ctx = bound_context(sim.context)
    n = int(rng.integers(1, 4))
    active = sorted(rng.choice(EXPERTS, size=n, replace=False).tolist())
    decode = seed % 2 == 0
    tokens = [1] * n if decode else rng.integers(1, 48, size=n).tolist()
    resident = (rng.random(n) < 0.4).tolist()
    inv = Invocation(0, tuple(active), tuple(tokens))
    bound = invocation_bound_s(ctx, inv, resident).latency_s
    best = best_schedule_s(ctx, inv, resident)
    assert bound <= best * (1 + 1e-9)
    margin = DECODE_MARGIN if decode else MULTI_TOKEN_MARGIN
    assert best <= bound * (1 + margin), (best / bound, tokens, resident)


def test_a_joint_fill_is_no_worse_than_any_fixed_residency_that_fits_the_pool() -> None:
    sim = simulator("tp+lb+prefetch")
    ctx = bound_context(sim.context)
    invocations = [Invocation(layer, (0, 3, 5), (40, 17, 3)) for layer in range(LAYERS)]
    size = ctx.expert_bytes[0]
    joint = joint_bound_s(ctx, invocations, 2 * size).latency_s
    rng = np.random.default_rng(7)
    for _ in range(5):
        cells = rng.choice(LAYERS * 3, size=2, replace=False).tolist()
        fixed = sum(
            invocation_bound_s(ctx, inv, [layer * 3 + i in cells for i in range(3)]).latency_s
            for layer, inv in enumerate(invocations)
        )
        assert joint <= fixed * (1 + 1e-9)
    nothing = sum(invocation_bound_s(ctx, inv, [False] * 3).latency_s for inv in invocations)
    everything = sum(invocation_bound_s(ctx, inv, [True] * 3).latency_s for inv in invocations)
    assert everything < joint < nothing


def test_phase_residency_takes_the_most_used_experts_that_fit() -> None:
    counts = np.array([[5, 0, 2, 9], [1, 7, 0, 0]])
    assert phase_residency(counts, [10.0, 10.0], 30.0) == [{0, 3}, {1}]
    assert phase_residency(counts, [10.0, 10.0], 1000.0) == [{0, 2, 3}, {0, 1}]  # never-selected ones left out
    assert phase_residency(counts, [10.0, 25.0], 30.0) == [{0, 2, 3}, set()]  # 9, 7 does not fit, 5, 2, 1 does not


@pytest.mark.parametrize("seed", range(10))
def test_the_whole_family_floor_is_below_its_program(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    sim = simulator("monde", units=int(rng.choice([2, 4, 6])))
    ctx = bound_context(sim.context)
    n = int(rng.integers(1, 7))
    active = sorted(rng.choice(EXPERTS, size=n, replace=False).tolist())
    tokens = [1] * n if seed % 2 else rng.integers(1, 30, size=n).tolist()
    resident = (rng.random(n) < 0.3).tolist()
    inv = Invocation(0, tuple(active), tuple(tokens))
    exact = invocation_bound_s(ctx, inv, resident, ("whole",)).latency_s
    assert 0 < whole_floor_s(ctx, inv, resident) <= exact * (1 + 1e-9)


def test_a_synthetic_trace_names_the_weights_each_phase_was_drawn_from() -> None:
    # a steep skew over many tokens: per layer and phase, the expert drawn most often is the largest weight's
    trace = synthetic_trace(LAYERS, EXPERTS, TOP_K, 400, 4000, TraceKnobs(skew=2.5, shift_at=0.5, seed=5))
    shift = 400 + 2000
    assert trace.distribution is not None and trace.distribution.phase_starts == (0, shift)
    for start, stop in ((0, shift), (shift, trace.num_tokens)):
        weights = likely_selections(trace, start, stop, LAYERS)
        assert weights is not None
        for layer in range(LAYERS):
            assert int(np.argmax(trace.counts(layer, start, stop))) == int(np.argmax(weights[layer]))
    assert likely_selections(trace, shift - 10, shift + 10, LAYERS) is None  # spans the shift: no one distribution


def test_without_a_known_distribution_the_causal_pool_falls_back_to_the_phase_counts() -> None:
    local = synthetic_trace(LAYERS, EXPERTS, TOP_K, 24, 40, TraceKnobs(skew=0.5, locality=0.5, seed=6))
    assert local.distribution is not None and likely_selections(local, 24, 64, LAYERS) is None  # locality
    read_back = RoutingTrace(local.expert_ids, EXPERTS, 24)  # as a trace file gives it
    assert read_back.distribution is None and likely_selections(read_back, 24, 64, LAYERS) is None
    assert (
        trace_bound(simulator(POLICIES[0]), local).causal_s == trace_bound(simulator(POLICIES[0]), read_back).causal_s
    )


def test_the_weights_pool_is_no_lower_than_the_realized_counts_pool() -> None:
    # the realized most-used experts fit the phase's own draws; the weights' pool does not see them
    trace = synthetic_trace(LAYERS, EXPERTS, TOP_K, 24, 200, TraceKnobs(skew=0.3, shift_at=None, seed=8))
    knows = trace_bound(simulator(POLICIES[0]), trace)
    hindsight = trace_bound(simulator(POLICIES[0]), RoutingTrace(trace.expert_ids, EXPERTS, 24))
    assert knows.decode_causal_s >= hindsight.decode_causal_s * (1 - 1e-12)
    assert knows.decode_foresight_s == hindsight.decode_foresight_s  # foresight keeps the windows' own counts


@pytest.mark.parametrize("policy", POLICIES)
def test_a_cold_request_s_prefill_bound_is_below_every_policy_and_above_a_warm_one(policy: str) -> None:
    trace = traces()["typical"]
    cold = trace_bound(simulator(policy), trace)
    warm = trace_bound(simulator(policy), trace, cold_start=False)
    assert warm.prefill_s < cold.prefill_s  # residents would have spared the prefill's copies
    prefill = sum(
        result.latency_s for result in simulator(policy).simulate_step("prefill", trace.prefill_step_counts(LAYERS))
    )
    assert cold.prefill_s <= prefill * (1 + 1e-9)


def test_a_cold_pool_fills_no_faster_than_copies_can_bring_it_and_stays_below_every_policy() -> None:
    # one prompt token: the decode starts with almost nothing copied, so the first steps hold few of the pool's experts
    trace = synthetic_trace(LAYERS, EXPERTS, TOP_K, 1, 60, TraceKnobs(skew=0.3, shift_at=None, seed=9))
    sim = simulator(POLICIES[0])
    memo = _Memo(bound_context(sim.context))
    phases, pool = [(1, trace.num_tokens)], sim.gpu_pool_bytes
    free = _decode_bound_s(memo, trace, LAYERS, phases, pool, foresight=False)
    rate = memo.ctx.costs.copy_bandwidth(4)
    filled = _decode_bound_s(memo, trace, LAYERS, phases, pool, foresight=False, fill=PoolFill(0.0, rate))
    instant = _decode_bound_s(memo, trace, LAYERS, phases, pool, foresight=False, fill=PoolFill(1.0, rate))
    assert free < filled and instant == free  # after a second of copies the pool is full from the first step
    bound = trace_bound(sim, trace)
    for policy in CAUSAL:
        assert bound.causal_s <= sum(r.latency_s for r in replay(simulator(policy), trace)) * (1 + 1e-9), policy


@pytest.mark.parametrize("tokens", [1, 7, 40])
def test_a_gpu_share_costs_no_less_than_its_fixed_part_and_its_share_of_the_rest(tokens: int) -> None:
    """gpu_share_terms_s: for every share a split can record (1/k and all but 1/k of the FFN columns, every k up to
    past the FFN width), the share's own GPU time is at least fixed + share * rest; all of it costs the whole time."""
    sim = simulator("tp+lb+prefetch", hidden=256)  # FFN 896: every k is tried
    ctx = bound_context(sim.context)
    expert = ctx.layers[0].expert
    gpu = ctx.system.gpu
    fixed, rest = gpu_share_terms_s(ctx, expert, tokens)
    whole = expert_shard_time_s(gpu, expert, tokens)
    assert fixed > 0 and fixed + rest == pytest.approx(whole, rel=1e-12)
    for k in range(2, expert.ffn + 3):
        assert fixed + rest / k <= expert_shard_time_s(gpu, expert, tokens, k) * (1 + 1e-12)
        assert fixed + rest * (k - 1) / k <= expert_shard_time_s(gpu, expert, tokens, k / (k - 1)) * (1 + 1e-12)


DUAL_SPLITS = (2, 3, 5, 8, -2, -3, -5, -8)


def best_dual_schedule_s(ctx, inv: Invocation, resident: list[bool]) -> float:
    """The best placement the simulator can lay out for ``inv`` when experts are stored both sliced and whole (the
    dual layout the tp family also bounds), by brute force: per active expert, on the GPU, sliced, whole on its home
    unit, or split (several k of both sides)."""
    modes = [("gpu", 0), ("sliced", 0), ("whole", 0)] + [("split", k) for k in DUAL_SPLITS]
    best = float("inf")
    for choice in itertools.product(modes, repeat=len(inv.active)):
        out = InvocationLayout(ctx, LayoutState(), inv.layer_index, list(inv.active), list(inv.tokens))
        for (mode, k), e, tokens, res in zip(choice, inv.active, inv.tokens, resident, strict=True):
            if mode == "gpu":
                out.to_gpu(e, tokens, res)
            elif mode == "sliced":
                out.sliced([e], [tokens])
            elif mode == "whole":
                out.whole_on_units([e], [tokens])
            else:
                out.split(e, tokens, k, res)
        best = min(best, out.finish().latency_s)
    return best


# (units, hidden, active, tokens, resident): each unit home to one expert (running them whole beats slicing them),
# two homes colliding, one expert resident, several tokens
DUAL_CASES = [
    (2, 1024, (0, 1), (1, 1), (False, False)),
    (4, 1024, (0, 1, 2), (1, 1, 1), (False, False, False)),
    (2, 256, (0, 1, 3), (1, 1, 1), (False, False, False)),
    (2, 1024, (0, 1, 2), (1, 1, 1), (True, False, False)),
    (4, 256, (1, 2, 3), (5, 9, 2), (False, False, False)),
]


@pytest.mark.parametrize("case", range(len(DUAL_CASES) + 4))
def test_the_tp_family_is_below_every_placement_of_the_dual_layout(case: int) -> None:
    """The tp family alone (its whole-on-home binaries, its per-expert home rows, its all-sliced way back, its GPU
    shares' fixed parts) holds against every placement mixing whole, sliced, GPU and split experts: the fixed cases,
    then seeded random ones."""
    if case < len(DUAL_CASES):
        units, hidden, active, tokens, resident = DUAL_CASES[case]
    else:
        rng = np.random.default_rng(300 + case)
        units, hidden = int(rng.choice([2, 4])), int(rng.choice([256, 1024]))
        active = tuple(sorted(rng.choice(EXPERTS, size=3, replace=False).tolist()))
        tokens = (1, 1, 1) if case % 2 == 0 else tuple(rng.integers(1, 24, size=3).tolist())
        resident = tuple((rng.random(3) < 0.5).tolist())
    ctx = bound_context(simulator("tp+lb+prefetch+vtp", units=units, hidden=hidden).context)
    inv = Invocation(0, active, tokens)
    best = best_dual_schedule_s(ctx, inv, list(resident))
    assert invocation_bound_s(ctx, inv, resident, ("tp",)).latency_s <= best * (1 + 1e-9)
    assert invocation_bound_s(ctx, inv, resident).latency_s <= best * (1 + 1e-9)


def test_a_decode_bound_is_within_two_percent_of_a_brute_forced_schedule_on_qwen() -> None:
    """Qwen3-30B-A3B's shape at 4 units, 8 experts of 1 token, several of them resident: the best placement with at
    most one split (the counts of GPU and NDP experts of each residency enumerated) within 2 % of the bound."""
    model = get_model("qwen3-30b-a3b")
    settings = SimulationSettings(ndp_units=4)
    sim = MoESimulator.from_settings(settings, model.moe_layer_shapes()[:1], gpu_reserved_bytes=0)
    ctx = bound_context(sim.context)
    active = list(range(0, 16, 2))
    for held in (0, 3, 5, 6):
        resident = [i < held for i in range(8)]
        bound = invocation_bound_s(ctx, Invocation(0, tuple(active), (1,) * 8), resident).latency_s
        best = best_single_split_s(sim.context, active, resident)
        assert bound <= best * (1 + 1e-9)
        assert best <= bound * 1.02, (held, best / bound)


def best_single_split_s(ctx, active: list[int], resident: list[bool]) -> float:
    """The best sliced-layout placement of one-token experts with at most one split: how many resident and how many
    other experts run on the GPU, and which of the rest (if any) is split, with which k."""
    held = [e for e, r in zip(active, resident, strict=True) if r]
    other = [e for e, r in zip(active, resident, strict=True) if not r]
    splits = list(SPLIT_PARTS) + [-k for k in SPLIT_PARTS]
    best = float("inf")
    for on_gpu_held in range(len(held) + 1):
        for on_gpu_other in range(len(other) + 1):
            options = [None] + [(True, k) for k in splits if on_gpu_held < len(held)]
            options += [(False, k) for k in splits if on_gpu_other < len(other)]
            for split in options:
                out = InvocationLayout(ctx, LayoutState(), 0, list(active), [1] * len(active))
                for group, count, res in ((held, on_gpu_held, True), (other, on_gpu_other, False)):
                    for i, e in enumerate(group):
                        if i < count:
                            out.to_gpu(e, 1, res)
                        elif split is not None and split[0] == res and i == count:
                            out.split(e, 1, split[1], res)
                        else:
                            out.sliced([e], [1])
                best = min(best, out.finish().latency_s)
    return best
