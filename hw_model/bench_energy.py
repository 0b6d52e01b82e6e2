"""Energy of ``ndp-ep bench`` runs: the fields each record carries and the energy tables (markdown).

Each record (:func:`energy_fields`) gets ``energy_j`` (the whole request: prefill and decode, expert and non-expert
work, idle time at static power), ``prefill_j`` and ``decode_j``, ``joules_per_token`` (decode joules per generated
token: the figure an edge deployment's battery sees), ``prefill_j_per_token`` (per prompt token), ``avg_power_w``
(energy over the request's latency), ``edp_j_s`` (energy-delay product: ``energy_j x latency_s``), the joules per
resource (``energy_by_resource_j``) and the one that dominates. Hardware without energy tables gives ``None``s.
The model is :mod:`hw_model.energy`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hw_model.energy import RESOURCES, EnergyReport

ENERGY_KEYS = ("energy_j", "prefill_j", "decode_j", "joules_per_token", "prefill_j_per_token", "avg_power_w", "edp_j_s")


def energy_fields(
    total: EnergyReport | None,
    prefill: EnergyReport | None,
    *,
    latency_s: float,
    prompt_tokens: int,
    generated_tokens: int,
) -> dict[str, Any]:
    """The energy fields of one bench record: ``total`` over the whole request, ``prefill`` over its prefill."""
    if total is None or prefill is None:
        return {**dict.fromkeys(ENERGY_KEYS), "energy_by_resource_j": None, "energy_dominant": None}
    decode_j = total.total_j - prefill.total_j
    return {
        "energy_j": total.total_j,
        "prefill_j": prefill.total_j,
        "decode_j": decode_j,
        "joules_per_token": decode_j / max(1, generated_tokens),
        "prefill_j_per_token": prefill.total_j / max(1, prompt_tokens),
        "avg_power_w": total.total_j / latency_s if latency_s > 0 else 0.0,
        "edp_j_s": total.total_j * latency_s,
        "energy_by_resource_j": dict(total.by_resource_j),
        "gpu_idle_j": total.idle_j.get("gpu", 0.0),
        "energy_dominant": total.dominant,
    }


def _order(records: Sequence[dict[str, Any]]) -> tuple[list[str], list[tuple[str, int]]]:
    from hw_model.bench_tables import _model_order
    from hw_model.policies import POLICIES

    policies = [p for p in POLICIES if any(r["policy"] == p for r in records)]
    keys = sorted({(r["model"], r["ndp_units"]) for r in records}, key=lambda k: (*_model_order(k[0]), k[1]))
    return policies, keys


def format_energy_table(records: Sequence[dict[str, Any]]) -> str:
    """Decode J/token per policy (model x NDP rows, the main table's records), ours against the lowest-energy
    feasible baseline, then per policy its mean J/token, average power, energy-delay product and dominant resource.
    Empty when no record carries energy."""
    from hw_model.bench import BASELINE_POLICIES, OURS_POLICY, main_table

    rows = [r for r in main_table(records) if r.get("energy_j") is not None]
    if not rows:
        return ""
    policies, keys = _order(rows)
    lines = [
        "Energy, decode J/token (bold: the lowest-energy feasible baseline of the row; n/f: the experts do not fit)",
        "",
        "| model | NDP | " + " | ".join(policies) + f" | {OURS_POLICY} vs lowest baseline |",
        "|---|---|" + "---|" * (len(policies) + 1),
    ]
    for model, units in keys:
        same = {r["policy"]: r for r in rows if r["model"] == model and r["ndp_units"] == units}
        baselines = [same[p] for p in BASELINE_POLICIES if p in same and same[p]["feasible"]]
        best = min(baselines, key=lambda r: r["joules_per_token"]) if baselines else None
        cells = []
        for policy in policies:
            r = same.get(policy)
            if r is None:
                cells.append("-")
            elif not r["feasible"]:
                cells.append(f"n/f ({r['joules_per_token']:.3f})")
            elif best is not None and r is best:
                cells.append(f"**{r['joules_per_token']:.3f}**")
            else:
                cells.append(f"{r['joules_per_token']:.3f}")
        ours = same.get(OURS_POLICY)
        ratio = "-"
        if ours is not None and ours["feasible"] and best is not None:
            ratio = f"{best['joules_per_token'] / ours['joules_per_token']:.2f}× less ({best['policy']})"
        lines.append(f"| {model} | {units} | " + " | ".join(cells) + f" | {ratio} |")
    lines += ["", _policy_summary(rows, policies)]
    return "\n".join(lines)


def _policy_summary(rows: Sequence[dict[str, Any]], policies: Sequence[str]) -> str:
    """Per policy, means over its feasible rows: J/token, average power, EDP and each resource's share."""
    header = "| policy | J/token | avg W | EDP, J·s | " + " | ".join(RESOURCES) + " | dominant |"
    lines = [
        "Per policy, means over its feasible rows (energy shares per resource, % of the request's joules)",
        "",
        header,
        "|---|---|---|---|" + "---|" * (len(RESOURCES) + 1),
    ]
    for policy in policies:
        mine = [r for r in rows if r["policy"] == policy and r["feasible"]]
        if not mine:
            continue
        n = len(mine)
        shares = {res: sum(r["energy_by_resource_j"][res] / r["energy_j"] for r in mine) / n for res in RESOURCES}
        dominant = max(shares, key=shares.__getitem__)
        cells = [
            f"{sum(r['joules_per_token'] for r in mine) / n:.3f}",
            f"{sum(r['avg_power_w'] for r in mine) / n:.1f}",
            f"{sum(r['edp_j_s'] for r in mine) / n:.3g}",
            *(f"{100 * shares[res]:.0f}" for res in RESOURCES),
            dominant,
        ]
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
