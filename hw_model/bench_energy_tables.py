"""Energy tables of ``ndp-ep bench`` (markdown): decode J/token per policy per model x NDP count, and per policy its
mean J/token, average power, energy-delay product and each resource's share (the fields: :mod:`hw_model.bench_energy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hw_model.bench import BASELINE_POLICIES, OURS_POLICY, main_table
from hw_model.bench_tables import _model_order
from hw_model.energy import RESOURCES
from hw_model.policies import POLICIES


def _order(records: Sequence[dict[str, Any]]) -> tuple[list[str], list[tuple[str, int]]]:
    policies = [p for p in POLICIES if any(r["policy"] == p for r in records)]
    keys = sorted({(r["model"], r["ndp_units"]) for r in records}, key=lambda k: (*_model_order(k[0]), k[1]))
    return policies, keys


def format_energy_table(records: Sequence[dict[str, Any]]) -> str:
    """Decode J/token per policy (model x NDP rows, the main table's records), ours against the lowest-energy
    feasible baseline, then per policy its mean J/token, average power, energy-delay product and dominant resource.
    Empty when no record carries energy."""
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
