"""Trace-driven end-to-end benchmark: models x NDP-unit counts x policies on one hardware preset.

For each model a seeded synthetic routing trace (skew calibrated per model, see :mod:`hw_model.traces`) or
a trace file drives one :class:`hw_model.simulator.MoESimulator` per (NDP count, policy)::

    prefill (P tokens):  per layer  attention(P) [+ shared experts] + MoE layer(counts of P tokens)
    decode  (G steps):   per layer  attention(1, context) [+ shared experts] + MoE layer(that token's experts)
                         + LM head per step

Non-expert ops run on the GPU for every policy (:mod:`hw_model.models`); their time is handed to the
simulator (``advance_time_s``) so the prefetcher can use the idle PCIe link. Results: a latency table
(speedup over the strongest baseline of each row and over ``monde``), sweeps across trace skew, prefetch
budget, drift reuse and small-MoE shapes. This module runs; :mod:`hw_model.bench_tables` formats the tables
(markdown) and :mod:`hw_model.bench_plots` draws the PNG plots (matplotlib, the ``plot`` extra).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from hw_model.bench_bound import bound_fields
from hw_model.bench_energy import energy_fields
from hw_model.energy import EnergyReport
from hw_model.errors import SettingsError, WorkloadError
from hw_model.models import MODELS, ModelConfig, get_model, sweep_model
from hw_model.policies import POLICIES, get_policy, policy_names
from hw_model.settings import DEFAULT_HW, DEFAULT_POLICY, SimulationSettings
from hw_model.simulator import MoESimulator
from hw_model.traces import (
    DEFAULT_SKEW_LEVELS,
    RoutingTrace,
    TraceKnobs,
    load_trace,
    predicted_counts,
    skew_for,
    synthetic_trace,
)
from hw_model.tuning import DEFAULT_RESIDENCY_FRACTION
from ndp_io import write_text
from ndp_io.workers import die_with_parent, terminate_on_signal, worker_count

BASELINE_POLICY = "monde"
BASELINE_POLICIES = policy_names("baseline")
OURS_POLICY = DEFAULT_POLICY
GANTT_POLICIES = ("monde+cache", "tp", OURS_POLICY)
PREFETCH_FRACTIONS = tuple(sorted({0.25, 0.5, 0.75, 0.9, 1.0, DEFAULT_RESIDENCY_FRACTION}))
SWEEP_EXPERTS = (2, 4, 8)
SWEEP_HIDDEN = (1024, 2048, 4096)
SWEEP_LAYERS = 32  # Mixtral-like depth, so the experts do not all fit in GPU memory
# the skew sweep reruns ours and the baselines that are strongest somewhere in the main table (the others trail
# them in every row of docs/bench.md), to keep the default run short
SKEW_SWEEP_POLICIES = ("monde+cache", "duplex", OURS_POLICY)
ALWAYS_RECOMPUTE = 0.0  # drift threshold of the "recompute at every invocation" comparison


@dataclass(frozen=True)
class BenchConfig:
    """What to run. ``skew_levels`` beyond the first are swept at ``default_units`` only."""

    hw: str = DEFAULT_HW
    ndp_units: tuple[int, ...] = (2, 4, 6)
    models: tuple[str, ...] = tuple(MODELS)
    policies: tuple[str, ...] = POLICIES
    skew_levels: tuple[str, ...] = ("typical", "low", "high")
    skew_override: float | None = None
    locality: float = 0.0
    shift_at: float | None = 0.5
    prompt_tokens: int = 512
    generated_tokens: int = 512
    seed: int = 0
    trace_file: str | None = None
    sweeps: bool = True
    gantt: bool = True
    default_units: int = 4
    lookahead_accuracy: float = 0.8
    bound: bool = True  # the tight bounds of each main-table and skew row (hw_model.bench_bound)
    placement: str | None = None  # a placement file (hw_model/pins.py) every job simulates with

    def __post_init__(self) -> None:
        if not self.ndp_units or any(n < 0 for n in self.ndp_units):
            raise WorkloadError("ndp_units must be a non-empty list of non-negative integers")
        for name in self.models:
            get_model(name)
        for policy in self.policies:
            get_policy(policy)
        for level in self.skew_levels:
            if level not in DEFAULT_SKEW_LEVELS:
                raise WorkloadError(f"unknown skew level {level!r} (known: {', '.join(DEFAULT_SKEW_LEVELS)})")
        if not 0.0 <= self.lookahead_accuracy <= 1.0:
            raise WorkloadError(f"lookahead_accuracy must be in [0, 1], got {self.lookahead_accuracy}")
        if self.prompt_tokens < 1 or self.generated_tokens < 1:
            raise WorkloadError("prompt and generated token counts must be positive")
        # the trace knobs' own checks, here rather than at every job (a NaN locality failed each point of a sweep,
        # which still exited 0)
        TraceKnobs(locality=self.locality, shift_at=self.shift_at, seed=self.seed)


@dataclass(frozen=True)
class Job:
    """One simulation of the bench: a model under ``settings`` (hardware, NDP units, policy, knobs) on a trace."""

    model: ModelConfig
    settings: SimulationSettings
    skew_level: str
    skew: float
    section: str = "main"
    want_gantt: bool = False

    @property
    def ndp_units(self) -> int:
        return self.settings.system.num_ndp_units

    @property
    def policy(self) -> str:
        return self.settings.policy


@dataclass
class JobResult:
    record: dict[str, Any]
    gantt: dict[str, list[tuple[str, float, float, str]]] = field(default_factory=dict)


def _trace_for(job: Job, config: BenchConfig, cache: dict) -> RoutingTrace:
    key = (job.model.name, job.skew)
    if key not in cache:
        if config.trace_file:
            trace = load_trace(config.trace_file)
            if trace.num_experts != job.model.num_experts or trace.top_k != job.model.top_k:
                raise WorkloadError(
                    f"trace has {trace.num_experts} experts top-{trace.top_k}; {job.model.name} needs "
                    f"{job.model.num_experts} top-{job.model.top_k}"
                )
            if trace.num_layers < job.model.moe_layers:
                raise WorkloadError(
                    f"trace has {trace.num_layers} layers; {job.model.name} needs {job.model.moe_layers}"
                )
        else:
            knobs = TraceKnobs(skew=job.skew, locality=config.locality, shift_at=config.shift_at, seed=config.seed)
            trace = synthetic_trace(
                job.model.moe_layers,
                job.model.num_experts,
                job.model.top_k,
                config.prompt_tokens,
                config.generated_tokens,
                knobs,
            )
        cache[key] = trace
    return cache[key]


_COUNTS_BATCH = 64  # decode tokens whose routing counts run_job takes from the trace at once


def run_job(job: Job, config: BenchConfig, trace_cache: dict | None = None) -> JobResult:
    """Simulate one (model, NDP count, policy, trace) end to end; deterministic."""
    trace_cache = {} if trace_cache is None else trace_cache
    model = job.model
    trace = _trace_for(job, config, trace_cache)
    reserved = model.non_expert_weight_bytes() + model.kv_cache_bytes(trace.num_tokens)
    sim = MoESimulator.from_settings(job.settings, model.moe_layer_shapes(), gpu_reserved_bytes=reserved)
    gantt: dict[str, list[tuple[str, float, float, str]]] = {}
    prefill_s, prefill_energy = _simulate_prefill(job, trace, sim, gantt)
    decode_s, step_times = _simulate_decode(job, config, trace, sim, gantt)
    return JobResult(_job_record(job, config, trace, sim, prefill_s, decode_s, step_times, prefill_energy), gantt)


def request_latencies_s(job: Job, config: BenchConfig, traces: Sequence[RoutingTrace]) -> list[float]:
    """End-to-end seconds of each of ``traces`` run as one session's requests, back to back on one simulator (its
    GPU pool, prefetcher and placements carried from one request to the next, as in an
    :class:`ndp_ep.InferenceSession`); the GPU memory reserved for the longest request's KV cache."""
    if not traces:
        raise WorkloadError("request_latencies_s needs at least one trace")
    model = job.model
    reserved = model.non_expert_weight_bytes() + model.kv_cache_bytes(max(t.num_tokens for t in traces))
    sim = MoESimulator.from_settings(job.settings, model.moe_layer_shapes(), gpu_reserved_bytes=reserved)
    latencies = []
    for trace in traces:
        prefill_s, _ = _simulate_prefill(job, trace, sim, {})
        decode_s, _ = _simulate_decode(job, config, trace, sim, {})
        latencies.append(prefill_s + decode_s)
    return latencies


def _simulate_prefill(
    job: Job, trace: RoutingTrace, sim: MoESimulator, gantt: dict[str, list[tuple[str, float, float, str]]]
) -> tuple[float, EnergyReport | None]:
    """The prefill, one invocation per layer over the whole prompt: its seconds and energy (its Gantt timeline
    into ``gantt`` when the job wants one)."""
    model = job.model
    system = job.settings.system
    prompt = trace.prompt_tokens
    layers = model.moe_layers
    attention = model.attention_time_s(system, prompt, max(1, prompt // 2))
    per_layer_other = attention + model.shared_expert_time_s(system, prompt)
    dense = model.dense_layers * attention + model.dense_ffn_time_s(system, prompt)
    prefill_s = dense + model.lm_head_time_s(system, 1)
    sim.advance_time_s(dense)
    step = sim.simulate_step("prefill", trace.prefill_step_counts(layers), gap_before_layer_s=per_layer_other)
    prefill_s += layers * per_layer_other + step.latency_s
    prefill_energy = sim.energy(prefill_s, extra_gpu_busy_s=prefill_s - step.latency_s)
    if job.want_gantt:
        gantt["prefill"] = [(e.resource, e.start_s, e.end_s, e.label) for e in step[0].events]
    return prefill_s, prefill_energy


def _simulate_decode(
    job: Job,
    config: BenchConfig,
    trace: RoutingTrace,
    sim: MoESimulator,
    gantt: dict[str, list[tuple[str, float, float, str]]],
) -> tuple[float, list[float]]:
    """The decode, one step per generated token: its seconds and each step's (the middle step's Gantt timeline
    into ``gantt`` when the job wants one)."""
    model = job.model
    system = job.settings.system
    prompt = trace.prompt_tokens
    layers = model.moe_layers
    decode_s = 0.0
    step_times: list[float] = []
    lookahead = get_policy(job.policy).lookahead
    predictor = np.random.default_rng(config.seed + 1)
    gantt_step = prompt + trace.generated_tokens // 2
    for token in range(prompt, trace.num_tokens):
        if (token - prompt) % _COUNTS_BATCH == 0:  # the routing of the next tokens, one bincount for all
            batch = trace.tokens_counts(token, min(token + _COUNTS_BATCH, trace.num_tokens), layers)
        context = token + 1
        attention = model.attention_time_s(system, 1, context)
        per_layer_other = attention + model.shared_expert_time_s(system, 1)
        dense = model.dense_layers * attention + model.dense_ffn_time_s(system, 1)
        sim.advance_time_s(dense)
        predictions = None
        if lookahead:  # pre-gating: layer l's hidden state predicts layer l+1
            predictions = [
                predicted_counts(trace, layer + 1, token, config.lookahead_accuracy, predictor)
                if layer + 1 < layers
                else None
                for layer in range(layers)
            ]
        counts = batch[(token - prompt) % _COUNTS_BATCH]
        step = sim.simulate_step("decode", counts, gap_before_layer_s=per_layer_other, predictions=predictions)
        step_s = dense + model.lm_head_time_s(system, 1) + layers * per_layer_other + step.latency_s
        if job.want_gantt and token == gantt_step:
            gantt["decode"] = [(e.resource, e.start_s, e.end_s, e.label) for e in step[0].events]
        decode_s += step_s
        step_times.append(step_s)
    return decode_s, step_times


def _job_record(
    job: Job,
    config: BenchConfig,
    trace: RoutingTrace,
    sim: MoESimulator,
    prefill_s: float,
    decode_s: float,
    step_times: list[float],
    prefill_energy: EnergyReport | None,
) -> dict[str, Any]:
    """The job's row: latencies, utilisation, the simulator's counters and the energy fields."""
    model = job.model
    layers = model.moe_layers
    prompt = trace.prompt_tokens
    summary = sim.summary()
    total = prefill_s + decode_s
    expert_s = summary["expert_latency_prefill_s"] + summary["expert_latency_decode_s"]
    busy = summary["busy_s"]
    gpu_busy = busy.get("gpu", 0.0) + (total - expert_s)  # non-expert ops keep the GPU busy
    ndp_busy = [busy.get(f"ndp{u}", 0.0) for u in range(job.ndp_units)]
    record: dict[str, Any] = {
        "model": model.name,
        "ndp_units": job.ndp_units,
        "policy": job.policy,
        "latency_s": total,
        "feasible": summary["feasible"],
        "infeasible_reason": summary["infeasible_reason"],
        "speedup_vs_monde": None,
        "speedup_vs_best_baseline": None,
        "best_baseline": None,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "expert_latency_s": expert_s,
        "expert_latency_prefill_s": summary["expert_latency_prefill_s"],
        "decode_ms_per_token": 1e3 * decode_s / max(1, trace.generated_tokens),
        "decode_p50_ms": 1e3 * float(np.percentile(step_times, 50)),
        "decode_p90_ms": 1e3 * float(np.percentile(step_times, 90)),
        "decode_p99_ms": 1e3 * float(np.percentile(step_times, 99)),
        "hw": config.hw,
        "skew_level": job.skew_level,
        "skew": job.skew,
        "residency_fraction": job.settings.residency_fraction,
        "drift_threshold": job.settings.drift_threshold,
        "section": job.section,
        "utilisation": {
            "gpu": gpu_busy / total,
            "pcie": busy.get("pcie", 0.0) / total,
            "ndp_mean": float(np.mean(ndp_busy)) / total if ndp_busy else 0.0,
        },
        "placement_recomputations": summary["placement_recomputations"],
        "placement_reuses": summary["placement_reuses"],
        "recomputations_per_100_tokens": 100.0
        * summary["decode_placement_recomputations"]
        / max(1, layers * trace.generated_tokens),
        "gpu_pool_bytes": summary["gpu_pool_bytes"],
        "decision_time_median_us": 1e6 * summary["decision_time_median_s"],
        "host_to_gpu_bytes": summary["host_to_gpu_bytes"],
        "on_demand_weight_bytes": summary["on_demand_weight_bytes"],
        "residency_cap_bytes": summary["residency_cap_bytes"],
    }
    for key in ("prefetch_hits", "prefetch_misses", "prefetch_hit_rate", "prefetch_bytes_moved"):
        if key in summary:
            record[key] = summary[key]
    for key in ("power_capped_invocations", "over_power_cap_invocations"):
        if key in summary:
            record[key] = summary[key]
    for key in ("cache_hits", "cache_misses", "cache_hit_rate", "cache_bytes_moved", "pin_cost_s"):
        if key in summary:
            record[key] = summary[key]
    energy = sim.energy(total, extra_gpu_busy_s=total - expert_s)
    record.update(
        energy_fields(
            energy,
            prefill_energy,
            simulator=sim.energy(),
            latency_s=total,
            prompt_tokens=prompt,
            generated_tokens=trace.generated_tokens,
        )
    )
    return record


_WORKER_CACHE: dict = {}


def _worker(args: tuple[Job, BenchConfig]) -> JobResult:
    job, config = args
    return run_job(job, config, _WORKER_CACHE)


def plan_jobs(config: BenchConfig) -> list[Job]:
    """Every simulation the bench runs: the main table, then the sweeps."""
    jobs: list[Job] = []
    main_level = config.skew_levels[0]
    base = SimulationSettings(hw=config.hw, placement=config.placement)
    by_units = {units: base.replace(ndp_units=units) for units in {*config.ndp_units, config.default_units}}

    def settings(units: int, policy: str, **knobs: float) -> SimulationSettings:
        return by_units[units].replace(policy=policy, **knobs)

    def skew(model: ModelConfig, level: str) -> float:
        return config.skew_override if config.skew_override is not None else skew_for(model.name, level)

    for name in config.models:
        model = get_model(name)
        for units in config.ndp_units:
            for policy in config.policies:
                want_gantt = config.gantt and units == config.default_units and policy in GANTT_POLICIES
                jobs.append(
                    Job(model, settings(units, policy), main_level, skew(model, main_level), want_gantt=want_gantt)
                )
    if not config.sweeps:
        return jobs
    units = config.default_units
    for name in config.models:
        model = get_model(name)
        for level in config.skew_levels[1:]:
            for policy in config.policies:
                if policy in SKEW_SWEEP_POLICIES:
                    jobs.append(Job(model, settings(units, policy), level, skew(model, level), section="skew"))
        if OURS_POLICY in config.policies and units in config.ndp_units:
            for fraction in PREFETCH_FRACTIONS:
                if fraction != DEFAULT_RESIDENCY_FRACTION:  # the default is the main table's run
                    ours = settings(units, OURS_POLICY, residency_fraction=fraction)
                    jobs.append(Job(model, ours, main_level, skew(model, main_level), "prefetch"))
            jobs.append(
                Job(
                    model,
                    settings(units, OURS_POLICY, drift_threshold=ALWAYS_RECOMPUTE),
                    main_level,
                    skew(model, main_level),
                    section="drift",
                )
            )
    for experts in SWEEP_EXPERTS:
        for hidden in SWEEP_HIDDEN:
            model = sweep_model(experts, hidden, layers=SWEEP_LAYERS)
            for policy in config.policies:
                if get_policy(policy).role in ("baseline", "ours", "extension"):
                    jobs.append(
                        Job(
                            model,
                            settings(units, policy),
                            main_level,
                            skew_for("mixtral-8x7b", main_level),
                            section="shape",
                        )
                    )
    return jobs


def run_bench(
    config: BenchConfig, jobs_in_parallel: int = 1, progress: Callable[[int, int], None] | None = None
) -> tuple[list[dict[str, Any]], dict[str, dict]]:
    """Run every job; returns (records, gantt events per policy) with ``speedup_vs_monde`` filled in."""
    jobs = plan_jobs(config)
    results: list[JobResult] = []
    if progress:
        progress(0, len(jobs))
    try:  # at most MAX_WORKERS_HARD, never more than the jobs: a pool forks every worker at once
        workers = worker_count(jobs_in_parallel, len(jobs))
    except ValueError as exc:
        raise SettingsError(f"jobs_in_parallel: {exc}", "jobs") from None
    if workers > 1:
        pool = ProcessPoolExecutor(max_workers=workers, initializer=die_with_parent)  # no orphan if killed
        with pool, terminate_on_signal(pool):
            for done, result in enumerate(pool.map(_worker, [(job, config) for job in jobs], chunksize=1), 1):
                results.append(result)
                if progress:
                    progress(done, len(jobs))
    else:
        cache: dict = {}
        for done, job in enumerate(jobs, 1):
            results.append(run_job(job, config, cache))
            if progress:
                progress(done, len(jobs))
    records = [r.record for r in results]
    if OURS_POLICY in config.policies and config.sweeps:
        records += [
            dict(r, section="prefetch")
            for r in records
            if r["section"] == "main" and r["policy"] == OURS_POLICY and r["ndp_units"] == config.default_units
        ]
    fill_speedups(records)
    if config.bound:
        fill_bounds(records, config)
    gantt = {}
    for job, result in zip(jobs, results, strict=False):
        if result.gantt:
            gantt.setdefault(job.model.name, {})[job.policy] = result.gantt
    return records, gantt


def fill_bounds(records: list[dict[str, Any]], config: BenchConfig, trace_cache: dict | None = None) -> None:
    """Fill, in every record of the main table and the skew sweep, the row's tight bounds (:mod:`hw_model.bench_bound`;
    the non-expert time, the same under every policy, added): ``bound_s`` (causal) and ``foresight_bound_s``,
    ``over_bound`` (the record's latency over the causal bound), ``ceiling_over_best_baseline`` (the strongest
    baseline of the row over the causal bound: the most any causal policy could gain over it) and
    ``foresight_ceiling_over_best_baseline``."""
    cache = {} if trace_cache is None else trace_cache
    rows: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        if r["section"] in ("main", "skew") and "expert_latency_s" in r:
            rows.setdefault((r["section"], r["model"], r["ndp_units"], r["skew_level"], r["skew"]), []).append(r)
    for (_, name, units, level, skew), same in rows.items():
        model = get_model(name)
        job = Job(model, SimulationSettings(hw=config.hw, ndp_units=units), level, skew)
        trace = _trace_for(job, config, cache)
        starts = []
        if config.shift_at is not None and not config.trace_file:
            starts.append(trace.prompt_tokens + int(round(config.shift_at * trace.generated_tokens)))
        bound = bound_fields(model, job.settings, trace, starts)
        non_expert_s = same[0]["latency_s"] - same[0]["expert_latency_s"]
        causal_s, foresight_s = non_expert_s + bound.causal_s, non_expert_s + bound.foresight_s
        baselines = [r["latency_s"] for r in same if r["policy"] in BASELINE_POLICIES and r["feasible"]]
        best = min(baselines) if baselines else None
        for r in same:
            r["bound_s"] = causal_s
            r["foresight_bound_s"] = foresight_s
            r["over_bound"] = r["latency_s"] / causal_s
            r["ceiling_over_best_baseline"] = best / causal_s if best else None
            r["foresight_ceiling_over_best_baseline"] = best / foresight_s if best else None


def fill_speedups(records: list[dict[str, Any]]) -> None:
    """Fill ``speedup_vs_monde``, ``speedup_vs_best_baseline`` and ``best_baseline`` of every record: against
    the same (model, NDP count, skew) row of the main table (sweep rows: of their own section), baselines
    that do not fit the DIMMs left out."""

    def row(r: dict[str, Any]) -> tuple:
        section = "main" if r["section"] in ("main", "prefetch", "drift") else r["section"]
        return (section, r["model"], r["ndp_units"], r["skew_level"])

    base_rows = [
        r
        for r in records
        if r["policy"] in BASELINE_POLICIES
        and r["section"] in ("main", "skew", "shape")
        and r["residency_fraction"] == DEFAULT_RESIDENCY_FRACTION
    ]
    monde = {row(r): r["latency_s"] for r in base_rows if r["policy"] == BASELINE_POLICY}
    best: dict[tuple, tuple[float, str]] = {}
    for r in base_rows:
        if r["feasible"] and (row(r) not in best or r["latency_s"] < best[row(r)][0]):
            best[row(r)] = (r["latency_s"], r["policy"])
    for r in records:
        base = monde.get(row(r))
        r["speedup_vs_monde"] = base / r["latency_s"] if base else None
        strongest = best.get(row(r))
        r["best_baseline"] = strongest[1] if strongest else None
        r["speedup_vs_best_baseline"] = strongest[0] / r["latency_s"] if strongest else None


# -- output (tables: hw_model.bench_tables, plots: hw_model.bench_plots) -------------------------------------


def write_json_atomic(path: str | Path, payload: Any) -> None:
    """Write ``payload`` as indented JSON through :func:`ndp_io.write_text` (never half-written)."""
    write_text(path, json.dumps(payload, indent=1) + "\n")


class ProgressBar:
    """A one-line progress bar on stderr."""

    def __init__(self, stream: Any = None, width: int = 30) -> None:
        self.stream = stream or sys.stderr
        self.width = width
        self.started = time.monotonic()

        self._last_tenth = -1
        self._interactive = bool(getattr(self.stream, "isatty", lambda: False)())

    def __call__(self, done: int, total: int) -> None:
        filled = int(self.width * done / max(1, total))
        elapsed = time.monotonic() - self.started
        bar = "#" * filled + "." * (self.width - filled)
        line = f"bench [{bar}] {done}/{total} simulations, {elapsed:5.0f} s"
        if self._interactive:
            self.stream.write("\r" + line + ("\n" if done >= total else ""))
        else:  # a log file: one line per tenth
            tenth = 10 * done // max(1, total)
            if tenth == self._last_tenth:
                return
            self._last_tenth = tenth
            self.stream.write(line + "\n")
        self.stream.flush()


def quick_config(config: BenchConfig) -> BenchConfig:
    """A few-second version for tests: short prompt and generation, no sweeps."""
    return replace(config, prompt_tokens=32, generated_tokens=8, sweeps=False, skew_levels=config.skew_levels[:1])


def main_table(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of the main table: model x NDP count x policy at the main skew level."""
    return [r for r in records if r["section"] == "main"]


def records_for_json(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The main table as JSON records, ordered by model, NDP count and policy."""
    models = list(MODELS)

    def key(r: dict[str, Any]) -> tuple:
        return (
            models.index(r["model"]) if r["model"] in models else 99,
            r["model"],
            r["ndp_units"],
            POLICIES.index(r["policy"]),
        )

    return [dict(r) for r in sorted(main_table(records), key=key)]


__all__ = [
    "BenchConfig",
    "ProgressBar",
    "fill_bounds",
    "fill_speedups",
    "main_table",
    "plan_jobs",
    "quick_config",
    "records_for_json",
    "run_bench",
    "run_job",
    "write_json_atomic",
]
