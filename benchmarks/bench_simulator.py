"""Cost of the simulator itself: per layer invocation, one whole request, one decode step of a tiny model.

Measures two copies of ``hw_model`` in child processes, alternating round by round: the **installed** package
(``pip install .`` compiles its hot modules with mypyc, see ``native/compile_hw_model.py``; a child started with
``python -I`` imports only site-packages) and the **source** tree's pure Python (``PYTHONPATH`` = this checkout).
Install from this checkout first, or the installed figures are of another version. Each child prints, measured
on one core (set OMP_NUM_THREADS=1) as CPU time of that process (``time.process_time``, so other jobs on a
shared machine inflate it less than wall time would):

1. microseconds per decode layer invocation over a Qwen3-30B-A3B request (512 prompt + ``--generated``
   tokens, typical skew, ``paper`` preset, 4 NDP units), per policy: in whole steps
   (``MoESimulator.simulate_step``, as ``bench`` and a session's report call it), one layer at a time
   (``simulate_layer``) and, for the source tree only (a compiled simulator does not take a wrapped policy),
   the part of the stepped run spent in the policy's placement (wall time around each ``place`` call);
2. seconds for one 512 + 512-token Qwen3-30B-A3B request end to end (``hw_model.bench.run_job``, which also
   costs the non-expert work), under the default policy, and the part of it synthesising its routing trace;
3. microseconds to simulate one decode step (3 layer invocations) of a tiny 3-layer, 8-expert top-2 model,
   which is what an ``InferenceSession`` run's report pays on top of ONNX Runtime;
4. microseconds per decode step of the per-expert bookkeeping (the drift histograms' update, the prefetcher's
   scores and its re-plan every 32 steps) kept as Python lists and as numpy arrays, alternating, at
   :data:`BOOKKEEPING_SHAPES` layers x experts: where :data:`hw_model.prefetch.LIST_KEPT_CELLS` (the size up to
   which a model keeps lists) should sit, for the installed (compiled) copy.

The best of ``--rounds`` per figure and copy is printed. Goals (issue 13): <= 10 us per layer invocation,
<= 0.5 s per request, tens of us per tiny decode step. With ``--default-bench`` it also times the default
``ndp-ep bench`` (every model, NDP count, policy and skew level, plus the sweeps) once per copy: wall time and
CPU time including its worker processes.

Usage: python benchmarks/bench_simulator.py [--generated 128] [--policies tp+lb+prefetch,monde] [--rounds 3]
       [--default-bench]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_INVOCATION_S = 10e-6
GOAL_REQUEST_S = 0.5
COPIES = ("installed", "source")
BOOKKEEPING_SHAPES = (
    (3, 8),
    (4, 16),
    (6, 16),
    (8, 16),
    (10, 16),
    (8, 32),
    (16, 64),
)  # layers x experts: 24 to 1,024 cells


class _TimedPlacement:
    """A policy whose ``place`` calls are timed (everything else is the policy's own)."""

    def __init__(self, policy) -> None:
        self._policy = policy
        self.seconds = 0.0

    def __getattr__(self, name: str):
        return getattr(self._policy, name)

    def place(self, *args):
        started = time.perf_counter()
        try:
            return self._policy.place(*args)
        finally:
            self.seconds += time.perf_counter() - started


def per_invocation_s(policy: str, generated: int, time_placement: bool) -> dict[str, float]:
    """Seconds per decode layer invocation: whole steps through ``simulate_step`` (as ``bench`` and a session's
    report run them) and one layer at a time through ``simulate_layer``, each on a fresh simulator; and, when
    ``time_placement``, in a third stepped run, the part spent in the policy's ``place`` (wall time around each
    call)."""
    from hw_model.hardware import load_system
    from hw_model.models import get_model
    from hw_model.simulator import MoESimulator
    from hw_model.traces import TraceKnobs, skew_for, synthetic_trace

    model = get_model("qwen3-30b-a3b")
    trace = synthetic_trace(
        model.moe_layers,
        model.num_experts,
        model.top_k,
        512,
        generated,
        TraceKnobs(skew=skew_for(model.name, "typical")),
    )
    steps = [trace.token_counts(token) for token in range(512, trace.num_tokens)]
    invocations = len(steps) * model.moe_layers
    timings = {}
    for mode in ("stepped", "single", "placement") if time_placement else ("stepped", "single"):
        sim = MoESimulator(load_system("paper", 4), model.moe_layer_shapes(), policy)
        sim.simulate_step("prefill", trace.prefill_step_counts())
        timed = None
        if mode == "placement":
            timed = sim.policy_impl = _TimedPlacement(sim.policy_impl)
        started = time.process_time()
        if mode == "single":
            for counts in steps:
                for layer in range(model.moe_layers):
                    sim.simulate_layer(layer, counts[layer], "decode")
        else:
            for counts in steps:
                sim.simulate_step("decode", counts)
        seconds = timed.seconds if timed is not None else time.process_time() - started
        timings[mode] = seconds / invocations
    return timings


def request_s() -> float:
    from hw_model.bench import BenchConfig, Job, run_job
    from hw_model.models import get_model
    from hw_model.settings import SimulationSettings
    from hw_model.traces import skew_for

    model = get_model("qwen3-30b-a3b")
    job = Job(model, SimulationSettings(ndp_units=4), "typical", skew_for(model.name, "typical"))
    started = time.process_time()
    run_job(job, BenchConfig(models=(model.name,), ndp_units=(4,)))
    return time.process_time() - started


def trace_s() -> float:
    """CPU seconds to synthesise the request's routing trace (part of :func:`request_s`)."""
    from hw_model.models import get_model
    from hw_model.traces import TraceKnobs, skew_for, synthetic_trace

    model = get_model("qwen3-30b-a3b")
    knobs = TraceKnobs(skew=skew_for(model.name, "typical"))
    started = time.process_time()
    synthetic_trace(model.moe_layers, model.num_experts, model.top_k, 512, 512, knobs)
    return time.process_time() - started


def tiny_decode_step_s(steps: int = 2000) -> float:
    from hw_model.hardware import load_system
    from hw_model.simulator import MoESimulator
    from hw_model.traces import TraceKnobs, synthetic_trace
    from hw_model.workload import ExpertShape, MoELayerShape

    layers = [MoELayerShape(f"tiny.{i}", 8, 2, ExpertShape(hidden=64, ffn=128)) for i in range(3)]
    sim = MoESimulator(load_system("paper", 4), layers)
    trace = synthetic_trace(3, 8, 2, 16, steps, TraceKnobs(skew=0.5))
    sim.simulate_step("prefill", trace.prefill_step_counts())
    counts = [trace.token_counts(token) for token in range(16, 16 + steps)]
    started = time.process_time()
    for step in counts:
        sim.simulate_step("decode", step)
    return (time.process_time() - started) / steps


def bookkeeping_step_s(layers: int, experts: int, steps: int = 640) -> dict[str, float]:
    """CPU seconds per decode step of the per-expert bookkeeping of a ``layers`` x ``experts`` top-2 model, its
    state kept as lists and as arrays (the best of 5 alternating rounds each): the drift tracker's update, the
    prefetcher's re-plan check (a re-plan every 32 steps) and score update."""
    import numpy as np

    from hw_model.policies import DriftTracker
    from hw_model.prefetch import ExpertPrefetcher, PrefetchConfig

    rng = np.random.default_rng(0)
    counts = np.zeros((steps, layers, experts), dtype=np.int64)
    for step in range(steps):
        for layer in range(layers):
            counts[step, layer, rng.choice(experts, size=2, replace=False)] = 1
    every_layer = range(layers)
    best = {"lists": float("inf"), "arrays": float("inf")}
    for _ in range(5):
        for kind in best:
            as_lists = kind == "lists"
            tracker = DriftTracker(layers, experts, 0.1, as_lists=as_lists)
            config = PrefetchConfig(residency_cap_bytes=layers * experts * 0.3)
            prefetcher = ExpertPrefetcher([experts] * layers, [1.0] * layers, config, as_lists=as_lists)
            prefetcher.add_scores(slice(0, layers), counts[0])
            started = time.process_time()
            for step in counts:
                tracker.update(every_layer, step)
                prefetcher.before_invocation(0, "decode")
                prefetcher.add_scores(slice(0, layers), step)
            best[kind] = min(best[kind], (time.process_time() - started) / steps)
    return best


def measure(policies: list[str], generated: int) -> dict:
    """Every figure of one copy of hw_model (the one this process imports)."""
    import hw_model

    compiled = hw_model.compiled_modules()
    figures: dict = {"hw_model": str(Path(hw_model.__file__).parent), "compiled": list(compiled)}
    for policy in policies:
        figures[policy] = per_invocation_s(policy, generated, time_placement=not compiled)
    figures["request_s"] = request_s()
    figures["trace_s"] = trace_s()
    figures["tiny_step_s"] = tiny_decode_step_s()
    figures["bookkeeping_s"] = {
        f"{layers}x{experts}": bookkeeping_step_s(layers, experts) for layers, experts in BOOKKEEPING_SHAPES
    }
    return figures


def _child(copy: str, args: list[str]) -> subprocess.CompletedProcess:
    """Run ``args`` in a child interpreter that imports the ``installed`` copy (``-I``: site-packages only) or the
    ``source`` tree's."""
    if copy == "installed":
        return subprocess.run([sys.executable, "-I", *args], capture_output=True, text=True, cwd=ROOT.parent)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=env)


def default_bench_s(copy: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of it and its workers) of the default ``ndp-ep bench`` in a child process."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = _child(copy, ["-m", "ndp_ep", "bench"])
    if done.returncode:
        raise SystemExit(f"ndp-ep bench ({copy}) failed: {done.stderr.strip().splitlines()[-1:]}")
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:6.1f} us"


def report(rounds: dict[str, list[dict]], policies: list[str]) -> None:
    """Print the best of the rounds per figure, the installed copy beside the source tree's."""
    installed, source = rounds["installed"], rounds["source"]
    print(f"installed: {installed[0]['hw_model']} (compiled: {', '.join(installed[0]['compiled']) or 'none'})")
    print(f"source:    {source[0]['hw_model']} (pure Python), best of {len(source)} alternating rounds")
    for policy in policies:
        best = {copy: {k: min(r[policy][k] for r in rounds[copy]) for k in rounds[copy][0][policy]} for copy in COPIES}
        stepped, pure = best["installed"]["stepped"], best["source"]["stepped"]
        print(
            f"{policy:16s}: {_us(stepped)} per decode layer invocation in whole steps installed, {_us(pure)} source "
            f"({pure / stepped:.2f}x; goal {GOAL_INVOCATION_S * 1e6:.0f} us: {stepped / GOAL_INVOCATION_S:.2f}x); "
            f"one layer at a time {_us(best['installed']['single'])} / {_us(best['source']['single'])}"
            + (
                f"; source ~{_us(best['source']['placement']).strip()} in place"
                if "placement" in best["source"]
                else ""
            )
        )
    request = {copy: min(r["request_s"] for r in rounds[copy]) for copy in COPIES}
    print(
        f"one 512+512-token Qwen3-30B-A3B request (default policy): {request['installed']:.3f} s installed, "
        f"{request['source']:.3f} s source (goal {GOAL_REQUEST_S} s: {request['installed'] / GOAL_REQUEST_S:.2f}x)"
    )
    trace = min(r["trace_s"] for r in installed)
    print(f"  of it, synthesising its routing trace (48 layers x 128 experts, 1024 tokens): {trace:.3f} s")
    tiny = {copy: min(r["tiny_step_s"] for r in rounds[copy]) for copy in COPIES}
    print(f"one decode step of a tiny 3-layer model: {_us(tiny['installed'])} installed, {_us(tiny['source'])} source")
    from hw_model.prefetch import LIST_KEPT_CELLS

    cells = []
    for shape in installed[0]["bookkeeping_s"]:
        lists, arrays = (min(r["bookkeeping_s"][shape][kind] for r in installed) for kind in ("lists", "arrays"))
        cells.append(f"{shape} {lists * 1e6:.1f}/{arrays * 1e6:.1f}")
    print(
        f"per-expert bookkeeping per decode step, installed, lists/arrays in us (lists up to {LIST_KEPT_CELLS} "
        f"layers x experts): {', '.join(cells)}"
    )
    spread = [r[policies[0]]["stepped"] for r in installed]
    if len(spread) > 1:
        print(
            f"({policies[0]} installed, per round: {', '.join(_us(s).strip() for s in spread)}; "
            f"median {_us(statistics.median(spread)).strip()})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generated", type=int, default=128, help="decode tokens timed per policy")
    parser.add_argument("--policies", default="tp+lb+prefetch,monde,duplex", help="comma-separated policies")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the two copies")
    parser.add_argument("--default-bench", action="store_true", help="also time the default `ndp-ep bench` (minutes)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # a child: measure, print JSON
    args = parser.parse_args()
    policies = args.policies.split(",")
    if args.worker:
        print(json.dumps(measure(policies, args.generated)))
        return
    worker = [
        str(Path(__file__).resolve()),
        "--worker",
        "--generated",
        str(args.generated),
        "--policies",
        args.policies,
    ]
    rounds: dict[str, list[dict]] = {copy: [] for copy in COPIES}
    for _ in range(args.rounds):
        for copy in COPIES:
            done = _child(copy, worker)
            if done.returncode:
                raise SystemExit(f"the {copy} copy failed: {done.stderr.strip()[-2000:]}")
            rounds[copy].append(json.loads(done.stdout))
    report(rounds, policies)
    if args.default_bench:
        for copy in COPIES:
            wall, cpu = default_bench_s(copy)
            print(f"default `ndp-ep bench` (no arguments), {copy}: {wall:.0f} s wall, {cpu:.0f} CPU-s with its workers")


if __name__ == "__main__":
    main()
