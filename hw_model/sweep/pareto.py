"""A sweep's records as a table and its Pareto fronts: one set of columns, speedups against the grid's baseline,
configurations averaged over seeds, the latency/resource fronts per workload and axis; energy (``energy_j``, the
request's joules, hw_model/energy.py) is always one of the axes when the records carry it."""

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
        coordinates = _coordinate_keys(r)  # once per record (it scans the record's keys)
        return tuple(sorted((k, v) for k, v in r.items() if k in coordinates and k != "policy"))

    base = {key(r): r[LATENCY_KEY] for r in records if r["policy"] == baseline and r.get(LATENCY_KEY)}
    for r in records:
        reference = base.get(key(r))
        r["speedup_vs_baseline"] = reference / r[LATENCY_KEY] if reference and r.get(LATENCY_KEY) else None


_COORDINATES = ("model", "hw", "ndp_units", "policy", "skew_level", "skew", "trace", "seed", "residency_fraction")


WORKLOAD_KEYS = ("model", "trace", "skew_level")  # what is simulated; a Pareto front is per workload
ENERGY_KEY = "energy_j"  # the request's simulated joules: a Pareto axis of every sweep whose hardware prices energy


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


def configurations(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
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
        energies = [m.get(ENERGY_KEY) for m in members]
        row[ENERGY_KEY] = None if None in energies else sum(energies) / len(energies)
        row["seeds"] = len(members)
        row["points"] = [m["point"] for m in members]
        rows.append(row)
    return rows


def pareto_fronts(records: Sequence[Mapping[str, Any]], axes: Sequence[str]) -> list[dict[str, Any]]:
    """For each workload (model, trace, skew level) and each resource axis, the configurations on the
    latency/resource Pareto front (latency averaged over seeds): ``{model, trace, skew_level, axis, front}``;
    a workload none of whose configurations is feasible has an empty front. ``energy_j`` (latency against energy)
    is added to ``axes`` when the records carry it."""
    rows = configurations(records)
    if any(r.get(ENERGY_KEY) is not None for r in rows) and ENERGY_KEY not in axes:
        axes = (*axes, ENERGY_KEY)
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


class FrontBuilder:
    """:func:`pareto_fronts` of records given one at a time in grid order (:func:`hw_model.sweep.grid.iter_points`),
    holding only the open block's configurations and each front, not the records: a configuration's seeds all fall
    within one block of workload, hardware and NDP count, so when the block changes its configurations are complete
    and each is offered to its fronts. A front keeps a row unless another row is at most as large on both axes and
    comes first in :func:`pareto_front`'s order (resource, latency, first point), exactly the rows that
    function returns."""

    def __init__(self, axes: Sequence[str]) -> None:
        self.axes = tuple(axes)
        self._workloads: dict[tuple, None] = {}  # first-seen order
        self._block: tuple | None = None
        # the open block's configurations (first-point order): their points' latencies, energies and indices, the
        # three lists a configuration row is made of (summed as configurations() sums them: the same floats)
        self._open: dict[tuple, tuple[list[Any], list[Any], list[int]]] = {}
        self._infeasible: set[tuple] = set()
        self._rank = 0  # configurations in first-point order (pareto_front's tie-break)
        self._fronts: dict[tuple[tuple, str], list[tuple[Any, Any, int, dict[str, Any]]]] = {}
        self._energy = False  # any configuration with energy: the energy axis is added

    def add(self, record: Mapping[str, Any]) -> None:
        workload = tuple(record[k] for k in WORKLOAD_KEYS)
        self._workloads.setdefault(workload, None)
        if record.get(LATENCY_KEY) is None:
            return
        design = _design_keys(record)
        block = workload + tuple((k, record[k]) for k in design if k not in ("policy", "residency_fraction"))
        if block != self._block:
            self._close()
            self._block = block
        key = tuple((k, record[k]) for k in (*WORKLOAD_KEYS, *design))
        latencies, energies, points = self._open.setdefault(key, ([], [], []))
        latencies.append(record[LATENCY_KEY])
        energies.append(record.get(ENERGY_KEY))
        points.append(record["point"])
        if record.get(FEASIBLE_KEY) is False:
            self._infeasible.add(key)

    def _close(self) -> None:
        """Offer every complete configuration of the block to its workload's fronts (as :func:`configurations`)."""
        for key, (latencies, energies, points) in self._open.items():
            self._rank += 1
            if key in self._infeasible:
                continue
            row: dict[str, Any] = dict(key)
            row[LATENCY_KEY] = sum(latencies) / len(latencies)
            row[ENERGY_KEY] = None if None in energies else sum(energies) / len(energies)
            row["seeds"] = len(points)
            row["points"] = points
            self._energy = self._energy or row[ENERGY_KEY] is not None
            workload = tuple(row[k] for k in WORKLOAD_KEYS)
            for axis in dict.fromkeys((*self.axes, ENERGY_KEY)):
                if row.get(axis) is not None and row.get(LATENCY_KEY) is not None:
                    entry = (row[axis], row[LATENCY_KEY], self._rank, row)
                    self._offer(self._fronts.setdefault((workload, axis), []), entry)
        self._open = {}
        self._infeasible = set()

    @staticmethod
    def _offer(front: list[tuple[Any, Any, int, dict[str, Any]]], new: tuple[Any, Any, int, dict[str, Any]]) -> None:
        def beats(a: tuple, b: tuple) -> bool:
            return a[0] <= b[0] and a[1] <= b[1] and a[:3] < b[:3]

        if any(beats(kept, new) for kept in front):
            return
        front[:] = [kept for kept in front if not beats(new, kept)]
        front.append(new)

    def fronts(self) -> list[dict[str, Any]]:
        """The fronts of every record added, as :func:`pareto_fronts` gives them."""
        self._close()
        self._block = None
        axes = (*self.axes, ENERGY_KEY) if self._energy and ENERGY_KEY not in self.axes else self.axes
        out = []
        for workload in self._workloads:
            for axis in axes:
                front = [t[3] for t in sorted(self._fronts.get((workload, axis), []), key=lambda t: t[:3])]
                out.append({**dict(zip(WORKLOAD_KEYS, workload, strict=True)), "axis": axis, "front": front})
        return out
