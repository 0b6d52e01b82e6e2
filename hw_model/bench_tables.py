"""Markdown tables of a bench run (the same text goes to stdout and into docs/bench.md).

- main table: per model x NDP count, every policy's end-to-end latency; the strongest feasible baseline of
  the row in bold, configurations whose experts do not fit the DIMMs marked ``n/f`` and left out of every
  mean; ours against the strongest baseline and against ``monde``;
- sweeps: skew, prefetch budget (with its optimum), drift reuse vs recomputing every invocation
  (recomputations per 100 tokens), per-token decode tail latency, and the small-MoE seed configurations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from hw_model.bench import BASELINE_POLICIES, OURS_POLICY, main_table
from hw_model.models import MODELS
from hw_model.policies import POLICIES
from hw_model.traces import DEFAULT_SKEW_LEVELS


def _model_order(name: str) -> tuple[int, str]:
    return (list(MODELS).index(name) if name in MODELS else 99, name)


def _stats(values: Sequence[float]) -> str:
    if not values:
        return "no feasible rows"
    arr = np.asarray(values, dtype=np.float64)
    return (
        f"mean {arr.mean():.2f}×, geometric mean {float(np.exp(np.log(arr).mean())):.2f}×, "
        f"min {arr.min():.2f}×, max {arr.max():.2f}× over {arr.size} feasible rows"
    )


def policy_cells(
    same: Mapping[str, dict[str, Any]],
    policies: Sequence[str],
    best: str | None,
    shown: Callable[[dict[str, Any]], str],
) -> list[str]:
    """One table row's cells, a policy each: ``shown(record)``, ``-`` where the policy has no record, ``n/f (…)``
    where its experts do not fit, bold for ``best``."""
    cells = []
    for policy in policies:
        r = same.get(policy)
        if r is None:
            cells.append("-")
        elif not r["feasible"]:
            cells.append(f"n/f ({shown(r)})")
        elif policy == best:
            cells.append(f"**{shown(r)}**")
        else:
            cells.append(shown(r))
    return cells


def format_table(records: Sequence[dict[str, Any]]) -> str:
    """The main table (markdown) and the summary lines of ours over the strongest baseline and over monde."""
    rows = main_table(records)
    policies = [p for p in POLICIES if any(r["policy"] == p for r in rows)]
    keys = sorted({(r["model"], r["ndp_units"]) for r in rows}, key=lambda k: (*_model_order(k[0]), k[1]))
    lines = [
        "End-to-end latency, s (bold: the strongest feasible baseline of the row; n/f: the experts do not fit "
        "the DIMMs, left out of the means)",
        "",
        "| model | NDP | " + " | ".join(policies) + f" | {OURS_POLICY} vs strongest | vs monde |",
        "|---|---|" + "---|" * (len(policies) + 2),
    ]
    over_best, over_monde = [], []
    for model, units in keys:
        same = {r["policy"]: r for r in rows if r["model"] == model and r["ndp_units"] == units}
        ours = same.get(OURS_POLICY)
        best = ours["best_baseline"] if ours else None
        cells = policy_cells(same, policies, best, lambda r: f"{r['latency_s']:.2f}")
        vs_best = vs_monde = "-"
        if ours and ours["feasible"] and ours["speedup_vs_best_baseline"]:
            vs_best = f"{ours['speedup_vs_best_baseline']:.2f}× ({best})"
            over_best.append(ours["speedup_vs_best_baseline"])
        if ours and ours["feasible"] and ours["speedup_vs_monde"]:
            vs_monde = f"{ours['speedup_vs_monde']:.2f}×"
            over_monde.append(ours["speedup_vs_monde"])
        elif ours and not ours["feasible"]:
            vs_best = vs_monde = "n/f"
        lines.append(f"| {model} | {units} | " + " | ".join(cells) + f" | {vs_best} | {vs_monde} |")
    lines.append("")
    lines.append(
        f"{OURS_POLICY} over the strongest baseline of each row ({', '.join(BASELINE_POLICIES)}): " + _stats(over_best)
    )
    lines.append(f"{OURS_POLICY} over monde: " + _stats(over_monde))
    return "\n".join(lines)


def format_bound_table(records: Sequence[dict[str, Any]]) -> str:
    """Ours against the tight bound of each main-table row, and the most any causal policy could gain over the
    strongest baseline (the ceiling), with perfect foresight as well; empty without bounds."""
    rows = [r for r in main_table(records) if r["policy"] == OURS_POLICY and r.get("bound_s")]
    if not rows:
        return ""
    lines = [
        "The tight bound (docs/bench.md): end-to-end latency, s; ours over the causal bound; the most any causal "
        "policy could gain over the strongest baseline (strongest / causal bound), and with perfect foresight",
        "",
        f"| model | NDP | {OURS_POLICY} | strongest baseline | causal bound | foresight bound | ours / bound | "
        "most any causal policy could gain over the strongest | with perfect foresight |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    over, ceilings = [], []
    for r in sorted(rows, key=lambda r: (*_model_order(r["model"]), r["ndp_units"])):
        strongest = "-"
        if r.get("best_baseline") and r.get("speedup_vs_best_baseline"):
            strongest = f"{r['latency_s'] * r['speedup_vs_best_baseline']:.2f} ({r['best_baseline']})"
        ceiling = r.get("ceiling_over_best_baseline")
        foresight = r.get("foresight_ceiling_over_best_baseline")
        if r["feasible"]:
            over.append(r["over_bound"])
            if ceiling:
                ceilings.append(ceiling)
        lines.append(
            f"| {r['model']} | {r['ndp_units']} | {r['latency_s']:.2f} | {strongest} | {r['bound_s']:.2f} | "
            f"{r['foresight_bound_s']:.2f} | {r['over_bound']:.3f} | "
            f"{f'{ceiling:.2f}×' if ceiling else '-'} | {f'{foresight:.2f}×' if foresight else '-'} |"
        )
    lines.append("")
    if over:
        lines.append(
            f"{OURS_POLICY} over the causal bound: max {max(over):.3f}, mean {float(np.mean(over)):.3f} over "
            f"{len(over)} feasible rows; the causal ceiling over the strongest baseline: " + _stats(ceilings)
        )
    return "\n".join(lines)


def format_sweeps(records: Sequence[dict[str, Any]]) -> str:
    """The sweep tables (markdown); empty sections are left out."""
    parts = [
        _skew_table(records),
        _prefetch_table(records),
        _drift_table(records),
        _tail_table(records),
        _shape_table(records),
    ]
    return "\n\n".join(p for p in parts if p)


def _skew_table(records: Sequence[dict[str, Any]]) -> str:
    skew = [r for r in records if r["section"] == "skew"]
    if not skew:
        return ""
    units = skew[0]["ndp_units"]
    pool = [r for r in records if r["section"] in ("main", "skew") and r["policy"] == OURS_POLICY]
    lines = [
        f"Skew sweep ({units} NDP units): {OURS_POLICY} over the strongest baseline (which one; decode prefetch "
        "hit rate)",
        "",
        "| model | " + " | ".join(DEFAULT_SKEW_LEVELS) + " |",
        "|---|" + "---|" * len(DEFAULT_SKEW_LEVELS),
    ]
    for model in sorted({r["model"] for r in skew}, key=_model_order):
        cells = []
        for level in DEFAULT_SKEW_LEVELS:
            match = [r for r in pool if r["model"] == model and r["skew_level"] == level and r["ndp_units"] == units]
            if match and match[0]["speedup_vs_best_baseline"]:
                r = match[0]
                cells.append(
                    f"{r['speedup_vs_best_baseline']:.2f}× ({r['best_baseline']}; {r.get('prefetch_hit_rate', 0):.0%})"
                )
            else:
                cells.append("-")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _prefetch_table(records: Sequence[dict[str, Any]]) -> str:
    pre = [r for r in records if r["section"] == "prefetch"]
    if not pre:
        return ""
    fractions = sorted({r["residency_fraction"] for r in pre})
    lines = [
        f"Prefetch budget sweep ({pre[0]['ndp_units']} NDP units, {OURS_POLICY}): share of the GPU expert pool kept "
        "resident (the rest stages on-demand copies); latency, s (decode hit rate); the optimum in bold",
        "",
        "| model | " + " | ".join(f"{f:.2f}" for f in fractions) + " | optimum |",
        "|---|" + "---|" * (len(fractions) + 1),
    ]
    for model in sorted({r["model"] for r in pre}, key=_model_order):
        mine = {r["residency_fraction"]: r for r in pre if r["model"] == model}
        best = min(mine, key=lambda f: mine[f]["latency_s"])
        cells = []
        for f in fractions:
            r = mine.get(f)
            if r is None:
                cells.append("-")
                continue
            text = f"{r['latency_s']:.2f} ({r.get('prefetch_hit_rate', 0):.0%})"
            cells.append(f"**{text}**" if f == best else text)
        lines.append(f"| {model} | " + " | ".join(cells) + f" | {best:.2f} |")
    return "\n".join(lines)


def _drift_table(records: Sequence[dict[str, Any]]) -> str:
    drift = [r for r in records if r["section"] == "drift"]
    if not drift:
        return ""
    main = {(r["model"], r["ndp_units"]): r for r in main_table(records) if r["policy"] == OURS_POLICY}
    lines = [
        f"Placement reuse ({drift[0]['ndp_units']} NDP units, {OURS_POLICY}): smoothed-histogram drift rule vs "
        "recomputing at every invocation",
        "",
        "| model | recomputations per 100 tokens (per layer) | latency with reuse, s | always recompute, s | "
        "reuse costs |",
        "|---|---|---|---|---|",
    ]
    for r in sorted(drift, key=lambda r: _model_order(r["model"])):
        ours = main.get((r["model"], r["ndp_units"]))
        if ours is None:
            continue
        cost = ours["latency_s"] / r["latency_s"] - 1
        lines.append(
            f"| {r['model']} | {ours['recomputations_per_100_tokens']:.1f} | {ours['latency_s']:.2f} | "
            f"{r['latency_s']:.2f} | {cost:+.1%} |"
        )
    return "\n".join(lines)


def _tail_table(records: Sequence[dict[str, Any]]) -> str:
    rows = main_table(records)
    ours = [r for r in rows if r["policy"] == OURS_POLICY and r.get("best_baseline")]
    if not ours:
        return ""
    lines = [
        "Per-token decode latency, ms: p50 / p90 / p99 of ours and of the strongest baseline of the row",
        "",
        "| model | NDP | ours p50 / p90 / p99 | strongest baseline | its p50 / p90 / p99 |",
        "|---|---|---|---|---|",
    ]
    for r in sorted(ours, key=lambda r: (*_model_order(r["model"]), r["ndp_units"])):
        base = next(
            (
                b
                for b in rows
                if b["model"] == r["model"] and b["ndp_units"] == r["ndp_units"] and b["policy"] == r["best_baseline"]
            ),
            None,
        )
        if base is None:
            continue
        lines.append(f"| {r['model']} | {r['ndp_units']} | {_tail(r)} | {base['policy']} | {_tail(base)} |")
    return "\n".join(lines)


def _tail(r: dict[str, Any]) -> str:
    return f"{r['decode_p50_ms']:.1f} / {r['decode_p90_ms']:.1f} / {r['decode_p99_ms']:.1f}"


def _shape_table(records: Sequence[dict[str, Any]]) -> str:
    shape = [r for r in records if r["section"] == "shape"]
    ours = [r for r in shape if r["policy"] == OURS_POLICY and r.get("speedup_vs_best_baseline")]
    if not ours:
        return ""
    experts = sorted({int(r["model"].split("-e")[1].split("-")[0]) for r in ours})
    hidden = sorted({int(r["model"].split("-h")[1]) for r in ours})
    lines = [
        f"Small-MoE seed configurations ({ours[0]['ndp_units']} NDP units, 32 layers, top-2 of E experts, FFN = 3.5 × "
        f"hidden): {OURS_POLICY} over the strongest baseline (which one)",
        "",
        "| experts \\ hidden | " + " | ".join(str(h) for h in hidden) + " |",
        "|---|" + "---|" * len(hidden),
    ]
    for e in experts:
        cells = []
        for h in hidden:
            match = [r for r in ours if r["model"] == f"sweep-e{e}-h{h}"]
            cells.append(f"{match[0]['speedup_vs_best_baseline']:.2f}× ({match[0]['best_baseline']})" if match else "-")
        lines.append(f"| {e} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


__all__ = ["format_bound_table", "format_sweeps", "format_table"]
