"""Energy tables of ``ndp-ep bench`` (markdown): decode J/token per policy per model x NDP count, and per policy its
mean J/token, average power, energy-delay product and each resource's share (the fields: :mod:`hw_model.bench_energy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hw_model.bench import BASELINE_POLICIES, OURS_POLICY, main_table
from hw_model.bench_tables import _model_order, policy_cells
from hw_model.energy import RESOURCES
from hw_model.policies import POLICIES, policy_names


def _order(records: Sequence[dict[str, Any]]) -> tuple[list[str], list[tuple[str, int]]]:
    policies = [p for p in POLICIES if any(r["policy"] == p for r in records)]
    keys = sorted({(r["model"], r["ndp_units"]) for r in records}, key=lambda k: (*_model_order(k[0]), k[1]))
    return policies, keys


def format_energy_table(records: Sequence[dict[str, Any]]) -> str:
    """Decode J/token per policy (model x NDP rows, the main table's records), ours against the lowest-energy
    feasible baseline, then per policy its mean J/token, average power, energy-delay product and dominant resource.
    Empty when no record carries energy."""
    # the lower bound is a bound on latency, not a system: its timeline carries no work to price
    bounds = set(policy_names("bound"))
    rows = [r for r in main_table(records) if r.get("energy_j") is not None and r["policy"] not in bounds]
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
        best_policy = best["policy"] if best is not None else None
        cells = policy_cells(same, policies, best_policy, lambda r: f"{r['joules_per_token']:.3f}")
        ours = same.get(OURS_POLICY)
        ratio = "-"
        if ours is not None and ours["feasible"] and best is not None:
            less = best["joules_per_token"] / ours["joules_per_token"]
            ratio = f"{less:.2f}× less" if less >= 1 else f"{1 / less:.2f}× more"
            ratio += f" ({best['policy']})"
        lines.append(f"| {model} | {units} | " + " | ".join(cells) + f" | {ratio} |")
    lines += ["", _policy_summary(rows, policies, keys)]
    return "\n".join(lines)


def _policy_summary(rows: Sequence[dict[str, Any]], policies: Sequence[str], keys: Sequence[tuple[str, int]]) -> str:
    """Per policy, means over the rows (model x NDP) where every policy is feasible: J/token, average power, EDP
    and each resource's share of the request's joules."""
    common = [
        key
        for key in keys
        if all(
            any(r["policy"] == p and (r["model"], r["ndp_units"]) == key and r["feasible"] for r in rows)
            for p in policies
        )
    ]
    header = "| policy | J/token | avg W | EDP, J·s | " + " | ".join(RESOURCES) + " | dominant |"
    lines = [
        f"Per policy, means over the {len(common)} rows where every policy is feasible (energy shares per resource, "
        "% of the request's joules)",
        "",
        header,
        "|---|---|---|---|" + "---|" * (len(RESOURCES) + 1),
    ]
    for policy in policies:
        mine = [r for r in rows if r["policy"] == policy and (r["model"], r["ndp_units"]) in common]
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
