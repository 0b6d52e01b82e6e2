"""The run-time packer against the exact MILP optimum, and the MILP against brute force; the richer problem
(a tensor-parallel degree per expert: sliced or whole on its home unit) likewise."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hw_model.errors import WorkloadError
from hw_model.oracles import ItemMode, makespan_modes_s, solve_exact, solve_exact_modes, staged_bytes_of
from hw_model.scheduler import PlacementProblem, is_feasible, makespan_s, pack


def random_problem(rng: np.random.Generator, max_items: int = 12, max_units: int = 4) -> PlacementProblem:
    """Small instances shaped like real layers: experts either sliced over every unit (TP) or whole on one
    home unit, GPU 2-40x faster, a quarter resident (no copy), sometimes a tight staging cap; a copy reads its
    source DIMMs, taking 0-100 % of the item's NDP time from each (memory-bound decode: all of it)."""
    units = int(rng.integers(1, max_units + 1))
    n = int(rng.integers(1, max_items + 1))
    ndp = np.zeros((n, units))
    gpu = np.zeros(n)
    transfer = np.zeros(n)
    staged = np.zeros(n)
    for i in range(n):
        tokens = int(rng.integers(1, 64))
        whole = rng.uniform(0.2, 5.0) * tokens ** rng.uniform(0, 1)
        if rng.random() < 0.5:
            ndp[i, :] = whole / units
        else:
            ndp[i, rng.integers(0, units)] = whole
        gpu[i] = whole / rng.uniform(2, 40)
        if rng.random() > 0.25:
            transfer[i] = rng.uniform(0.3, 3.0)
            staged[i] = 100.0
    cap = float("inf") if rng.random() < 0.7 else float(rng.uniform(100, 600))
    copy = ndp * np.where(transfer > 0, rng.uniform(0.0, 1.0, n), 0.0)[:, None]
    return PlacementProblem(
        ndp,
        gpu,
        transfer,
        staged,
        staging_cap_bytes=cap,
        unit_base_s=rng.uniform(0, 0.5, units),
        pcie_base_s=float(rng.uniform(0, 0.3)),
        copy_unit_s=copy,
    )


def test_packer_is_within_2_percent_median_and_10_percent_p99_of_milp_on_500_instances():
    rng = np.random.default_rng(2026)
    ratios = []
    for _ in range(500):
        problem = random_problem(rng)
        on_gpu = pack(problem)
        assert is_feasible(problem, on_gpu)
        _, optimum = solve_exact(problem)
        ratios.append(makespan_s(problem, on_gpu) / optimum)
    ratios = np.asarray(ratios)
    assert ratios.min() >= 1 - 1e-9  # the MILP is optimal
    assert np.median(ratios) <= 1.02
    assert np.percentile(ratios, 99) <= 1.10


def test_milp_matches_brute_force_on_tiny_instances():
    rng = np.random.default_rng(7)
    for _ in range(40):
        problem = random_problem(rng, max_items=7, max_units=3)
        best = min(
            makespan_s(problem, np.array(bits, dtype=bool))
            for bits in itertools.product((False, True), repeat=problem.num_items)
            if is_feasible(problem, np.array(bits, dtype=bool))
        )
        _, optimum = solve_exact(problem)
        assert optimum == pytest.approx(best, rel=1e-7)


def test_resident_expert_that_costs_ndp_a_lot_goes_to_the_gpu():
    # two experts sliced over 2 units; expert 0 resident on the GPU (no copy)
    problem = PlacementProblem(
        ndp_time_s=[[5.0, 5.0], [1.0, 1.0]], gpu_compute_s=[0.5, 0.1], transfer_s=[0.0, 4.0], transfer_bytes=[0, 1]
    )
    assert pack(problem).tolist() == [True, False]


def test_packer_respects_staging_cap():
    problem = PlacementProblem(
        ndp_time_s=np.full((6, 2), 10.0),
        gpu_compute_s=np.full(6, 0.1),
        transfer_s=np.full(6, 0.1),
        transfer_bytes=np.full(6, 100.0),
        staging_cap_bytes=250.0,
    )
    on_gpu = pack(problem)
    assert on_gpu.sum() == 2
    assert is_feasible(problem, on_gpu)


def test_packer_keeps_everything_on_ndp_when_pcie_is_too_slow():
    problem = PlacementProblem(
        ndp_time_s=np.full((4, 4), 1.0),
        gpu_compute_s=np.full(4, 0.01),
        transfer_s=np.full(4, 50.0),
        transfer_bytes=np.ones(4),
    )
    assert not pack(problem).any()


def test_empty_problem_and_bad_input():
    assert pack(PlacementProblem(np.zeros((0, 2)), [], [], [])).size == 0
    with pytest.raises(WorkloadError, match="gpu_compute_s"):
        PlacementProblem(np.ones((2, 2)), [1.0], [0, 0], [0, 0])
    with pytest.raises(WorkloadError, match="ndp_time_s"):
        PlacementProblem(-np.ones((2, 2)), [1, 1], [0, 0], [0, 0])


def _whole_mode(rng: np.random.Generator, problem: PlacementProblem) -> ItemMode:
    """Per item, its NDP time whole on one home unit: the sum of its per-unit times on one unit, minus some fixed
    shard costs saved (a variable tensor-parallel degree's other mode)."""
    n, units = problem.ndp_time_s.shape
    whole = np.zeros((n, units))
    whole[np.arange(n), rng.integers(0, units, n)] = problem.ndp_time_s.sum(axis=1) * rng.uniform(0.6, 1.0, n)
    return ItemMode(whole)


def _split_mode(rng: np.random.Generator, problem: PlacementProblem) -> ItemMode:
    """Per item, part of it on the GPU (a share of its copy, compute and bytes) and the rest on the NDP units."""
    share = rng.uniform(0.2, 0.8, problem.num_items)
    return ItemMode(
        problem.ndp_time_s * (1 - share)[:, None] + problem.copy_unit_s * share[:, None],
        problem.transfer_s * share + rng.uniform(0, 0.1, problem.num_items),
        problem.gpu_compute_s * share * rng.uniform(1.0, 1.5, problem.num_items),
        problem.transfer_bytes * share,
    )


def test_milp_with_item_modes_matches_brute_force_on_tiny_instances():
    rng = np.random.default_rng(11)
    for _ in range(30):
        problem = random_problem(rng, max_items=5, max_units=3)
        modes = (_whole_mode(rng, problem), _split_mode(rng, problem))
        best = float("inf")
        for choice in itertools.product((-1, 0, 1, 2), repeat=problem.num_items):  # -1: the GPU
            if staged_bytes_of(problem, modes, choice) <= problem.staging_cap_bytes * (1 + 1e-9):
                best = min(best, makespan_modes_s(problem, modes, np.array(choice)))
        choice = solve_exact_modes(problem, modes)
        assert staged_bytes_of(problem, modes, choice) <= problem.staging_cap_bytes * (1 + 1e-9)
        assert makespan_modes_s(problem, modes, choice) == pytest.approx(best, rel=1e-7)
        # with no other mode it is the plain problem, and the objective is the plain one
        plain = solve_exact_modes(problem, ())
        assert set(plain.tolist()) <= {-1, 0}
        assert makespan_modes_s(problem, (), plain) == pytest.approx(solve_exact(problem)[1], rel=1e-7)
        assert makespan_modes_s(problem, modes, np.where(plain < 0, -1, 0)) == pytest.approx(
            makespan_s(problem, plain < 0), rel=1e-12
        )


def test_richer_optimum_bounds_the_decisions_of_ours_and_the_extensions_on_real_invocations():
    from hw_model import load_system
    from hw_model.layout import InvocationLayout
    from hw_model.models import get_model
    from hw_model.policies import richer_choices, richer_problem
    from hw_model.simulator import MoESimulator
    from hw_model.traces import TraceKnobs, synthetic_trace

    model = get_model("qwen3-30b-a3b")
    sim = MoESimulator(load_system("paper", 2), model.moe_layer_shapes()[:1], "tp+lb+prefetch+vtp")
    trace = synthetic_trace(1, model.num_experts, model.top_k, 16, 12, TraceKnobs(seed=5))
    # twelve decode tokens, then the 16-token prompt; every third active expert resident
    for counts in [trace.counts(0, t, t + 1) for t in range(16, 28)] + [trace.prefill_counts(0)]:
        active = np.flatnonzero(counts).tolist()
        out = InvocationLayout(sim.context, sim._state, 0, active, counts[active].tolist())
        resident = [i % 3 == 0 for i in range(len(active))]
        problem, modes = richer_problem(sim.context, out, resident)
        optimum = makespan_modes_s(problem, modes, solve_exact_modes(problem, modes))
        choices = richer_choices(sim.context, out, resident, problem)
        assert set(choices) == {"tp+lb+prefetch", "tp+lb+prefetch+vtp", "tp+lb+prefetch+split"}
        assert makespan_modes_s(problem, modes, choices["tp+lb+prefetch"]) == pytest.approx(
            makespan_s(problem, pack(problem)), rel=1e-12
        )
        spans = {policy: makespan_modes_s(problem, modes, choice) for policy, choice in choices.items()}
        assert all(optimum <= span * (1 + 1e-9) for span in spans.values())
        # vtp keeps its whole experts only where that beats slicing them: never behind ours' placement
        assert spans["tp+lb+prefetch+vtp"] <= spans["tp+lb+prefetch"] * (1 + 1e-9)
        assert optimum <= solve_exact(problem)[1] * (1 + 1e-9)  # a superset of the plain problem's choices
