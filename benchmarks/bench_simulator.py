"""Cost of the simulator itself: per layer invocation, one whole request, one decode step of a tiny model.

Prints, measured in this run on one core (set OMP_NUM_THREADS=1):

1. microseconds per ``MoESimulator.simulate_layer`` call over the decode invocations of a Qwen3-30B-A3B
   request (512 prompt + ``--generated`` tokens, typical skew, ``paper`` preset, 4 NDP units), per policy;
2. seconds for one 512 + 512-token Qwen3-30B-A3B request end to end (``hw_model.bench.run_job``, which also
   costs the non-expert work), under the default policy;
3. microseconds to simulate one decode step (3 layer invocations) of a tiny 3-layer, 8-expert top-2 model,
   which is what an ``InferenceSession`` run's report pays on top of ONNX Runtime.

Goals (issue 13): <= 10 us per layer invocation, <= 0.5 s per request, tens of us per tiny decode step.
Usage: python benchmarks/bench_simulator.py [--generated 128] [--policies tp+lb+prefetch,monde]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hw_model.bench import BenchConfig, Job, run_job  # noqa: E402
from hw_model.hardware import load_system  # noqa: E402
from hw_model.models import get_model  # noqa: E402
from hw_model.policies import DEFAULT_POLICY  # noqa: E402
from hw_model.simulator import MoESimulator  # noqa: E402
from hw_model.traces import TraceKnobs, skew_for, synthetic_trace  # noqa: E402
from hw_model.workload import ExpertShape, MoELayerShape  # noqa: E402

GOAL_INVOCATION_S = 10e-6
GOAL_REQUEST_S = 0.5


def per_invocation_s(policy: str, generated: int) -> float:
    model = get_model("qwen3-30b-a3b")
    trace = synthetic_trace(
        model.moe_layers,
        model.num_experts,
        model.top_k,
        512,
        generated,
        TraceKnobs(skew=skew_for(model.name, "typical")),
    )
    sim = MoESimulator(load_system("paper", 4), model.moe_layer_shapes(), policy)
    for layer in range(model.moe_layers):
        sim.simulate_layer(layer, trace.prefill_counts(layer), "prefill")
    counts = [
        (layer, trace.counts(layer, token, token + 1))
        for token in range(512, trace.num_tokens)
        for layer in range(model.moe_layers)
    ]
    started = time.perf_counter()
    for layer, c in counts:
        sim.simulate_layer(layer, c, "decode")
    return (time.perf_counter() - started) / len(counts)


def request_s() -> float:
    model = get_model("qwen3-30b-a3b")
    job = Job(model, 4, DEFAULT_POLICY, "typical", skew_for(model.name, "typical"))
    started = time.perf_counter()
    run_job(job, BenchConfig(models=(model.name,), ndp_units=(4,)))
    return time.perf_counter() - started


def tiny_decode_step_s(steps: int = 2000) -> float:
    layers = [MoELayerShape(f"tiny.{i}", 8, 2, ExpertShape(hidden=64, ffn=128)) for i in range(3)]
    sim = MoESimulator(load_system("paper", 4), layers)
    trace = synthetic_trace(3, 8, 2, 16, steps, TraceKnobs(skew=0.5))
    for layer in range(3):
        sim.simulate_layer(layer, trace.prefill_counts(layer), "prefill")
    started = time.perf_counter()
    for token in range(16, 16 + steps):
        for layer in range(3):
            sim.simulate_layer(layer, trace.counts(layer, token, token + 1), "decode")
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generated", type=int, default=128, help="decode tokens timed per policy")
    parser.add_argument("--policies", default=f"{DEFAULT_POLICY},monde,duplex", help="comma-separated policies")
    args = parser.parse_args()
    for policy in args.policies.split(","):
        value = per_invocation_s(policy, args.generated)
        print(
            f"simulate_layer, {policy:16s}: {value * 1e6:8.1f} us per decode invocation "
            f"(goal {GOAL_INVOCATION_S * 1e6:.0f} us: {value / GOAL_INVOCATION_S:.1f}x)"
        )
    value = request_s()
    print(
        f"one 512+512-token Qwen3-30B-A3B request ({DEFAULT_POLICY}): {value:.2f} s "
        f"(goal {GOAL_REQUEST_S} s: {value / GOAL_REQUEST_S:.1f}x)"
    )
    print(f"one decode step of a tiny 3-layer model: {tiny_decode_step_s() * 1e6:.1f} us")


if __name__ == "__main__":
    main()
