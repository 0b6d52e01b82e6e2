"""Trace-driven end-to-end benchmark: models x NDP-unit counts x policies on one hardware preset.

For each model a seeded synthetic routing trace (skew calibrated per model, see :mod:`hw_model.traces`) or
a trace file drives one :class:`hw_model.simulator.MoESimulator` per (NDP count, policy)::

    prefill (P tokens):  per layer  attention(P) [+ shared experts] + MoE layer(counts of P tokens)
    decode  (G steps):   per layer  attention(1, context) [+ shared experts] + MoE layer(that token's experts)
                         + LM head per step

Non-expert ops run on the GPU for every policy (:mod:`hw_model.models`); their time is handed to the
simulator (``advance_time_s``) so the prefetcher can use the idle PCIe link. Results: a latency table
(speedup over ``monde``), sweeps across trace skew, prefetch budget and expert shapes, and PNG plots
(latency bars, per-layer Gantt timelines, utilisation) when matplotlib (the ``plot`` extra) is installed.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from hw_model.errors import WorkloadError
from hw_model.hardware import load_system
from hw_model.models import MODELS, ModelConfig, get_model, sweep_model
from hw_model.policies import POLICIES
from hw_model.simulator import MoESimulator
from hw_model.traces import (
    DEFAULT_SKEW_LEVELS,
    RoutingTrace,
    TraceKnobs,
    load_trace,
    skew_for,
    synthetic_trace,
)

BASELINE_POLICY = "monde"
BASELINE_POLICIES = ("gpu-offload", "ndp-expert-per-unit", "monde")
OURS_POLICY = "tp+lb+prefetch"
GANTT_POLICIES = ("monde", "tp", "tp+lb+prefetch")
PREFETCH_FRACTIONS = (0.1, 0.25, 0.5, 1.0)
SWEEP_EXPERTS = (2, 4, 8)
SWEEP_HIDDEN = (1024, 2048, 4096)
SWEEP_POLICIES = ("monde", "tp", "tp+lb+prefetch")
SWEEP_LAYERS = 32  # Mixtral-like depth, so the experts do not all fit in GPU memory
SKEW_SWEEP_POLICIES = ("gpu-offload", "monde", "tp+lb", "tp+lb+prefetch", "lower-bound")
UNIT_INDEPENDENT_POLICIES = ("gpu-offload",)  # uses no NDP unit


@dataclass(frozen=True)
class BenchConfig:
    """What to run. ``skew_levels`` beyond the first are swept at ``default_units`` only."""

    hw: str = "paper"
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

    def __post_init__(self) -> None:
        if not self.ndp_units or any(n < 0 for n in self.ndp_units):
            raise WorkloadError("ndp_units must be a non-empty list of non-negative integers")
        for name in self.models:
            get_model(name)
        for policy in self.policies:
            if policy not in POLICIES:
                raise WorkloadError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
        for level in self.skew_levels:
            if level not in DEFAULT_SKEW_LEVELS:
                raise WorkloadError(f"unknown skew level {level!r} (known: {', '.join(DEFAULT_SKEW_LEVELS)})")
        if self.prompt_tokens < 1 or self.generated_tokens < 1:
            raise WorkloadError("prompt and generated token counts must be positive")


@dataclass(frozen=True)
class Job:
    model: ModelConfig
    ndp_units: int
    policy: str
    skew_level: str
    skew: float
    residency_fraction: float = 1.0
    section: str = "main"
    want_gantt: bool = False


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


def run_job(job: Job, config: BenchConfig, trace_cache: dict | None = None) -> JobResult:
    """Simulate one (model, NDP count, policy, trace) end to end; deterministic."""
    trace_cache = {} if trace_cache is None else trace_cache
    model = job.model
    system = load_system(config.hw, job.ndp_units)
    trace = _trace_for(job, config, trace_cache)
    prompt = trace.prompt_tokens
    reserved = model.non_expert_weight_bytes() + model.kv_cache_bytes(trace.num_tokens)
    sim = MoESimulator(
        system,
        model.moe_layer_shapes(),
        job.policy,
        gpu_reserved_bytes=reserved,
        residency_fraction=job.residency_fraction,
    )
    layers = model.moe_layers
    gantt: dict[str, list[tuple[str, float, float, str]]] = {}

    # prefill: one invocation per layer over the whole prompt
    attention = model.attention_time_s(system, prompt, max(1, prompt // 2))
    per_layer_other = attention + model.shared_expert_time_s(system, prompt)
    dense = model.dense_layers * attention + model.dense_ffn_time_s(system, prompt)
    prefill_s = dense + model.lm_head_time_s(system, 1)
    sim.advance_time_s(dense)
    for layer in range(layers):
        sim.advance_time_s(per_layer_other)
        result = sim.simulate_layer(layer, trace.prefill_counts(layer), "prefill")
        prefill_s += per_layer_other + result.latency_s
        if job.want_gantt and layer == 0:
            gantt["prefill"] = [(e.resource, e.start_s, e.end_s, e.label) for e in result.events]

    decode_s = 0.0
    gantt_step = prompt + trace.generated_tokens // 2
    for token in range(prompt, trace.num_tokens):
        context = token + 1
        attention = model.attention_time_s(system, 1, context)
        per_layer_other = attention + model.shared_expert_time_s(system, 1)
        dense = model.dense_layers * attention + model.dense_ffn_time_s(system, 1)
        step_s = dense + model.lm_head_time_s(system, 1)
        sim.advance_time_s(dense)
        for layer in range(layers):
            sim.advance_time_s(per_layer_other)
            result = sim.simulate_layer(layer, trace.counts(layer, token, token + 1), "decode")
            step_s += per_layer_other + result.latency_s
            if job.want_gantt and layer == 0 and token == gantt_step:
                gantt["decode"] = [(e.resource, e.start_s, e.end_s, e.label) for e in result.events]
        decode_s += step_s

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
        "speedup_vs_monde": None,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "decode_ms_per_token": 1e3 * decode_s / max(1, trace.generated_tokens),
        "hw": config.hw,
        "skew_level": job.skew_level,
        "skew": job.skew,
        "residency_fraction": job.residency_fraction,
        "section": job.section,
        "utilisation": {
            "gpu": gpu_busy / total,
            "pcie": busy.get("pcie", 0.0) / total,
            "ndp_mean": float(np.mean(ndp_busy)) / total if ndp_busy else 0.0,
        },
        "placement_recomputations": summary["placement_recomputations"],
        "placement_reuses": summary["placement_reuses"],
        "host_to_gpu_bytes": summary["host_to_gpu_bytes"],
        "on_demand_weight_bytes": summary["on_demand_weight_bytes"],
        "residency_cap_bytes": summary["residency_cap_bytes"],
    }
    for key in ("prefetch_hits", "prefetch_misses", "prefetch_hit_rate", "prefetch_bytes_moved"):
        if key in summary:
            record[key] = summary[key]
    for key in ("cache_hits", "cache_misses", "cache_hit_rate", "cache_bytes_moved"):
        if key in summary:
            record[key] = summary[key]
    return JobResult(record, gantt)


_WORKER_CACHE: dict = {}


def _worker(args: tuple[Job, BenchConfig]) -> JobResult:
    job, config = args
    return run_job(job, config, _WORKER_CACHE)


def plan_jobs(config: BenchConfig) -> list[Job]:
    """Every simulation the bench runs: the main table, then the sweeps."""
    jobs: list[Job] = []
    main_level = config.skew_levels[0]

    def skew(model: ModelConfig, level: str) -> float:
        return config.skew_override if config.skew_override is not None else skew_for(model.name, level)

    for name in config.models:
        model = get_model(name)
        for units in config.ndp_units:
            for policy in config.policies:
                if policy in UNIT_INDEPENDENT_POLICIES and units != config.ndp_units[0]:
                    continue  # same result for every NDP count: run once, copied in run_bench
                want_gantt = config.gantt and units == config.default_units and policy in GANTT_POLICIES
                jobs.append(Job(model, units, policy, main_level, skew(model, main_level), want_gantt=want_gantt))
    if not config.sweeps:
        return jobs
    units = config.default_units
    for name in config.models:
        model = get_model(name)
        for level in config.skew_levels[1:]:
            for policy in config.policies:
                if policy in SKEW_SWEEP_POLICIES:
                    jobs.append(Job(model, units, policy, level, skew(model, level), section="skew"))
        if OURS_POLICY in config.policies and units in config.ndp_units:
            for fraction in PREFETCH_FRACTIONS[:-1]:  # the full budget (1.0) is the main table's run
                jobs.append(Job(model, units, OURS_POLICY, main_level, skew(model, main_level), fraction, "prefetch"))
    for experts in SWEEP_EXPERTS:
        for hidden in SWEEP_HIDDEN:
            model = sweep_model(experts, hidden, layers=SWEEP_LAYERS)
            for policy in SWEEP_POLICIES:
                jobs.append(
                    Job(model, units, policy, main_level, skew_for("mixtral-8x7b", main_level), section="shape")
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
    if jobs_in_parallel > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=jobs_in_parallel) as pool:
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
    for r in list(records):
        if r["section"] == "main" and r["policy"] in UNIT_INDEPENDENT_POLICIES:
            for units in config.ndp_units[1:]:
                records.append(dict(r, ndp_units=units))
    if OURS_POLICY in config.policies and config.sweeps:
        records += [
            dict(r, section="prefetch")
            for r in records
            if r["section"] == "main" and r["policy"] == OURS_POLICY and r["ndp_units"] == config.default_units
        ]
    baseline = {
        (r["section"], r["model"], r["ndp_units"], r["skew_level"], r["residency_fraction"]): r["latency_s"]
        for r in records
        if r["policy"] == BASELINE_POLICY
    }
    for r in records:
        key = (r["section"], r["model"], r["ndp_units"], r["skew_level"], 1.0)
        if r["section"] == "prefetch":
            key = ("main", r["model"], r["ndp_units"], r["skew_level"], 1.0)
        base = baseline.get(key)
        r["speedup_vs_monde"] = base / r["latency_s"] if base else None
    gantt = {}
    for job, result in zip(jobs, results, strict=False):
        if result.gantt:
            gantt.setdefault(job.model.name, {})[job.policy] = result.gantt
    return records, gantt


# -- output -------------------------------------------------------------------------------------------------


def main_table(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of the main table: model x NDP count x policy at the main skew level."""
    return [r for r in records if r["section"] == "main"]


def format_table(records: Sequence[dict[str, Any]]) -> str:
    """Plain-text latency table, one row per (model, NDP count), one column per policy."""
    rows = main_table(records)
    policies = [p for p in POLICIES if any(r["policy"] == p for r in rows)]
    lines = []
    header = f"{'model':18s} {'NDP':>3s} " + " ".join(f"{p:>19s}" for p in policies)
    lines.append("end-to-end latency, s (speedup over monde)")
    lines.append(header)
    keys = sorted(
        {(r["model"], r["ndp_units"]) for r in rows},
        key=lambda k: (list(MODELS).index(k[0]) if k[0] in MODELS else 99, k[1]),
    )
    for model, units in keys:
        cells = []
        for policy in policies:
            match = [r for r in rows if r["model"] == model and r["ndp_units"] == units and r["policy"] == policy]
            if not match:
                cells.append(f"{'-':>19s}")
                continue
            r = match[0]
            speed = f"({r['speedup_vs_monde']:.2f}x)" if r["speedup_vs_monde"] else ""
            cells.append(f"{r['latency_s']:>11.2f} {speed:>7s}")
        lines.append(f"{model:18s} {units:>3d} " + " ".join(cells))
    ours = [r["speedup_vs_monde"] for r in rows if r["policy"] == OURS_POLICY and r["speedup_vs_monde"]]
    if ours:
        lines.append(
            f"{OURS_POLICY} over monde: geometric mean {float(np.exp(np.mean(np.log(ours)))):.2f}x, "
            f"mean {float(np.mean(ours)):.2f}x, max {max(ours):.2f}x, min {min(ours):.2f}x"
        )
    over_best = []
    for model, units in keys:
        same = {r["policy"]: r["latency_s"] for r in rows if r["model"] == model and r["ndp_units"] == units}
        baselines = [same[p] for p in BASELINE_POLICIES if p in same]
        if OURS_POLICY in same and baselines:
            over_best.append(min(baselines) / same[OURS_POLICY])
    if over_best:
        lines.append(
            f"{OURS_POLICY} over the best baseline of each row ({', '.join(BASELINE_POLICIES)}): geometric mean "
            f"{float(np.exp(np.mean(np.log(over_best)))):.2f}x, max {max(over_best):.2f}x, min {min(over_best):.2f}x"
        )
    return "\n".join(lines)


def format_sweeps(records: Sequence[dict[str, Any]]) -> str:
    lines = []
    skew = [r for r in records if r["section"] in ("main", "skew") and r["policy"] == OURS_POLICY]
    units = {r["ndp_units"] for r in records if r["section"] == "skew"}
    if units:
        lines.append("\nskew sweep: speedup of tp+lb+prefetch over monde (prefetch hit rate)")
        for model in sorted({r["model"] for r in skew}):
            cells = []
            for level in DEFAULT_SKEW_LEVELS:
                match = [
                    r for r in skew if r["model"] == model and r["skew_level"] == level and r["ndp_units"] in units
                ]
                if match:
                    r = match[0]
                    cells.append(
                        f"{level} (skew {r['skew']:.2f}): {r['speedup_vs_monde']:.2f}x "
                        f"({r.get('prefetch_hit_rate', 0):.0%})"
                    )
            lines.append(f"  {model:18s} " + "  ".join(cells))
    pre = [r for r in records if r["section"] == "prefetch"]
    if pre:
        lines.append("\nprefetch budget sweep (tp+lb+prefetch, fraction of free GPU memory for resident experts)")
        for model in sorted({r["model"] for r in pre}):
            cells = [
                f"{r['residency_fraction']:.2f}: {r['latency_s']:.2f}s ({r.get('prefetch_hit_rate', 0):.0%} hits)"
                for r in sorted((r for r in pre if r["model"] == model), key=lambda r: r["residency_fraction"])
            ]
            lines.append(f"  {model:18s} " + "  ".join(cells))
    shape = [r for r in records if r["section"] == "shape"]
    if shape:
        lines.append(
            f"\nshape sweep ({SWEEP_LAYERS} layers, top-2 of E experts, FFN 3.5 x hidden, "
            f"{shape[0]['ndp_units']} NDP units): speedup over monde, tp / tp+lb+prefetch"
        )
        for model in sorted({r["model"] for r in shape}, key=lambda m: (int(m.split("-e")[1].split("-")[0]), m)):
            by = {r["policy"]: r for r in shape if r["model"] == model}
            if "tp" in by and OURS_POLICY in by:
                lines.append(
                    f"  {model:22s} tp {by['tp']['speedup_vs_monde']:.2f}x   "
                    f"ours {by[OURS_POLICY]['speedup_vs_monde']:.2f}x"
                )
    return "\n".join(lines)


def write_json_atomic(path: str | Path, payload: Any) -> None:
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=1)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def make_plots(
    records: Sequence[dict[str, Any]], gantt: dict[str, dict], out_dir: Path, default_units: int
) -> list[Path]:
    """Write the PNG plots; raises ImportError when matplotlib (the ``plot`` extra) is missing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    rows = main_table(records)
    models = [m for m in MODELS if any(r["model"] == m for r in rows)]
    policies = [p for p in POLICIES if any(r["policy"] == p for r in rows)]
    colours = dict(zip(POLICIES, plt.get_cmap("tab10").colors, strict=False))

    def save(fig: Any, name: str) -> None:
        path = out_dir / name
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{name}.", suffix=".png")
        os.close(fd)
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
        plt.close(fig)
        os.replace(tmp, path)
        written.append(path)

    # 1. latency bars
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(4.2 * max(1, len(models)), 4), squeeze=False)
    for ax, model in zip(axes[0], models, strict=False):
        units_list = sorted({r["ndp_units"] for r in rows if r["model"] == model})
        width = 0.8 / max(1, len(policies))
        for i, policy in enumerate(policies):
            values = [
                next(
                    (
                        r["latency_s"]
                        for r in rows
                        if r["model"] == model and r["ndp_units"] == u and r["policy"] == policy
                    ),
                    np.nan,
                )
                for u in units_list
            ]
            ax.bar(np.arange(len(units_list)) + i * width, values, width, label=policy, color=colours[policy])
        ax.set_xticks(np.arange(len(units_list)) + 0.4 - width / 2)
        ax.set_xticklabels([f"{u} NDP" for u in units_list])
        ax.set_yscale("log")
        ax.set_title(model)
        ax.set_ylabel("end-to-end latency, s (log)")
    axes[0][-1].legend(fontsize=7, loc="upper right")
    fig.suptitle("512 prompt + 512 generated tokens, batch 1", y=1.03)
    save(fig, "latency_bars.png")

    # 2. Gantt timelines of one MoE layer (prefill and a mid-stream decode step)
    for model, per_policy in gantt.items():
        phases = [p for p in ("prefill", "decode") if any(p in g for g in per_policy.values())]
        pols = [p for p in GANTT_POLICIES if p in per_policy]
        fig, axes = plt.subplots(len(pols), len(phases), figsize=(7 * len(phases), 2.2 * len(pols)), squeeze=False)
        for row, policy in enumerate(pols):
            for col, phase in enumerate(phases):
                ax = axes[row][col]
                events = per_policy[policy].get(phase, [])
                resources = sorted({e[0] for e in events}, key=_resource_rank)
                for y, resource in enumerate(resources):
                    spans = [(s * 1e3, (e - s) * 1e3) for res, s, e, _ in events if res == resource]
                    ax.broken_barh(spans, (y - 0.4, 0.8), color=_resource_colour(resource))
                ax.set_yticks(range(len(resources)))
                ax.set_yticklabels(resources, fontsize=7)
                ax.invert_yaxis()
                ax.set_xlabel("ms")
                ax.set_title(f"{policy}: layer 0, {phase}", fontsize=9)
        fig.suptitle(f"{model}, {default_units} NDP units: one MoE layer's timeline")
        fig.tight_layout()
        save(fig, f"gantt_{model}.png")

    # 3. utilisation at the default NDP count
    util = [r for r in rows if r["ndp_units"] == default_units]
    if util:
        fig, axes = plt.subplots(1, max(1, len(models)), figsize=(4.2 * max(1, len(models)), 3.6), squeeze=False)
        for ax, model in zip(axes[0], models, strict=False):
            mine = sorted((r for r in util if r["model"] == model), key=lambda r: POLICIES.index(r["policy"]))
            x = np.arange(len(mine))
            for k, (key, colour) in enumerate((("gpu", "tab:green"), ("pcie", "tab:orange"), ("ndp_mean", "tab:blue"))):
                ax.bar(x + k * 0.27, [r["utilisation"][key] for r in mine], 0.27, label=key, color=colour)
            ax.set_xticks(x + 0.27)
            ax.set_xticklabels([r["policy"] for r in mine], rotation=60, ha="right", fontsize=7)
            ax.set_ylim(0, 1)
            ax.set_title(model)
        axes[0][0].set_ylabel(f"busy fraction ({default_units} NDP units)")
        axes[0][-1].legend(fontsize=7)
        save(fig, "utilisation.png")

    # 4. skew sweep
    skew = [r for r in records if r["section"] in ("main", "skew") and r["policy"] == OURS_POLICY]
    skew = [r for r in skew if r["ndp_units"] == default_units and r["speedup_vs_monde"]]
    if len({r["skew_level"] for r in skew}) > 1:
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for model in models:
            mine = sorted((r for r in skew if r["model"] == model), key=lambda r: r["skew"])
            ax.plot([r["skew"] for r in mine], [r["speedup_vs_monde"] for r in mine], marker="o", label=model)
        ax.set_xlabel("Zipf skew of expert popularity")
        ax.set_ylabel("speedup of tp+lb+prefetch over monde")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.legend(fontsize=7)
        save(fig, "skew_sweep.png")
    return written


def _resource_rank(resource: str) -> tuple[int, int]:
    order = {"gpu": 0, "pcie": 1, "pcie_d2h": 2, "ndp_link": 99}
    if resource.startswith("ndp") and resource[3:].isdigit():
        return (3, int(resource[3:]))
    return (order.get(resource, 50), 0)


def _resource_colour(resource: str) -> str:
    if resource == "gpu":
        return "tab:green"
    if resource.startswith("pcie"):
        return "tab:orange"
    if resource == "ndp_link":
        return "tab:purple"
    return "tab:blue"


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
    "format_sweeps",
    "format_table",
    "make_plots",
    "plan_jobs",
    "quick_config",
    "records_for_json",
    "run_bench",
    "run_job",
    "write_json_atomic",
]
