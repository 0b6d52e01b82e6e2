"""Decision time of the run-time packer (hw_model.scheduler.pack) for 128 experts x 6 NDP units.

Problems are built the way the ``tp+lb+prefetch`` policy builds them for a Qwen3-30B-A3B prefill layer
(128 experts, top-8, 512 prompt tokens routed by a calibrated synthetic trace, every expert sliced over
6 NDP-DIMMs of the ``paper`` preset, a random quarter of experts resident on the GPU; a copy of a non-resident
expert reads its source DIMMs, channel-capped, and takes that DRAM time from their NDP cores). A second set uses
the whole-expert layout (each expert on one home unit), which is harder for the packer.

Prints the median decision time in microseconds and its ratio to the 200 us target, measured in this run.

With ``--richer N``, instead: the quality of the extensions' decisions (``tp+lb+prefetch+vtp``: per expert on
the GPU, sliced over every unit, or whole on its home unit, each unit its own bin; ``tp+lb+prefetch+split``) against the
exact optimum of the richer problem (``hw_model.oracles.solve_exact_modes``, a MILP; per expert: the GPU,
sliced, whole on its home unit, or 1/k on the GPU and the rest sliced, k = 2..8), on N real invocations per
(model, NDP units, phase): decode (top-k experts, one token each) and a 16-token prefill, a random quarter of the
active experts resident. Also against the same optimum: ours' packer (every expert sliced or on the GPU), the
exact optimum of ours' problem (what the richer choices could gain at best) and the split extension's choice.
Usage: python benchmarks/bench_scheduler.py [--instances 200] [--repeats 5] [--richer 20]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hw_model.cost import expert_shard_time_s  # noqa: E402
from hw_model.hardware import load_system  # noqa: E402
from hw_model.layout import InvocationLayout  # noqa: E402
from hw_model.models import get_model  # noqa: E402
from hw_model.oracles import makespan_modes_s, solve_exact, solve_exact_modes  # noqa: E402
from hw_model.policies import ExpertCosts, richer_choices, richer_problem  # noqa: E402
from hw_model.scheduler import PlacementProblem, pack  # noqa: E402
from hw_model.simulator import MoESimulator  # noqa: E402
from hw_model.traces import TraceKnobs, skew_for, synthetic_trace  # noqa: E402

TARGET_S = 200e-6
UNITS = 6


def build_problems(instances: int, sliced: bool, seed: int = 0) -> list[PlacementProblem]:
    model = get_model("qwen3-30b-a3b")
    system = load_system("paper", UNITS)
    expert = model.expert
    rng = np.random.default_rng(seed)
    trace = synthetic_trace(
        instances, model.num_experts, model.top_k, 512, 0, TraceKnobs(skew=skew_for(model.name, "typical"), seed=seed)
    )
    costs = ExpertCosts(system)
    sources = UNITS if sliced else 1
    transfer_s = costs.transfer_s(expert, sources)
    read_s = costs.copy_read_s(expert, sources)  # DRAM time a copy takes from each DIMM it reads
    problems = []
    for layer in range(instances):
        counts = trace.prefill_counts(layer)
        active = np.flatnonzero(counts)
        resident = rng.random(active.size) < 0.25
        ndp = np.zeros((active.size, UNITS))
        copy = np.zeros((active.size, UNITS))
        for i, e in enumerate(active):
            if sliced:
                ndp[i, :] = expert_shard_time_s(system.ndp_unit, expert, int(counts[e]), UNITS)
                copy[i, :] = 0.0 if resident[i] else read_s
            else:
                ndp[i, e % UNITS] = expert_shard_time_s(system.ndp_unit, expert, int(counts[e]), 1)
                copy[i, e % UNITS] = 0.0 if resident[i] else read_s
        gpu = np.array([expert_shard_time_s(system.gpu, expert, int(counts[e])) for e in active])
        problems.append(
            PlacementProblem(
                ndp_time_s=ndp,
                gpu_compute_s=gpu,
                transfer_s=np.where(resident, 0.0, transfer_s),
                transfer_bytes=np.where(resident, 0.0, expert.weight_bytes()),
                staging_cap_bytes=4e9,
                copy_unit_s=copy,
            )
        )
    return problems


def median_decision_time_s(problems: list[PlacementProblem], repeats: int) -> float:
    times = []
    for problem in problems:
        pack(problem)  # warm caches
        for _ in range(repeats):
            started = time.perf_counter()
            pack(problem)
            times.append(time.perf_counter() - started)
    return float(np.median(times))


RICHER_MODELS = ("qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v2-lite", "olmoe-1b-7b")
RICHER_DECISIONS = {
    "tp+lb+prefetch": "tp+lb+prefetch's packer (every expert sliced or on the GPU)",
    "sliced optimum": "exact optimum with every expert sliced or on the GPU",
    "tp+lb+prefetch+vtp": "tp+lb+prefetch+vtp (choose_whole + packer, or all sliced)",
    "tp+lb+prefetch+split": "tp+lb+prefetch+split (the packer, then one expert split)",
}


def richer_ratios(instances: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Per real invocation, each decision's makespan over the richer problem's exact optimum (every expert on the
    GPU, sliced, whole on its home unit, or 1/k on the GPU and the rest sliced; see the module docstring)."""
    rng = np.random.default_rng(seed)
    ratios: dict[str, list[float]] = {key: [] for key in RICHER_DECISIONS}
    for name in RICHER_MODELS:
        model = get_model(name)
        for units in (2, 4, 6):
            sim = MoESimulator(load_system("paper", units), model.moe_layer_shapes()[:1], "tp+lb+prefetch+vtp")
            for tokens_per_step in (1, 16):
                for _ in range(instances):
                    counts = np.zeros(model.num_experts, dtype=np.int64)
                    for _ in range(tokens_per_step):
                        counts[rng.choice(model.num_experts, model.top_k, replace=False)] += 1
                    active = np.flatnonzero(counts).tolist()
                    out = InvocationLayout(sim.context, sim._state, 0, active, counts[active].tolist())
                    resident = (rng.random(len(active)) < 0.25).tolist()
                    problem, modes = richer_problem(sim.context, out, resident)
                    optimum = makespan_modes_s(problem, modes, solve_exact_modes(problem, modes))
                    spans = {
                        policy: makespan_modes_s(problem, modes, choice)
                        for policy, choice in richer_choices(sim.context, out, resident, problem).items()
                    }
                    spans["sliced optimum"] = solve_exact(problem)[1]
                    for key, span in spans.items():
                        ratios[key].append(span / optimum)
    return {key: np.asarray(values) for key, values in ratios.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--richer", type=int, metavar="N", help="instead: decision quality on the richer problem")
    args = parser.parse_args()
    if args.richer:
        ratios = richer_ratios(args.richer)
        count = len(ratios["tp+lb+prefetch"])
        print(f"makespan over the richer problem's optimum (GPU / sliced / whole / split), {count} invocations")
        for key, label in RICHER_DECISIONS.items():
            r = ratios[key]
            print(
                f"{label:58s} median {np.median(r):.3f}  p90 {np.percentile(r, 90):.3f}  p99 {np.percentile(r, 99):.3f}"
                f"  max {r.max():.3f}  at the optimum {np.mean(r <= 1 + 1e-9):.0%}"
            )
        return 0
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"packer decision time, 128 experts x {UNITS} NDP units + GPU ({args.instances} layers x {args.repeats})")
    print(f"machine load average (1 min): {load:.2f} on {os.cpu_count()} CPUs")
    for name, sliced in (("tensor-parallel layout (tp+lb+prefetch)", True), ("whole-expert layout", False)):
        problems = build_problems(args.instances, sliced)
        items = int(np.median([p.num_items for p in problems]))
        median_s = median_decision_time_s(problems, args.repeats)
        print(
            f"{name:42s} items {items:3d}  median {median_s * 1e6:7.1f} us  "
            f"ratio to 200 us target {median_s / TARGET_S:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
