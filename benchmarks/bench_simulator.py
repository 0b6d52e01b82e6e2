"""Cost of the simulator itself: per layer invocation, one whole request, one decode step of a tiny model.

Prints, measured in this run on one core (set OMP_NUM_THREADS=1) as CPU time of this process
(``time.process_time``, so other jobs on a shared machine inflate it less than wall time would):

1. microseconds per decode layer invocation over a Qwen3-30B-A3B request (512 prompt + ``--generated``
   tokens, typical skew, ``paper`` preset, 4 NDP units), per policy: in whole steps
   (``MoESimulator.simulate_step``, as ``bench`` and a session's report call it), the part of it spent in the
   policy's placement (a third run, wall time around each ``place`` call), and one layer at a time
   (``simulate_layer``);
2. seconds for one 512 + 512-token Qwen3-30B-A3B request end to end (``hw_model.bench.run_job``, which also
   costs the non-expert work), under the default policy, and the part of it synthesising its routing trace;
3. microseconds to simulate one decode step (3 layer invocations) of a tiny 3-layer, 8-expert top-2 model,
   which is what an ``InferenceSession`` run's report pays on top of ONNX Runtime.

Goals (issue 13): <= 10 us per layer invocation, <= 0.5 s per request, tens of us per tiny decode step.
With ``--default-bench`` it also times the default ``ndp-ep bench`` (every model, NDP count, policy and skew
level, plus the sweeps) in a child process: wall time and CPU time including its worker processes.

Usage: python benchmarks/bench_simulator.py [--generated 128] [--policies tp+lb+prefetch,monde] [--default-bench]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hw_model.bench import BenchConfig, Job, run_job  # noqa: E402
from hw_model.hardware import load_system  # noqa: E402
from hw_model.models import get_model  # noqa: E402
from hw_model.policies import DEFAULT_POLICY  # noqa: E402
from hw_model.simulator import MoESimulator  # noqa: E402
from hw_model.traces import TraceKnobs, skew_for, synthetic_trace  # noqa: E402
from hw_model.workload import ExpertShape, MoELayerShape  # noqa: E402

GOAL_INVOCATION_S = 10e-6
GOAL_REQUEST_S = 0.5


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


def per_invocation_s(policy: str, generated: int) -> tuple[float, float, float]:
    """Seconds per decode layer invocation: whole steps through ``simulate_step`` (as ``bench`` and a session's
    report run them), one layer at a time through ``simulate_layer``, each on a fresh simulator; and, in a third
    stepped run, the part spent in the policy's ``place`` (wall time around each call)."""
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
    timings = []
    for mode in ("stepped", "single", "placement"):
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
        timings.append(seconds / invocations)
    return timings[0], timings[1], timings[2]


def request_s() -> float:
    model = get_model("qwen3-30b-a3b")
    job = Job(model, 4, DEFAULT_POLICY, "typical", skew_for(model.name, "typical"))
    started = time.process_time()
    run_job(job, BenchConfig(models=(model.name,), ndp_units=(4,)))
    return time.process_time() - started


def trace_s() -> float:
    """CPU seconds to synthesise the request's routing trace (part of :func:`request_s`)."""
    model = get_model("qwen3-30b-a3b")
    knobs = TraceKnobs(skew=skew_for(model.name, "typical"))
    started = time.process_time()
    synthetic_trace(model.moe_layers, model.num_experts, model.top_k, 512, 512, knobs)
    return time.process_time() - started


def tiny_decode_step_s(steps: int = 2000) -> float:
    layers = [MoELayerShape(f"tiny.{i}", 8, 2, ExpertShape(hidden=64, ffn=128)) for i in range(3)]
    sim = MoESimulator(load_system("paper", 4), layers)
    trace = synthetic_trace(3, 8, 2, 16, steps, TraceKnobs(skew=0.5))
    sim.simulate_step("prefill", trace.prefill_step_counts())
    counts = [trace.token_counts(token) for token in range(16, 16 + steps)]
    started = time.process_time()
    for step in counts:
        sim.simulate_step("decode", step)
    return (time.process_time() - started) / steps


def default_bench_s() -> tuple[float, float]:
    """(wall seconds, CPU seconds of it and its workers) of the default ``ndp-ep bench`` in a child process."""
    import os
    import resource
    import subprocess

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "ndp_ep", "bench"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generated", type=int, default=128, help="decode tokens timed per policy")
    parser.add_argument("--policies", default=f"{DEFAULT_POLICY},monde,duplex", help="comma-separated policies")
    parser.add_argument("--default-bench", action="store_true", help="also time the default `ndp-ep bench` (minutes)")
    args = parser.parse_args()
    for policy in args.policies.split(","):
        stepped, single, placement = per_invocation_s(policy, args.generated)
        print(
            f"{policy:16s}: {stepped * 1e6:6.1f} us per decode layer invocation in whole steps "
            f"(goal {GOAL_INVOCATION_S * 1e6:.0f} us: {stepped / GOAL_INVOCATION_S:.1f}x; "
            f"~{placement * 1e6:.1f} us of it in the policy's place); {single * 1e6:6.1f} us one layer at a time"
        )
    value = request_s()
    print(
        f"one 512+512-token Qwen3-30B-A3B request ({DEFAULT_POLICY}): {value:.2f} s "
        f"(goal {GOAL_REQUEST_S} s: {value / GOAL_REQUEST_S:.1f}x)"
    )
    print(f"  of it, synthesising its routing trace (48 layers x 128 experts, 1024 tokens): {trace_s():.3f} s")
    print(f"one decode step of a tiny 3-layer model: {tiny_decode_step_s() * 1e6:.1f} us")
    if args.default_bench:
        wall, cpu = default_bench_s()
        print(f"default `ndp-ep bench` (no arguments): {wall:.0f} s wall, {cpu:.0f} CPU-s with its workers")


if __name__ == "__main__":
    main()
