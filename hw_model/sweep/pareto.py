"""A sweep's records as a table and its Pareto fronts: one set of columns, speedups against the grid's baseline,
configurations averaged over seeds, the latency/resource fronts per workload and axis."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hw_model.sweep.grid import FEASIBLE_KEY, HARDWARE_COLUMN_PREFIX, LATENCY_KEY, NONDETERMINISTIC_KEY, WALL_KEY


def rectangular(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The records with one set of columns (first-seen order), None where a record has no value: policies
    report different counters (prefetch, cache), and a table needs every column in every row."""
    columns = list(dict.fromkeys(k for r in records for k in r))
    columns = [k for k in columns if k != WALL_KEY] + [k for k in columns if k == WALL_KEY]  # measured time last
    return [{k: r.get(k) for k in columns} for r in records]


def add_speedups(records: Sequence[dict[str, Any]], baseline: str | None) -> None:
    """Set ``speedup_vs_baseline`` = the baseline policy's latency / this latency at the same coordinates."""
    if baseline is None:
        return

    def key(r: Mapping[str, Any]) -> tuple:
        return tuple(sorted((k, v) for k, v in r.items() if k in _coordinate_keys(r) and k != "policy"))

    base = {key(r): r[LATENCY_KEY] for r in records if r["policy"] == baseline and r.get(LATENCY_KEY)}
    for r in records:
        reference = base.get(key(r))
        r["speedup_vs_baseline"] = reference / r[LATENCY_KEY] if reference and r.get(LATENCY_KEY) else None


_COORDINATES = ("model", "hw", "ndp_units", "policy", "skew_level", "skew", "trace", "seed", "residency_fraction")


WORKLOAD_KEYS = ("model", "trace", "skew_level")  # what is simulated; a Pareto front is per workload


DESIGN_KEYS = ("hw", "ndp_units", "policy", "residency_fraction")  # what is chosen (plus the hw.* axes)


def _coordinate_keys(record: Mapping[str, Any]) -> set[str]:
    return set(_COORDINATES) | {k for k in record if k.startswith(HARDWARE_COLUMN_PREFIX)}


def pareto_front(rows: Sequence[Mapping[str, Any]], x: str, y: str = LATENCY_KEY) -> list[Mapping[str, Any]]:
    """Rows no other row beats on both ``x`` (a resource: less is better) and ``y`` (latency), sorted by
    ``x``; of rows with equal ``x`` and ``y`` the first given is kept."""
    usable = [(r[x], r[y], i, r) for i, r in enumerate(rows) if r.get(x) is not None and r.get(y) is not None]
    front: list[Mapping[str, Any]] = []
    best = math.inf
    for _, value, _, row in sorted(usable, key=lambda t: t[:3]):
        if value < best:
            front.append(row)
            best = value
    return front


def _design_keys(record: Mapping[str, Any]) -> list[str]:
    return [*DESIGN_KEYS, *sorted(k for k in record if k.startswith(HARDWARE_COLUMN_PREFIX))]


def configurations(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (workload, design) configuration: its coordinates, the mean latency over its seeds,
    how many seeds and which points; rows in the order of their first point. Failed points are left out, and
    so is a configuration any of whose points is infeasible (as ``ndp-ep bench`` leaves them out: n/f)."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    infeasible: set[tuple] = set()
    for r in records:
        if r.get(LATENCY_KEY) is not None:
            key = tuple((k, r[k]) for k in (*WORKLOAD_KEYS, *_design_keys(r)))
            groups.setdefault(key, []).append(r)
            if r.get(FEASIBLE_KEY) is False:
                infeasible.add(key)
    rows = []
    for key, members in groups.items():
        if key in infeasible:
            continue
        row: dict[str, Any] = dict(key)
        row[LATENCY_KEY] = sum(m[LATENCY_KEY] for m in members) / len(members)
        row["seeds"] = len(members)
        row["points"] = [m["point"] for m in members]
        rows.append(row)
    return rows


def pareto_fronts(records: Sequence[Mapping[str, Any]], axes: Sequence[str]) -> list[dict[str, Any]]:
    """For each workload (model, trace, skew level) and each resource axis, the configurations on the
    latency/resource Pareto front (latency averaged over seeds): ``{model, trace, skew_level, axis, front}``;
    a workload none of whose configurations is feasible has an empty front."""
    rows = configurations(records)
    workloads = list(dict.fromkeys(tuple(r[k] for k in WORKLOAD_KEYS) for r in records))
    out = []
    for workload in workloads:
        mine = [r for r in rows if tuple(r[k] for k in WORKLOAD_KEYS) == workload]
        for axis in axes:
            out.append(
                {**dict(zip(WORKLOAD_KEYS, workload, strict=True)), "axis": axis, "front": pareto_front(mine, axis)}
            )
    return out


def comparable_records(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The records without measured wall-time columns: equal for equal inputs, whichever backend ran them."""
    return [{k: v for k, v in r.items() if not NONDETERMINISTIC_KEY.search(k)} for r in records]
