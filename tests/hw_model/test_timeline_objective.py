"""The packer's objective costs a layer as the timeline lays it out: its estimate against the timeline's latency
on real invocations, the MILP and the packer on that objective (against a brute force over an objective written
out here from the timeline's rules), and the inversions a faster PCIe link used to cause."""

from __future__ import annotations

import copy
import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
import tomllib

import hw_model
from hw_model.hardware import system_from_dict
from hw_model.layout import InvocationLayout
from hw_model.models import get_model
from hw_model.oracles import ItemMode, makespan_modes_s, solve_exact, solve_exact_modes, staged_bytes_of
from hw_model.policies import richer_problem
from hw_model.scheduler import (
    PlacementProblem,
    _span_one,
    best_prefix,
    best_prefix_lists,
    is_feasible,
    makespan_s,
    pack,
    span_s,
)
from hw_model.simulator import MoESimulator
from hw_model.traces import TraceKnobs, synthetic_trace

PRESET = tomllib.loads((Path(hw_model.__file__).parent / "presets" / "paper.toml").read_text())


def _system(pcie_scale: float, units: int):
    data = copy.deepcopy(PRESET)
    data["host_link"]["bandwidth_bytes_per_s"] *= pcie_scale
    return system_from_dict(data).with_ndp_units(units)


def _packed_layer(sim: MoESimulator, counts: np.ndarray, resident: list[bool]) -> tuple[float, float]:
    """(the packer's estimate, the timeline's latency less the final combine) of ``tp+lb+prefetch``'s packer's
    placement of one invocation of layer 0."""
    active = np.flatnonzero(counts).tolist()
    tokens = counts[active].tolist()
    out = InvocationLayout(sim.context, sim._state, 0, active, tokens)
    problem, _ = richer_problem(sim.context, out, resident)
    on_gpu = pack(problem)
    laid = InvocationLayout(sim.context, sim._state, 0, active, tokens)
    for e, t, g, r in zip(active, tokens, on_gpu, resident, strict=True):
        if g:
            laid.to_gpu(e, t, r)
        else:
            laid.sliced([e], [t])
    timeline = laid.lay_out()
    combine = sum(e.end_s - e.start_s for e in timeline.events if e.label == "combine")
    return makespan_s(problem, on_gpu), timeline.latency_s - combine


def test_packer_estimate_is_within_1_percent_of_the_timeline_on_real_invocations():
    # 4 models x 2/4 units x PCIe at 0.5/1/2x x (16-token prompt, 2 decode tokens) x two residency patterns;
    # measured: within 1e-4 of the timeline here (the code before: -10.3 % to +6.7 %); the copy-tail and way-back
    # terms are approximations of the timeline, so not exact everywhere
    rng = np.random.default_rng(7)
    errors = []
    for name in ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite", "olmoe-1b-7b"):
        model = get_model(name)
        trace = synthetic_trace(1, model.num_experts, model.top_k, 16, 2, TraceKnobs(seed=3))
        steps = [trace.prefill_counts(0), trace.counts(0, 16, 17), trace.counts(0, 17, 18)]
        for units, scale in itertools.product((2, 4), (0.5, 1.0, 2.0)):
            sim = MoESimulator(_system(scale, units), model.moe_layer_shapes()[:1], "tp+lb+prefetch")
            for counts in steps:
                for share in (0.0, 0.3):
                    resident = (rng.random(int((counts > 0).sum())) < share).tolist()
                    estimate, latency = _packed_layer(sim, counts, resident)
                    errors.append(estimate / latency - 1)
    errors = np.asarray(errors)
    assert errors.size == 4 * 6 * 3 * 2
    assert np.abs(errors).max() <= 0.01, (errors.min(), errors.max())


def _layer_latency_s(name: str, units: int, pcie_scale: float, phase: str, tokens: int, seed: int) -> float:
    model = get_model(name)
    trace = synthetic_trace(1, model.num_experts, model.top_k, 64, 4, TraceKnobs(skew=1.0, seed=seed))
    counts = trace.prefill_counts(0) if phase == "prefill" else trace.counts(0, tokens, tokens + 1)
    sim = MoESimulator(_system(pcie_scale, units), model.moe_layer_shapes()[:1], "tp+lb+prefetch")
    return sim.simulate_layer(0, counts, phase).latency_s


# (model, NDP units, phase, decode token or 0, trace seed): layers where the code before took longer on a faster
# PCIe link; measured there, PCIe 0.5/1/2/4x: mixtral 4 units decode 3746 -> 4155 us from 1x to 2x (+10.9 %),
# qwen3 6 units decode 294 -> 316 us from 1x to 2x (+7.4 %), olmoe 6 units prefill +3.6 % from 1x to 2x,
# deepseek 4 units prefill +1.6 % from 0.5x to 1x, mixtral 2 units prefill +1.1 % from 0.5x to 1x
INVERSIONS = [
    ("mixtral-8x7b", 4, "decode", 64, 0),
    ("qwen3-30b-a3b", 6, "decode", 64, 0),
    ("olmoe-1b-7b", 6, "prefill", 0, 3),
    ("deepseek-v2-lite", 4, "prefill", 0, 0),
    ("mixtral-8x7b", 2, "prefill", 0, 0),
]


@pytest.mark.parametrize("case", INVERSIONS)
def test_a_faster_pcie_link_no_longer_slows_these_layers(case):
    name, units, phase, token, seed = case
    latencies = [_layer_latency_s(name, units, scale, phase, token, seed) for scale in (0.5, 1.0, 2.0, 4.0)]
    assert all(b <= a * (1 + 1e-9) for a, b in itertools.pairwise(latencies)), latencies


# -- the objective, written out from the timeline's rules, for brute force ---------------------------------


def timeline_problem(rng: np.random.Generator, max_items: int, max_units: int) -> PlacementProblem:
    """Small instances with every term of the timeline's cost: DRAM bins, the outputs' way back, optional NDP
    units, and copied items whose GPU work waits for their copy."""
    units = int(rng.integers(1, max_units + 1))
    n = int(rng.integers(1, max_items + 1))
    ndp, dram, copy_s = np.zeros((n, units)), np.zeros((n, units)), np.zeros((n, units))
    gpu, transfer, staged = np.zeros(n), np.zeros(n), np.zeros(n)
    for i in range(n):
        work = rng.uniform(0.2, 5.0)
        where = slice(None) if rng.random() < 0.6 else int(rng.integers(units))
        share = 1 / units if where == slice(None) else 1.0
        ndp[i, where] = work * share
        dram[i, where] = work * share * rng.uniform(0.3, 1.0)
        gpu[i] = work / rng.uniform(2, 20)
        if rng.random() > 0.25:
            transfer[i] = rng.uniform(0.3, 3.0)
            staged[i] = 100.0
            copy_s[i, where] = transfer[i] * rng.uniform(0.2, 1.0) * share
    return PlacementProblem(
        ndp,
        gpu,
        transfer,
        staged,
        staging_cap_bytes=float("inf") if rng.random() < 0.7 else float(rng.uniform(100, 400)),
        unit_base_s=np.full(units, rng.uniform(0, 0.5)),
        pcie_base_s=float(rng.uniform(0, 0.2)),
        copy_unit_s=copy_s,
        ndp_dram_s=dram,
        result_s=float(rng.uniform(0, 0.8)),
        result_pcie_s=float(rng.uniform(0, 0.4)),
        ndp_optional=bool(rng.random() < 0.8),
        copy_tail=bool(rng.random() < 0.8),
    )


def reference_makespan(p: PlacementProblem, parts: list[tuple]) -> float:
    """``parts[i]`` = (kernel s per unit, DRAM s per unit, PCIe s, GPU s, stays on the units) of item ``i``'s
    choice. Copies run back to back on PCIe, and a copied item's GPU work cannot end before the copies plus its
    own GPU time; the units start after the activations (``unit_base_s``) and end with the later of their kernels
    and their DRAM, then the outputs travel back (``result_s``, ``result_pcie_s`` of it on PCIe after the copies);
    an optional NDP side costs nothing when no item stays on it."""
    units = p.num_units
    on_ndp = any(part[4] for part in parts) or not p.ndp_optional
    pcie = p.pcie_base_s + sum(part[2] for part in parts)
    tails = [part[3] for part in parts if part[2] > 0]
    pcie_end = pcie + max((min(tails) if tails and p.copy_tail else 0.0), p.result_pcie_s if on_ndp else 0.0)
    gpu_end = p.gpu_base_s + sum(part[3] for part in parts)
    unit_end = 0.0
    for u in range(units):
        kernels = sum(part[0][u] for part in parts)
        dram = sum(part[1][u] for part in parts)
        start = p.unit_base_s[u] + p.result_s if on_ndp else 0.0
        unit_end = max(unit_end, start + max(kernels, dram))
    return max(pcie_end, gpu_end, unit_end)


def _plain_parts(p: PlacementProblem, on_gpu) -> list[tuple]:
    parts = []
    for i, g in enumerate(on_gpu):
        if g:
            parts.append((np.zeros(p.num_units), p.copy_unit_s[i], p.transfer_s[i], p.gpu_compute_s[i], False))
        else:
            parts.append((p.ndp_time_s[i], p.ndp_dram_s[i], 0.0, 0.0, True))
    return parts


def test_milp_is_the_optimum_of_the_timeline_objective_by_brute_force():
    rng = np.random.default_rng(23)
    for _ in range(60):
        problem = timeline_problem(rng, max_items=6, max_units=3)
        best = float("inf")
        for on_gpu in itertools.product((False, True), repeat=problem.num_items):
            span = reference_makespan(problem, _plain_parts(problem, on_gpu))
            assert makespan_s(problem, np.array(on_gpu)) == pytest.approx(span, rel=1e-12)
            if is_feasible(problem, np.array(on_gpu)):
                best = min(best, span)
        on_gpu, span = solve_exact(problem)
        assert is_feasible(problem, on_gpu)
        assert span == pytest.approx(best, rel=1e-7)


def test_milp_with_item_modes_is_the_optimum_of_the_timeline_objective_by_brute_force():
    rng = np.random.default_rng(29)
    for _ in range(25):
        problem = timeline_problem(rng, max_items=4, max_units=3)
        n, units = problem.num_items, problem.num_units
        # a split: half the work sliced on the units (its copy's reads on their DRAM), half on the GPU after a copy
        split = ItemMode(
            np.repeat(problem.ndp_time_s.sum(axis=1, keepdims=True) / (2 * units), units, axis=1),
            problem.transfer_s / 2 + 0.05,
            problem.gpu_compute_s / 2 * 1.2,
            problem.transfer_bytes / 2,
            np.repeat(problem.ndp_dram_s.sum(axis=1, keepdims=True) / (2 * units), units, axis=1) + 0.1,
        )
        best = float("inf")
        for choice in itertools.product((-1, 0, 1), repeat=n):
            parts = []
            for i, c in enumerate(choice):
                if c == 1:
                    parts.append((split.unit_s[i], split.dram_s[i], split.pcie_s[i], split.gpu_s[i], True))
                else:
                    parts.append(_plain_parts(problem, [c < 0] * n)[i])
            span = reference_makespan(problem, parts)
            assert makespan_modes_s(problem, (split,), np.array(choice)) == pytest.approx(span, rel=1e-12)
            if staged_bytes_of(problem, (split,), choice) <= problem.staging_cap_bytes * (1 + 1e-9):
                best = min(best, span)
        choice = solve_exact_modes(problem, (split,))
        assert makespan_modes_s(problem, (split,), choice) == pytest.approx(best, rel=1e-7)


def test_packer_is_within_2_percent_median_and_10_percent_p99_of_milp_on_the_timeline_objective():
    # measured on these 300 instances: median 1.000, p99 1.052, max 1.117
    rng = np.random.default_rng(2027)
    ratios = []
    for _ in range(300):
        problem = timeline_problem(rng, max_items=12, max_units=4)
        on_gpu = pack(problem)
        assert is_feasible(problem, on_gpu)
        ratios.append(makespan_s(problem, on_gpu) / solve_exact(problem)[1])
    ratios = np.asarray(ratios)
    assert ratios.min() >= 1 - 1e-9
    assert np.median(ratios) <= 1.02
    assert np.percentile(ratios, 99) <= 1.10


def _list_problem(rng: np.random.Generator) -> PlacementProblem:
    """A :func:`timeline_problem` without a PCIe base (as the policies build them), up to 40 items, a third of them
    made even over the units (the lockstep case, where numpy sums one column pairwise)."""
    p = timeline_problem(rng, 40, 6)
    if rng.random() < 0.35:
        even = {name: np.repeat(getattr(p, name)[:, :1], p.num_units, axis=1) for name in ("ndp_time_s", "ndp_dram_s")}
        p = dataclasses.replace(p, copy_unit_s=np.repeat(p.copy_unit_s[:, :1], p.num_units, axis=1), **even)
    return dataclasses.replace(p, pcie_base_s=0.0)


def test_the_list_paths_give_the_array_paths_bits():
    """best_prefix_lists (MoNDE's prefix step on plain lists) picks what best_prefix picks, and _span_one (one
    placement in plain floats) is span_s to the last bit, on problems with and without lockstep units."""
    rng = np.random.default_rng(2031)
    for _ in range(400):
        p = _list_problem(rng)
        items = {
            "ndp": p.ndp_time_s.tolist(),
            "dram": p.ndp_dram_s.tolist(),
            "copy": p.copy_unit_s.tolist(),
            "transfer": p.transfer_s.tolist(),
            "gpu": p.gpu_compute_s.tolist(),
            "staged": p.transfer_bytes.tolist(),
        }
        order = rng.permutation(p.num_items).tolist()
        terms = (p.unit_base_s.tolist(), p.staging_cap_bytes, p.result_s, p.result_pcie_s)
        assert best_prefix_lists(items, order, *terms, p.ndp_optional, p.copy_tail) == best_prefix(p, order)
        on_gpu = rng.random(p.num_items) < 0.5
        kernels = p.ndp_time_s[~on_gpu].sum(axis=0)
        dram = p.ndp_dram_s[~on_gpu].sum(axis=0) + p.copy_unit_s[on_gpu].sum(axis=0)
        pcie, gpu = float(p.transfer_s[on_gpu].sum()), float(p.gpu_compute_s[on_gpu].sum())
        tail = float(np.where(p.transfer_s > 0, p.gpu_compute_s, np.inf)[on_gpu].min(initial=np.inf))
        left = bool((~on_gpu).any())
        expected = float(span_s(p, pcie, gpu, kernels, dram, tail, left))
        got = _span_one(
            p.pcie_base_s,
            p.gpu_base_s,
            p.unit_base_s.tolist(),
            p.result_s,
            p.result_pcie_s,
            p.ndp_optional,
            p.copy_tail,
            pcie,
            gpu,
            kernels.tolist(),
            dram.tolist(),
            tail,
            left,
        )
        assert got == expected
