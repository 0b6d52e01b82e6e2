"""The run-time packer against the exact MILP optimum, and the MILP against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hw_model.errors import WorkloadError
from hw_model.scheduler import PlacementProblem, is_feasible, makespan_s, pack, solve_exact


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
