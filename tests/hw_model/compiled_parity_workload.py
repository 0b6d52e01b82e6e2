"""Simulates a fixed set of workloads under every policy and prints everything the results hold as JSON.

Run as a script by ``test_compiled_core.py``: once on the installed ``hw_model`` (compiled by mypyc when
``pip install .`` built it) and once on the source tree, whose outputs must be identical. It only reads
``hw_model``; which copy it imports is decided by the interpreter's ``sys.path``.
"""

from __future__ import annotations

import json
import sys

import hw_model
from hw_model.policies import POLICIES
from hw_model.settings import SimulationSettings
from hw_model.simulator import MoESimulator
from hw_model.traces import TraceKnobs, synthetic_trace
from hw_model.workload import ExpertShape, MoELayerShape

LAYERS = [MoELayerShape(f"moe.{i}", 16, 2, ExpertShape(hidden=512, ffn=1024)) for i in range(3)]
WIDE = [MoELayerShape(f"wide.{i}", 64, 6, ExpertShape(hidden=2048, ffn=768)) for i in range(4)]


def layer_record(result) -> dict:
    return {
        "layer": result.layer_index,
        "tokens": result.tokens,
        "latency_s": result.latency_s,
        "bytes_over_host_link": result.bytes_over_host_link,
        "extra": dict(result.extra),
        "placement": {str(e): where for e, where in result.placement.items()},
        "busy": result.busy_by_resource(),
        "events": [[event.resource, event.start_s, event.end_s, event.label] for event in result.events],
    }


def summary_record(sim: MoESimulator) -> dict:
    summary = sim.summary()
    summary.pop("decision_time_median_s")  # measured wall time
    return summary


def run(policy: str, layers: list[MoELayerShape], units: int, decode_steps: int) -> dict:
    trace = synthetic_trace(len(layers), layers[0].num_experts, layers[0].top_k, 24, decode_steps, TraceKnobs(0.8))
    settings = SimulationSettings(ndp_units=units, policy=policy, residency_fraction=0.5)
    sim = MoESimulator.from_settings(settings, layers)
    out: dict = {"prefill": [layer_record(r) for r in sim.simulate_step("prefill", trace.prefill_step_counts())]}
    steps = []
    for token in range(24, trace.num_tokens):
        counts = trace.token_counts(token)
        if token % 3 == 0:  # layer by layer, with the non-expert time between layers and look-ahead hints
            for layer in range(len(layers)):
                sim.advance_time_s(2e-5)
                if layer + 1 < len(layers):
                    sim.predict_next(layer + 1, counts[layer + 1])
                steps.append([layer_record(sim.simulate_layer(layer, counts[layer], "decode"))])
        else:
            predictions = [counts[i + 1] if i + 1 < len(layers) else None for i in range(len(layers))]
            step = sim.simulate_step("decode", counts, gap_before_layer_s=1e-5, predictions=predictions)
            steps.append([step.latency_s, *[layer_record(result) for result in step]])
    out["decode"] = steps
    out["summary"] = summary_record(sim)
    return out


def main() -> None:
    results = {
        "compiled": list(hw_model.compiled_modules()),
        "runs": {
            f"{policy}/{name}/{units}": run(policy, layers, units, steps)
            for policy in POLICIES
            for name, layers, units, steps in (("small", LAYERS, 4, 40), ("wide", WIDE, 2, 12))
        },
    }
    json.dump(results, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main()
