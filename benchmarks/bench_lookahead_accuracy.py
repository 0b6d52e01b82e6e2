"""What look-ahead prefetch buys as a function of the predictor's accuracy, against the bounds (docs/bench.md,
"Look-ahead accuracy").

Per model and NDP count: the bench's own trace (512 + 512 tokens unless told), the causal and perfect-foresight
bounds (:mod:`hw_model.bench_bound`), ours (``tp+lb+prefetch``) and ``tp+lb+prefetch+lookahead`` with a predictor
that names each of the next layer's ``top_k`` slots right with probability ``accuracy`` (the bench's
``lookahead_accuracy``; :func:`hw_model.traces.predicted_counts`), for each accuracy asked. Prints a markdown table
of latency, s (latency / causal bound). Deterministic (no wall-time figures).

    python benchmarks/bench_lookahead_accuracy.py [--models a,b] [--units 4] [--accuracies 0.5,0.6,...,1.0]
        [--prompt 512] [--generated 512] [--seed 0] [--skew typical] [--knobs eager_prefetch=1]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_bound_gap import add_workload_arguments, workload_config  # noqa: E402
from hw_model.bench import Job, _trace_for, run_job  # noqa: E402
from hw_model.bench_bound import bound_fields  # noqa: E402
from hw_model.models import get_model  # noqa: E402
from hw_model.settings import DEFAULT_POLICY, SimulationSettings  # noqa: E402
from hw_model.traces import skew_for  # noqa: E402

LOOKAHEAD_POLICY = "tp+lb+prefetch+lookahead"
DEFAULT_ACCURACIES = "0.5,0.6,0.7,0.8,0.9,1.0"


def _cell(latency_s: float, causal_s: float) -> str:
    return f"{latency_s:.2f} ({latency_s / causal_s:.3f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.add_argument("--accuracies", default=DEFAULT_ACCURACIES)
    parser.add_argument(
        "--knobs",
        default="",
        help="tuning knobs of the look-ahead runs, e.g. eager_prefetch=1 (copies also while the DIMMs work)",
    )
    args = parser.parse_args(argv)
    accuracies = [float(a) for a in args.accuracies.split(",")]
    knobs = {
        k: int(v) if v.isdigit() else float(v) for k, v in (pair.split("=") for pair in args.knobs.split(",") if pair)
    }
    config = workload_config(args)
    print(
        "| model | NDP | causal bound, s | foresight bound, s | ours | "
        + " | ".join(f"look-ahead {a:g}" for a in accuracies)
        + " |"
    )
    print("|---|---|---|---|---|" + "---|" * len(accuracies))
    for name in config.models:
        model = get_model(name)
        skew = skew_for(name, args.skew)
        for units in config.ndp_units:
            started = time.monotonic()
            cache: dict = {}
            ours_settings = SimulationSettings(hw=config.hw, ndp_units=units, policy=DEFAULT_POLICY)
            ours = run_job(Job(model, ours_settings, args.skew, skew), config, cache).record
            trace = _trace_for(Job(model, ours_settings, args.skew, skew), config, cache)
            starts = [trace.prompt_tokens + int(round(0.5 * trace.generated_tokens))]
            bound = bound_fields(model, ours_settings, trace, starts)
            non_expert_s = ours["latency_s"] - ours["expert_latency_s"]
            causal_s, foresight_s = non_expert_s + bound.causal_s, non_expert_s + bound.foresight_s

            cells = [_cell(ours["latency_s"], causal_s)]
            lookahead_settings = ours_settings.replace(policy=LOOKAHEAD_POLICY, **knobs)
            for accuracy in accuracies:
                at = dataclasses.replace(config, lookahead_accuracy=accuracy)
                record = run_job(Job(model, lookahead_settings, args.skew, skew), at, cache).record
                cells.append(_cell(record["latency_s"], causal_s))
            print(
                f"| {name} | {units} | {causal_s:.2f} | {foresight_s:.2f} ({foresight_s / causal_s:.3f}) | "
                + " | ".join(cells)
                + " |",
                flush=True,
            )
            print(f"  {name} {units}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
