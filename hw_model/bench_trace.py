"""``ndp-ep bench`` on a captured routing trace: the model's own shapes and routing, any hardware and policy.

Each (NDP-unit count, policy) replays the trace (:func:`hw_model.trace_replay.replay`) under the trace's settings
with the hardware, unit count and policy replaced; the non-expert GPU seconds of each step are the ones the
capture costed (on its own hardware's GPU: a trace replayed on another GPU keeps them). The records carry the
main table's keys (``hw_model.bench.fill_speedups`` fills the speedups), and :func:`format_trace_table` prints
them in milliseconds or seconds, whichever reads better. :func:`synthetic_captured_trace` builds a trace from a
model's shapes alone, with seeded synthetic routing at the calibrated skew (``--model-from``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from hw_model.bench import BASELINE_POLICIES, OURS_POLICY, fill_speedups
from hw_model.bench_tables import policy_cells
from hw_model.errors import WorkloadError
from hw_model.models import MODELS, get_model
from hw_model.policies import POLICIES
from hw_model.routing_trace import CapturedTrace, TraceHeader, from_token_ids
from hw_model.settings import SimulationSettings
from hw_model.trace_replay import replay, settings_of_header
from hw_model.traces import TraceKnobs, skew_for, synthetic_trace

CAPTURED_LEVEL = "captured"


def model_name_of(header: TraceHeader, fallback: str) -> str:
    """A short name for the table: the model path's folder or stem in the header's source, else ``fallback``."""
    words = header.source.split()
    if len(words) >= 3 and words[0] == "ndp-ep" and words[1] in ("run", "generate"):  # "ndp-ep generate DIR"
        path = Path(words[2])
        return path.name if words[1] == "generate" else path.stem
    return fallback


def trace_settings(
    trace: CapturedTrace,
    hw: str | None,
    ndp_units: Sequence[int],
    policies: Sequence[str],
    placement: str | None = None,
) -> list[SimulationSettings]:
    """The settings of every (NDP count, policy) to replay: the trace's own, with these replaced (``placement``
    when given)."""
    changes = {"hw": hw} if hw is not None else {}
    if placement is not None:
        changes["placement"] = placement
    base = settings_of_header(trace.header.settings, **changes)
    by_units = {units: base.replace(ndp_units=units) for units in ndp_units}
    return [by_units[units].replace(policy=policy) for units in ndp_units for policy in policies]


def replay_record(trace: CapturedTrace, settings: SimulationSettings, model_name: str) -> dict[str, Any]:
    """One main-table record of ``trace`` replayed under ``settings``."""
    result = replay(trace, settings)
    summary = result.summary
    decode = [s for s, phase in zip(result.step_s, trace.steps.phase.tolist(), strict=True) if phase == 1]
    record: dict[str, Any] = {
        "model": model_name,
        "ndp_units": settings.system.num_ndp_units,
        "policy": settings.policy,
        "latency_s": result.total_s,
        "feasible": summary["feasible"],
        "infeasible_reason": summary["infeasible_reason"],
        "speedup_vs_monde": None,
        "speedup_vs_best_baseline": None,
        "best_baseline": None,
        "prefill_s": result.prefill_s,
        "decode_s": result.decode_s,
        "decode_ms_per_token": 1e3 * result.decode_s / max(1, result.decode_steps),
        "decode_p50_ms": 1e3 * float(np.percentile(decode, 50)) if decode else 0.0,
        "decode_p90_ms": 1e3 * float(np.percentile(decode, 90)) if decode else 0.0,
        "decode_p99_ms": 1e3 * float(np.percentile(decode, 99)) if decode else 0.0,
        "hw": settings.system.name,
        "skew_level": CAPTURED_LEVEL,
        "skew": None,
        "residency_fraction": settings.residency_fraction,
        "drift_threshold": settings.drift_threshold,
        "section": "main",
        "steps": trace.num_steps,
        "host_to_gpu_bytes": summary["host_to_gpu_bytes"],
        "on_demand_weight_bytes": summary["on_demand_weight_bytes"],
    }
    for key in ("prefetch_hit_rate", "prefetch_bytes_moved", "cache_hit_rate", "cache_bytes_moved", "pin_cost_s"):
        if key in summary:
            record[key] = summary[key]
    return record


def _job(args: tuple[CapturedTrace, SimulationSettings, str]) -> dict[str, Any]:
    return replay_record(*args)


def run_trace_bench(
    trace: CapturedTrace,
    model_name: str,
    hw: str | None,
    ndp_units: Sequence[int],
    policies: Sequence[str] = POLICIES,
    jobs_in_parallel: int = 1,
    progress: Callable[[int, int], None] | None = None,
    placement: str | None = None,
) -> list[dict[str, Any]]:
    """Every (NDP count, policy) replay of ``trace``, with the speedups filled in."""
    chosen = trace_settings(trace, hw, ndp_units, policies, placement)
    work = [(trace, settings, model_name) for settings in chosen]
    records: list[dict[str, Any]] = []
    if progress:
        progress(0, len(work))
    if jobs_in_parallel > 1 and len(work) > 1:
        with ProcessPoolExecutor(max_workers=jobs_in_parallel) as pool:
            for done, record in enumerate(pool.map(_job, work, chunksize=1), 1):
                records.append(record)
                if progress:
                    progress(done, len(work))
    else:
        for done, item in enumerate(work, 1):
            records.append(_job(item))
            if progress:
                progress(done, len(work))
    fill_speedups(records)
    return records


def format_trace_table(records: Sequence[dict[str, Any]], title: str) -> str:
    """The main table of a trace bench (markdown): one row per NDP count, a column per policy."""
    policies = [p for p in POLICIES if any(r["policy"] == p for r in records)]
    longest = max((r["latency_s"] for r in records), default=0.0)
    scale, unit = (1.0, "s") if longest >= 1.0 else (1e3, "ms")
    lines = [
        f"End-to-end latency of {title}, {unit} (bold: the strongest feasible baseline of the row; n/f: the experts "
        "do not fit the DIMMs)",
        "",
        "| model | NDP | " + " | ".join(policies) + f" | {OURS_POLICY} vs strongest | vs monde |",
        "|---|---|" + "---|" * (len(policies) + 2),
    ]
    for model, units in sorted({(r["model"], r["ndp_units"]) for r in records}):
        same = {r["policy"]: r for r in records if r["model"] == model and r["ndp_units"] == units}
        ours = same.get(OURS_POLICY)
        best = ours["best_baseline"] if ours else None
        cells = policy_cells(same, policies, best, lambda r: f"{r['latency_s'] * scale:.3f}")
        vs_best = vs_monde = "-"
        if ours and ours["feasible"] and ours["speedup_vs_best_baseline"]:
            vs_best = f"{ours['speedup_vs_best_baseline']:.2f}× ({best})"
        if ours and ours["feasible"] and ours["speedup_vs_monde"]:
            vs_monde = f"{ours['speedup_vs_monde']:.2f}×"
        lines.append(f"| {model} | {units} | " + " | ".join(cells) + f" | {vs_best} | {vs_monde} |")
    lines.append("")
    lines.append(f"baselines: {', '.join(p for p in BASELINE_POLICIES if p in policies)}")
    return "\n".join(lines)


def calibrated_skew_of(num_experts: int, top_k: int, level: str) -> tuple[float, str]:
    """The calibrated skew at ``level`` of the built-in model with these experts and top-k (e.g. 64 top-8: OLMoE),
    else qwen3-30b-a3b's (the measured range of mild-skew models); and the model it came from."""
    for name in MODELS:
        model = get_model(name)
        if (model.num_experts, model.top_k) == (num_experts, top_k):
            return skew_for(name, level), name
    return skew_for("qwen3-30b-a3b", level), "qwen3-30b-a3b"


def synthetic_captured_trace(
    header: TraceHeader,
    prefill_gap_s: float,
    decode_gap_s: float,
    knobs: TraceKnobs,
) -> CapturedTrace:
    """A trace of ``header``'s layers with seeded synthetic routing (``knobs``) over its prompt and new tokens,
    each prefill / decode step costed ``prefill_gap_s`` / ``decode_gap_s`` of non-expert GPU time."""
    layers = header.layers
    if not layers:
        raise WorkloadError("the model has no MoE layer to bench")
    prompt, new = header.prompt_tokens, header.new_tokens
    if (prompt, new) == (0, 0):
        raise WorkloadError("a synthetic trace needs prompt or new tokens")
    if len({(layer.num_experts, layer.top_k) for layer in layers}) == 1:
        ids = synthetic_trace(len(layers), layers[0].num_experts, layers[0].top_k, prompt, new, knobs).expert_ids
    else:  # layers of different widths: one stream per layer
        ids_per_layer = [
            synthetic_trace(1, layer.num_experts, layer.top_k, prompt, new, knobs).expert_ids[0] for layer in layers
        ]
        width = max(layer.top_k for layer in layers)
        if any(layer.top_k != width for layer in layers):
            raise WorkloadError("layers with different top-k cannot share one synthetic trace")
        ids = np.stack(ids_per_layer)
    trace = from_token_ids(header, ids)
    steps = trace.steps
    gaps = np.where(steps.phase == 0, prefill_gap_s, decode_gap_s).astype(np.float64)
    from dataclasses import replace

    return CapturedTrace(header, replace(steps, gap_s=gaps))
