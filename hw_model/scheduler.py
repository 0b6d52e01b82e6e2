"""Load-balancing placement of one MoE layer's expert work on the GPU and the NDP units.

The problem (one MoE layer invocation). Expert weights live in the NDP units' DRAM. Every *item* is one
activated expert; if it stays in memory it adds ``ndp_time_s[i, u]`` to each NDP unit ``u`` (a tensor-parallel
expert adds a shard's time to every unit that holds a slice of it; a whole expert adds its full time to its
one home unit). Or it runs on the GPU, which must first pull its weights over PCIe unless they are resident::

    item i ──┬── NDP:  unit_load[u] += ndp_time_s[i, u]   for every unit u holding a slice of i
             └── GPU:  pcie_load    += transfer_s[i]      (0 when resident in GPU memory)
                       gpu_load     += gpu_compute_s[i]
                       staged_bytes += transfer_bytes[i]  <= staging_cap_bytes
                       unit_load[u] += copy_unit_s[i, u]  the copy reads unit u's DRAM (0 when resident)

    makespan = max(pcie_load, gpu_load, max_u unit_load[u])   (PCIe copies and GPU compute overlap)

:func:`pack` is the run-time decision, a "lightweight bin packing": the GPU bin (two dimensions, PCIe time and
compute time, plus a memory cap) is filled with the items that cost the GPU least per NDP second they save,
keeping the best prefix of three such orderings, then a few single moves and swaps on the critical bin.
:func:`solve_exact` is the reference optimum from a MILP (``scipy.optimize.milp``, HiGHS), used in tests to
bound the packer's loss. Both minimise exactly :func:`makespan_s`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hw_model.errors import WorkloadError

_IMPROVEMENT_STEPS = 12
_SWAP_CANDIDATES = 8


@dataclass(frozen=True)
class PlacementProblem:
    """One layer's items. Times in seconds, sizes in bytes; ``ndp_time_s`` is ``[items, units]``."""

    ndp_time_s: np.ndarray
    gpu_compute_s: np.ndarray
    transfer_s: np.ndarray
    transfer_bytes: np.ndarray
    staging_cap_bytes: float = float("inf")
    # None: zeros (set in __post_init__, so always an array when read)
    unit_base_s: np.ndarray = None  # type: ignore[assignment]
    gpu_base_s: float = 0.0
    pcie_base_s: float = 0.0
    copy_unit_s: np.ndarray = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        ndp = np.asarray(self.ndp_time_s, dtype=np.float64)
        if ndp.ndim != 2 or (ndp < 0).any() or not np.isfinite(ndp).all():
            raise WorkloadError("PlacementProblem.ndp_time_s must be a finite non-negative [items, units] array")
        object.__setattr__(self, "ndp_time_s", ndp)
        n, units = ndp.shape
        for name in ("gpu_compute_s", "transfer_s", "transfer_bytes"):
            arr = np.asarray(getattr(self, name), dtype=np.float64)
            if arr.shape != (n,) or (arr < 0).any() or not np.isfinite(arr).all():
                raise WorkloadError(f"PlacementProblem.{name} must be {n} finite non-negative numbers")
            object.__setattr__(self, name, arr)
        base = np.zeros(units) if self.unit_base_s is None else np.asarray(self.unit_base_s, dtype=np.float64)
        if base.shape != (units,) or (base < 0).any():
            raise WorkloadError("PlacementProblem.unit_base_s must have one non-negative entry per unit")
        object.__setattr__(self, "unit_base_s", base)
        copy = np.zeros_like(ndp) if self.copy_unit_s is None else np.asarray(self.copy_unit_s, dtype=np.float64)
        if copy.shape != ndp.shape or (copy < 0).any() or not np.isfinite(copy).all():
            raise WorkloadError("PlacementProblem.copy_unit_s must be a finite non-negative [items, units] array")
        object.__setattr__(self, "copy_unit_s", copy)
        if not self.staging_cap_bytes >= 0:
            raise WorkloadError("PlacementProblem.staging_cap_bytes must be non-negative")

    @property
    def num_items(self) -> int:
        return int(self.ndp_time_s.shape[0])

    @property
    def num_units(self) -> int:
        return int(self.ndp_time_s.shape[1])


def makespan_s(problem: PlacementProblem, on_gpu: np.ndarray) -> float:
    """The objective both solvers minimise; ``on_gpu[i]`` says item ``i`` runs on the GPU."""
    on_gpu = np.asarray(on_gpu, dtype=bool)
    pcie = problem.pcie_base_s + float(problem.transfer_s[on_gpu].sum())
    gpu = problem.gpu_base_s + float(problem.gpu_compute_s[on_gpu].sum())
    units = problem.unit_base_s + problem.ndp_time_s[~on_gpu].sum(axis=0) + problem.copy_unit_s[on_gpu].sum(axis=0)
    return max(pcie, gpu, float(units.max()) if units.size else 0.0)


def is_feasible(problem: PlacementProblem, on_gpu: np.ndarray) -> bool:
    """Whether the staged (non-resident) bytes fit the GPU staging capacity."""
    staged = float(problem.transfer_bytes[np.asarray(on_gpu, dtype=bool)].sum())
    return staged <= problem.staging_cap_bytes * (1 + 1e-9)


def pack(problem: PlacementProblem) -> np.ndarray:
    """Greedy placement (the run-time decision). Returns ``on_gpu``, a boolean per item."""
    n = problem.num_items
    if n == 0:
        return np.zeros(0, dtype=bool)
    ndp = problem.ndp_time_s
    t = problem.transfer_s
    g = problem.gpu_compute_s
    b = problem.transfer_bytes
    cap = problem.staging_cap_bytes * (1 + 1e-9)
    base = problem.unit_base_s
    copy = problem.copy_unit_s
    if ndp.shape[1] > 1 and (ndp == ndp[:, :1]).all() and (copy == copy[:, :1]).all() and (base == base[0]).all():
        # every item is sliced evenly over identical units: the units move in lockstep, track one of them
        ndp, copy, base = ndp[:, :1], copy[:, :1], base[:1]
    unit_total = base + ndp.sum(axis=0)
    delta = ndp - copy  # what moving an item to the GPU takes off each unit (its copy reads the DRAM too)
    if unit_total.size == 0:
        unit_total = np.zeros(1)
        delta = np.zeros((n, 1))
    saved = np.maximum(delta.max(axis=1), 0.0) + 1e-30  # what moving the item takes off its busiest unit
    ndp = delta

    # Phase 1: fill the GPU in order of cost per NDP second saved; keep the best prefix over three orderings
    # (by the GPU side's bottleneck, its total, its compute), evaluated together as one [3, n] batch.
    costs = np.stack((np.maximum(t, g), t + g, g))
    orders = np.argsort(costs / saved, axis=1, kind="stable")
    unit_left = (unit_total - np.cumsum(ndp[orders], axis=1)).max(axis=2)
    pcie = problem.pcie_base_s + np.cumsum(t[orders], axis=1)
    gpu = problem.gpu_base_s + np.cumsum(g[orders], axis=1)
    spans = np.maximum(np.maximum(pcie, gpu), unit_left)
    spans[np.cumsum(b[orders], axis=1) > cap] = np.inf
    flat = int(np.argmin(spans))
    which, k = divmod(flat, n)
    on_gpu = np.zeros(n, dtype=bool)
    if spans[which, k] < max(float(unit_total.max()), problem.pcie_base_s, problem.gpu_base_s):
        on_gpu[orders[which, : k + 1]] = True

    # Phase 2: a few single moves / swaps that shorten the critical bin.
    unit_load = unit_total - ndp[on_gpu].sum(axis=0)
    pcie_load = problem.pcie_base_s + float(t[on_gpu].sum())
    gpu_load = problem.gpu_base_s + float(g[on_gpu].sum())
    staged = float(b[on_gpu].sum())
    ratio = np.maximum(t, g) / saved
    for _ in range(_IMPROVEMENT_STEPS):
        critical_unit = int(np.argmax(unit_load))
        current = max(pcie_load, gpu_load, float(unit_load[critical_unit]))
        move: tuple[int | None, int | None] | None = None
        if unit_load[critical_unit] >= current:  # an NDP unit is critical: bring one of its items to the GPU
            cand = np.flatnonzero(~on_gpu & (ndp[:, critical_unit] > 0) & (staged + b <= cap))
            if cand.size:
                spans = np.maximum(
                    np.maximum(pcie_load + t[cand], gpu_load + g[cand]), (unit_load - ndp[cand]).max(axis=1)
                )
                j = int(np.argmin(spans))
                if spans[j] < current * (1 - 1e-12):
                    move = (None, int(cand[j]))
        else:  # the GPU side is critical: send one of its items home
            cand = np.flatnonzero(on_gpu)
            if cand.size:
                spans = np.maximum(
                    np.maximum(pcie_load - t[cand], gpu_load - g[cand]), (unit_load + ndp[cand]).max(axis=1)
                )
                j = int(np.argmin(spans))
                if spans[j] < current * (1 - 1e-12):
                    move = (int(cand[j]), None)
        if move is None:
            in_idx = np.flatnonzero(on_gpu)
            out_idx = np.flatnonzero(~on_gpu)
            if not (in_idx.size and out_idx.size):
                break
            # swaps between the GPU items cheapest to send home and the NDP items cheapest to bring in
            back = in_idx[np.argsort(-ratio[in_idx])[:_SWAP_CANDIDATES]]
            come = out_idx[np.argsort(ratio[out_idx])[:_SWAP_CANDIDATES]]
            loads = unit_load + ndp[back][:, None, :] - ndp[come][None, :, :]
            spans = np.maximum(
                np.maximum(pcie_load - t[back][:, None] + t[come], gpu_load - g[back][:, None] + g[come]),
                loads.max(axis=2),
            )
            spans[staged - b[back][:, None] + b[come] > cap] = np.inf
            k = int(np.argmin(spans))
            if not spans.flat[k] < current * (1 - 1e-12):
                break
            r, c = np.unravel_index(k, spans.shape)
            move = (int(back[r]), int(come[c]))
        home_item, gpu_item = move
        if gpu_item is not None:
            on_gpu[gpu_item] = True
            unit_load = unit_load - ndp[gpu_item]
            pcie_load += float(t[gpu_item])
            gpu_load += float(g[gpu_item])
            staged += float(b[gpu_item])
        if home_item is not None:
            on_gpu[home_item] = False
            unit_load = unit_load + ndp[home_item]
            pcie_load -= float(t[home_item])
            gpu_load -= float(g[home_item])
            staged -= float(b[home_item])
    return on_gpu


def solve_exact(problem: PlacementProblem, time_limit_s: float = 10.0) -> tuple[np.ndarray, float]:
    """Optimal placement from a MILP (HiGHS). Returns ``(on_gpu, makespan_s)``."""
    on_gpu = solve_exact_modes(problem, (), time_limit_s) < 0
    return on_gpu, makespan_s(problem, on_gpu)


@dataclass(frozen=True)
class ItemMode:
    """Another way to run every item of a :class:`PlacementProblem` (the richer problem: a tensor-parallel degree
    per expert, or part of an expert on the GPU): what item ``i`` then adds to each NDP unit (``unit_s[i, u]``),
    to PCIe, to the GPU and to the staged bytes. Sizes are checked against the problem when solving."""

    unit_s: np.ndarray
    # None: zeros (set in __post_init__, so always an array when read); a sequence is made an array
    pcie_s: np.ndarray | Sequence[float] = None  # type: ignore[assignment]
    gpu_s: np.ndarray | Sequence[float] = None  # type: ignore[assignment]
    staged_bytes: np.ndarray | Sequence[float] = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        unit = np.asarray(self.unit_s, dtype=np.float64)
        if unit.ndim != 2 or (unit < 0).any() or not np.isfinite(unit).all():
            raise WorkloadError("ItemMode.unit_s must be a finite non-negative [items, units] array")
        object.__setattr__(self, "unit_s", unit)
        for name in ("pcie_s", "gpu_s", "staged_bytes"):
            value = getattr(self, name)
            arr = np.zeros(unit.shape[0]) if value is None else np.asarray(value, dtype=np.float64)
            if arr.shape != (unit.shape[0],) or (arr < 0).any() or not np.isfinite(arr).all():
                raise WorkloadError(f"ItemMode.{name} must be {unit.shape[0]} finite non-negative numbers")
            object.__setattr__(self, name, arr)


def _all_modes(problem: PlacementProblem, modes: Sequence[ItemMode]) -> list[ItemMode]:
    """Choice ``-1`` (the GPU), ``0`` (the problem's NDP times), then ``modes``, as a list indexed by choice + 1."""
    n = problem.num_items
    gpu = ItemMode(problem.copy_unit_s, problem.transfer_s, problem.gpu_compute_s, problem.transfer_bytes)
    all_modes = [gpu, ItemMode(problem.ndp_time_s), *modes]
    if any(m.unit_s.shape != problem.ndp_time_s.shape for m in all_modes):
        raise WorkloadError(f"every mode must cover the problem's [{n}, {problem.num_units}] items and units")
    return all_modes


def makespan_modes_s(problem: PlacementProblem, modes: Sequence[ItemMode], choice: np.ndarray) -> float:
    """The objective of the richer problem: item ``i`` on the GPU where ``choice[i]`` is ``-1``, on the NDP units
    as the problem has it where ``0``, in ``modes[choice[i] - 1]`` otherwise."""
    all_modes = _all_modes(problem, modes)
    picked = np.asarray(choice, dtype=np.int64) + 1
    rows = np.arange(problem.num_items)
    unit = np.stack([m.unit_s for m in all_modes])[picked, rows].sum(axis=0)
    pcie = problem.pcie_base_s + float(np.stack([m.pcie_s for m in all_modes])[picked, rows].sum())
    gpu = problem.gpu_base_s + float(np.stack([m.gpu_s for m in all_modes])[picked, rows].sum())
    units = problem.unit_base_s + unit
    return max(pcie, gpu, float(units.max()) if units.size else 0.0)


def staged_bytes_of(problem: PlacementProblem, modes: Sequence[ItemMode], choice: np.ndarray) -> float:
    """The bytes a choice of the richer problem stages on the GPU (within ``problem.staging_cap_bytes`` if
    feasible)."""
    picked = np.asarray(choice, dtype=np.int64) + 1
    staged = np.stack([m.staged_bytes for m in _all_modes(problem, modes)])
    return float(staged[picked, np.arange(problem.num_items)].sum())


def solve_exact_modes(problem: PlacementProblem, modes: Sequence[ItemMode], time_limit_s: float = 10.0) -> np.ndarray:
    """Optimal choice of the richer problem (see :func:`makespan_modes_s`) from a MILP (HiGHS): per item, ``-1``
    (the GPU), ``0`` (the problem's NDP times) or ``m`` (``modes[m - 1]``). With no modes it is
    :func:`solve_exact`'s problem."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    n, units = problem.ndp_time_s.shape
    all_modes = _all_modes(problem, modes)
    k = len(all_modes)
    # variables: y_{i,m} (1 = item i in mode m; item-major, mode 0 the GPU), then the makespan C
    width = n * k + 1
    rows, lower, upper = [], [], []
    for i in range(n):  # each item placed once
        r = np.zeros(width)
        r[i * k : (i + 1) * k] = 1.0
        rows.append(r)
        lower.append(1.0)
        upper.append(1.0)

    def load_row(per_mode: list[np.ndarray]) -> np.ndarray:
        r = np.zeros(width)
        for m, values in enumerate(per_mode):
            r[m : n * k : k] = values
        r[-1] = -1.0
        return r

    loads: list[tuple[list[np.ndarray], float]] = [
        ([np.asarray(m.pcie_s) for m in all_modes], problem.pcie_base_s),
        ([np.asarray(m.gpu_s) for m in all_modes], problem.gpu_base_s),
        *(([m.unit_s[:, u] for m in all_modes], float(problem.unit_base_s[u])) for u in range(units)),
    ]
    # in units of the largest time: the solver's tolerances are absolute (~1e-7), and layer times are microseconds
    scale = max(
        [float(base) for _, base in loads] + [float(v.max()) for per_mode, _ in loads for v in per_mode if v.size]
    )
    scale = scale if scale > 0 else 1.0
    for per_mode, base in loads:  # base + sum_{i,m} load_m[i] y_{i,m} <= C
        rows.append(load_row([v / scale for v in per_mode]))
        lower.append(-np.inf)
        upper.append(-base / scale)
    if np.isfinite(problem.staging_cap_bytes):
        per_mode = [np.asarray(m.staged_bytes) for m in all_modes]
        size = max([problem.staging_cap_bytes] + [float(v.max()) for v in per_mode if v.size]) or 1.0
        r = load_row([v / size for v in per_mode])
        r[-1] = 0.0
        rows.append(r)
        lower.append(-np.inf)
        upper.append(problem.staging_cap_bytes / size)
    objective = np.zeros(width)
    objective[-1] = 1.0
    result = milp(
        objective,
        constraints=LinearConstraint(np.array(rows), np.array(lower), np.array(upper)),
        integrality=np.append(np.ones(width - 1), 0),
        bounds=Bounds(np.zeros(width), np.append(np.ones(width - 1), np.inf)),
        options={"time_limit": time_limit_s, "mip_rel_gap": 1e-9},
    )
    if result.x is None:
        raise WorkloadError(f"MILP found no placement: {result.message}")
    return result.x[: n * k].reshape(n, k).argmax(axis=1) - 1
