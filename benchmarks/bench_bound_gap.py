"""Ours against the tight causal bound, one change at a time (docs/bench.md, "Closing the gap to the bound").

Per model and NDP count: the bench's own trace (512 + 512 tokens unless told), the causal bound
(:mod:`hw_model.bench_bound`) and ``tp+lb+prefetch`` under each variant of its tuning knobs
(:class:`hw_model.tuning.SimulatorTuning`), each row one change from the default so each is measured on its own, and
the combination. Prints a markdown table of latency and latency / bound. Deterministic (no wall-time figures).

    python benchmarks/bench_bound_gap.py [--models a,b] [--units 4] [--prompt 512] [--generated 512]
        [--variants default,residency=1.0,...,warm-repeat,warm-other-request]
        [--counts ../shared/traces/olmoe_expert_counts/expert_counts.json --domains c4,github]

With ``--counts`` (a count-only file: per-expert selection counts measured on real text, per model, domain and
layer), the trace of OLMoE and Mixtral is drawn from those counts instead of Zipf weights: the prompt and the first
half of the decode from the first domain's, the rest from the second's (a real domain shift); a layer that was not
measured takes the nearest measured layer's counts over its own seeded permutation of the experts.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import numpy as np

from hw_model.bench import BenchConfig, Job, _trace_for, request_latencies_s, run_job
from hw_model.bench_bound import bound_fields
from hw_model.models import MODELS, get_model
from hw_model.settings import DEFAULT_POLICY, SimulationSettings
from hw_model.trace_stats import load_count_file
from hw_model.traces import TraceKnobs, skew_for, weighted_trace

COUNT_FILE_MODELS = {"olmoe-1b-7b": "olmoe", "mixtral-8x7b": "mistral"}  # bench model -> its key in a count file

# the knobs as they were before issue 29's changes; each variant is one change from them, "now" the defaults
BEFORE: dict[str, object] = {"dynamic_staging": 0, "adopt_prefill_copies": 0, "replan_on_residency": 0}
# the knobs as the first round of issue 29 left them (the cold-start bound and the LRU staging in the pool the
# residents leave are not knobs: they hold in every variant)
ROUND2: dict[str, object] = {
    "replan_on_copies": 0,
    "balance_split": 0,
    "prefetch_lazy_eviction": 0,
    "prefetch_change_z": 0.0,
    "prefetch_decay": 0.5,
    "residency_fraction": 0.75,
}
VARIANTS: dict[str, dict[str, object]] = {
    "before": BEFORE,
    "dynamic-staging": {**BEFORE, "dynamic_staging": 1},
    "replan-on-residency": {**BEFORE, "replan_on_residency": 1},
    "adopt-prefill-copies": {**BEFORE, "adopt_prefill_copies": 1},
    "eager-prefetch": {**BEFORE, "eager_prefetch": 1},
    "always-replan": {**BEFORE, "drift_threshold": 0.0},
    # this round's changes (issue 29, second round), each one on its own from ``round2``, where all are off
    "round2": ROUND2,
    "+replan-on-copies": {**ROUND2, "replan_on_copies": 1},
    "+balance-split": {**ROUND2, "balance_split": 1},
    "+lazy-eviction": {**ROUND2, "prefetch_lazy_eviction": 1},
    "+change-detector": {**ROUND2, "prefetch_change_z": 3.0, "prefetch_decay": 1.0},
    "+residency=1.0": {**ROUND2, "residency_fraction": 1.0},
    "now": {},
    "now+residency=1.0": {"residency_fraction": 1.0},
    "now+eager-prefetch": {"eager_prefetch": 1},
    "now+decay=0.8": {"prefetch_decay": 0.8},
}
# the defaults on a session's second request, after one warm-up request on the same simulator (its GPU pool,
# prefetcher and plans kept, as in an ndp_ep.InferenceSession): the warm-up's trace seed, relative to the measured one
# (0: the same request again; 1: another request, drawn with the next seed, whose experts' popularity differs)
WARM_VARIANTS: dict[str, int] = {"warm-repeat": 0, "warm-other-request": 1}


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The options naming the bench workload: models, NDP counts, prompt and generated tokens, seed, skew."""
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--units", default="4")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--generated", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skew", default="typical")


def workload_config(args: argparse.Namespace) -> BenchConfig:
    """The bench configuration of :func:`add_workload_arguments`' options (no sweeps, no Gantt charts)."""
    return BenchConfig(
        models=tuple(args.models.split(",")),
        ndp_units=tuple(int(u) for u in args.units.split(",")),
        prompt_tokens=args.prompt,
        generated_tokens=args.generated,
        seed=args.seed,
        sweeps=False,
        gantt=False,
    )


def measured_weights(counts: dict[str, np.ndarray], model: str, domain: str, layers: int, seed: int) -> np.ndarray:
    """``[layers, experts]`` popularity weights of ``domain`` from a count file's ``<model>/<domain>/<layer>`` lists;
    an unmeasured layer takes the nearest measured one's (the lower on a tie) over a permutation drawn from ``seed``
    and the layer (the same for every domain, so a domain shift moves the same experts)."""
    measured = sorted(int(key.rsplit("/", 1)[1]) for key in counts if key.startswith(f"{model}/{domain}/"))
    if not measured:
        raise SystemExit(f"bench_bound_gap: the count file has no {model}/{domain}/<layer> counts")
    rows = []
    for layer in range(layers):
        nearest = min(measured, key=lambda m: (abs(m - layer), m))
        row = np.asarray(counts[f"{model}/{domain}/{nearest}"], dtype=np.float64)
        if nearest != layer:
            row = row[np.random.default_rng([seed, layer]).permutation(row.size)]
        rows.append(row)
    return np.stack(rows)


def counts_trace(args: argparse.Namespace, name: str, config: BenchConfig):
    """The trace of model ``name`` drawn from the count file's two domains (``--domains``)."""
    model = get_model(name)
    counts = load_count_file(args.counts)
    first, second = args.domains.split(",")
    key = COUNT_FILE_MODELS[name]
    before, after = (measured_weights(counts, key, d, model.moe_layers, args.seed) for d in (first, second))
    knobs = TraceKnobs(shift_at=0.5, seed=args.seed)
    return weighted_trace(before, after, model.top_k, config.prompt_tokens, config.generated_tokens, knobs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.add_argument("--variants", default=",".join([*VARIANTS, *WARM_VARIANTS]))
    parser.add_argument("--counts", help="a count-only file of measured selection counts (OLMoE and Mixtral)")
    parser.add_argument("--domains", default="c4,github", help="the count file's domains before and after the shift")
    args = parser.parse_args(argv)
    if args.counts:
        args.models = ",".join(m for m in args.models.split(",") if m in COUNT_FILE_MODELS)
    variants = args.variants.split(",")
    config = workload_config(args)
    print("| model | NDP | causal bound (cold start), s | " + " | ".join(variants) + " |")
    print("|---|---|---|" + "---|" * len(variants))
    for name in config.models:
        model = get_model(name)
        skew = skew_for(name, args.skew)
        for units in config.ndp_units:
            base = SimulationSettings(hw=config.hw, ndp_units=units)
            cache: dict = {}
            defaults = Job(model, base.replace(policy=DEFAULT_POLICY), args.skew, skew)
            if args.counts:  # the jobs' trace, where _trace_for looks for it
                cache[(name, skew)] = counts_trace(args, name, config)
            trace = _trace_for(defaults, config, cache)
            starts = [trace.prompt_tokens + int(round(0.5 * trace.generated_tokens))]
            reference = run_job(defaults, config, cache).record  # the non-expert time, the same under every variant
            non_expert_s = reference["latency_s"] - reference["expert_latency_s"]
            bound_s = non_expert_s + bound_fields(model, defaults.settings, trace, starts).causal_s
            warm_bound_s = None  # a warm request's prefill may find its experts resident: its own bound
            cells = []
            for variant in variants:
                started = time.monotonic()
                if variant in WARM_VARIANTS:
                    warm_config = dataclasses.replace(config, seed=config.seed + WARM_VARIANTS[variant])
                    warm_up = _trace_for(defaults, warm_config, {})
                    latency_s = request_latencies_s(defaults, config, [warm_up, trace])[1]
                    if warm_bound_s is None:
                        warm = bound_fields(model, defaults.settings, trace, starts, cold_start=False)
                        warm_bound_s = non_expert_s + warm.causal_s
                    cells.append(f"{latency_s:.2f} ({latency_s / warm_bound_s:.3f} of the warm bound)")
                else:
                    settings = base.replace(policy=DEFAULT_POLICY, **VARIANTS[variant])
                    latency_s = run_job(Job(model, settings, args.skew, skew), config, cache).record["latency_s"]
                    cells.append(f"{latency_s:.2f} ({latency_s / bound_s:.3f})")
                print(f"  {name} {units} {variant}: {time.monotonic() - started:.0f} s", file=sys.stderr)
            print(f"| {name} | {units} | {bound_s:.2f} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
