"""The exact optima of the load-balancing placement problem (:class:`hw_model.scheduler.PlacementProblem`), from a MILP
(``scipy.optimize.milp``, HiGHS): :func:`solve_exact` for the problem itself and :func:`solve_exact_modes` for the
richer problem, where an item may also run in other ways (:class:`ItemMode`: a tensor-parallel degree per expert,
or part of an expert on the GPU), with its objective :func:`makespan_modes_s`. Reference oracles: the tests bound
the packer's loss with them and ``benchmarks/bench_scheduler.py`` measures it; the simulator never calls them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hw_model.errors import WorkloadError
from hw_model.scheduler import PlacementProblem, makespan_s, span_s


def solve_exact(problem: PlacementProblem, time_limit_s: float = 10.0) -> tuple[np.ndarray, float]:
    """Optimal placement from a MILP (HiGHS). Returns ``(on_gpu, makespan_s)``."""
    on_gpu = solve_exact_modes(problem, (), time_limit_s) < 0
    return on_gpu, makespan_s(problem, on_gpu)


@dataclass(frozen=True)
class ItemMode:
    """Another way to run every item of a :class:`PlacementProblem` (the richer problem: a tensor-parallel degree
    per expert, or part of an expert on the GPU): what item ``i`` then adds to each NDP unit's kernel bin
    (``unit_s[i, u]``) and DRAM bin (``dram_s[i, u]``, which counts only where the problem has ``ndp_dram_s``), to
    PCIe, to the GPU and to the staged bytes. A mode other than the GPU keeps the item on the units (it pays
    their start-up and way back, see :class:`PlacementProblem`); its GPU part, if copied (``pcie_s > 0``),
    starts after its copy. Sizes are checked against the problem when solving."""

    unit_s: np.ndarray
    # None: zeros (set in __post_init__, so always an array when read); a sequence is made an array
    pcie_s: np.ndarray | Sequence[float] = None  # type: ignore[assignment]
    gpu_s: np.ndarray | Sequence[float] = None  # type: ignore[assignment]
    staged_bytes: np.ndarray | Sequence[float] = None  # type: ignore[assignment]
    dram_s: np.ndarray = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        unit = np.asarray(self.unit_s, dtype=np.float64)
        if unit.ndim != 2 or (unit < 0).any() or not np.isfinite(unit).all():
            raise WorkloadError("ItemMode.unit_s must be a finite non-negative [items, units] array")
        object.__setattr__(self, "unit_s", unit)
        dram = np.zeros_like(unit) if self.dram_s is None else np.asarray(self.dram_s, dtype=np.float64)
        if dram.shape != unit.shape or (dram < 0).any() or not np.isfinite(dram).all():
            raise WorkloadError("ItemMode.dram_s must be a finite non-negative [items, units] array like unit_s")
        object.__setattr__(self, "dram_s", dram)
        for name in ("pcie_s", "gpu_s", "staged_bytes"):
            value = getattr(self, name)
            arr = np.zeros(unit.shape[0]) if value is None else np.asarray(value, dtype=np.float64)
            if arr.shape != (unit.shape[0],) or (arr < 0).any() or not np.isfinite(arr).all():
                raise WorkloadError(f"ItemMode.{name} must be {unit.shape[0]} finite non-negative numbers")
            object.__setattr__(self, name, arr)


def _all_modes(problem: PlacementProblem, modes: Sequence[ItemMode]) -> list[ItemMode]:
    """Choice ``-1`` (the GPU), ``0`` (the problem's NDP times), then ``modes``, as a list indexed by choice + 1;
    every mode as (kernel bin, DRAM bin) per :meth:`PlacementProblem.unit_bins` (a mode's DRAM bin moves to its
    kernel bin where the problem has one bin per unit)."""
    n = problem.num_items
    k_ndp, d_ndp, k_gpu, d_gpu = problem.unit_bins()
    gpu = ItemMode(k_gpu, problem.transfer_s, problem.gpu_compute_s, problem.transfer_bytes, d_gpu)
    if problem.ndp_dram_s is None:
        modes = [ItemMode(m.unit_s + m.dram_s, m.pcie_s, m.gpu_s, m.staged_bytes) for m in modes]
    all_modes = [gpu, ItemMode(k_ndp, dram_s=d_ndp), *modes]
    if any(m.unit_s.shape != problem.ndp_time_s.shape for m in all_modes):
        raise WorkloadError(f"every mode must cover the problem's [{n}, {problem.num_units}] items and units")
    return all_modes


def makespan_modes_s(problem: PlacementProblem, modes: Sequence[ItemMode], choice: np.ndarray) -> float:
    """The objective of the richer problem: item ``i`` on the GPU where ``choice[i]`` is ``-1``, on the NDP units
    as the problem has it where ``0``, in ``modes[choice[i] - 1]`` otherwise."""
    all_modes = _all_modes(problem, modes)
    picked = np.asarray(choice, dtype=np.int64) + 1
    rows = np.arange(problem.num_items)

    def chosen(name: str) -> np.ndarray:
        return np.stack([getattr(m, name) for m in all_modes])[picked, rows]

    pcie = chosen("pcie_s")
    tails = np.where(pcie > 0, chosen("gpu_s"), np.inf)
    return float(
        span_s(
            problem,
            float(pcie.sum()),
            float(chosen("gpu_s").sum()),
            chosen("unit_s").sum(axis=0),
            chosen("dram_s").sum(axis=0),
            float(tails.min()) if tails.size else np.inf,
            bool((picked > 0).any()),
        )
    )


def staged_bytes_of(problem: PlacementProblem, modes: Sequence[ItemMode], choice: np.ndarray) -> float:
    """The bytes a choice of the richer problem stages on the GPU (within ``problem.staging_cap_bytes`` if
    feasible)."""
    picked = np.asarray(choice, dtype=np.int64) + 1
    staged = np.stack([m.staged_bytes for m in _all_modes(problem, modes)])
    return float(staged[picked, np.arange(problem.num_items)].sum())


def solve_exact_modes(problem: PlacementProblem, modes: Sequence[ItemMode], time_limit_s: float = 10.0) -> np.ndarray:
    """Optimal choice of the richer problem (see :func:`makespan_modes_s`) from a MILP (HiGHS): per item, ``-1``
    (the GPU), ``0`` (the problem's NDP times) or ``m`` (``modes[m - 1]``). With no modes it is
    :func:`solve_exact`'s problem.

    :func:`span_s` as linear constraints on the makespan ``C``: a binary ``z`` (some item stays on the units; fixed
    to 1 unless ``ndp_optional``) scales the units' start-up and the way back; with ``copy_tail``, binaries ``w``
    pick one copied (item, mode) whose GPU time follows the copies (at least one when anything is copied, at most
    one: minimising ``C`` picks the shortest)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    n, units = problem.ndp_time_s.shape
    all_modes = _all_modes(problem, modes)
    k = len(all_modes)
    pcie = np.stack([m.pcie_s for m in all_modes], axis=1)  # [items, modes]
    gpu = np.stack([m.gpu_s for m in all_modes], axis=1)
    copied = np.flatnonzero((pcie > 0).ravel()) if problem.copy_tail else np.zeros(0, dtype=np.int64)
    # variables: y_{i,m} (1 = item i in mode m; item-major, mode 0 the GPU), w per copied (i, m), z, then C
    ny, nw = n * k, copied.size
    iz, ic = ny + nw, ny + nw + 1
    width = ic + 1
    # in units of the largest time: the solver's tolerances are absolute (~1e-7), and layer times are microseconds
    times = [problem.pcie_base_s, problem.gpu_base_s, problem.result_s, problem.result_pcie_s, *problem.unit_base_s]
    times += [float(np.max(a)) for m in all_modes for a in (m.pcie_s, m.gpu_s, m.unit_s, m.dram_s) if np.size(a)]
    scale = max(times) or 1.0
    rows, lower, upper = [], [], []

    def add(row: np.ndarray, lo: float, hi: float) -> None:
        rows.append(row)
        lower.append(lo)
        upper.append(hi)

    for i in range(n):  # each item placed once; z is 1 if it stays on the units (any mode but the GPU)
        r = np.zeros(width)
        r[i * k : (i + 1) * k] = 1.0
        add(r, 1.0, 1.0)
        r = np.zeros(width)
        r[i * k + 1 : (i + 1) * k] = 1.0
        r[iz] = -1.0
        add(r, -np.inf, 0.0)
    for j, index in enumerate(copied):  # w_j <= y_j, and some w is picked if item i is copied in any mode
        r = np.zeros(width)
        r[ny + j], r[index] = 1.0, -1.0
        add(r, -np.inf, 0.0)
    if nw:
        r = np.zeros(width)
        r[ny : ny + nw] = 1.0
        add(r, -np.inf, 1.0)
        for i in range(n):
            r = np.zeros(width)
            r[ny : ny + nw] = 1.0
            mine = copied[copied // k == i]
            if mine.size:
                r[mine] = -1.0
                add(r, 0.0, np.inf)

    def load_row(per_item_mode: np.ndarray, z_coeff: float = 0.0) -> np.ndarray:
        r = np.zeros(width)
        r[:ny] = per_item_mode.ravel() / scale
        r[iz] = z_coeff / scale
        r[ic] = -1.0
        return r

    # base + sum_{i,m} load_m[i] y_{i,m} (+ z or w terms) <= C
    pcie_row = load_row(pcie)
    add(pcie_row, -np.inf, -problem.pcie_base_s / scale)
    if problem.result_pcie_s > 0:
        add(load_row(pcie, problem.result_pcie_s), -np.inf, -problem.pcie_base_s / scale)
    if nw:
        r = pcie_row.copy()
        r[ny : ny + nw] = gpu.ravel()[copied] / scale
        add(r, -np.inf, -problem.pcie_base_s / scale)
    add(load_row(gpu), -np.inf, -problem.gpu_base_s / scale)
    for name in ("unit_s", "dram_s"):
        per_unit = np.stack([getattr(m, name) for m in all_modes], axis=1)  # [items, modes, units]
        if name == "dram_s" and not per_unit.any():
            continue
        for u in range(units):
            add(load_row(per_unit[:, :, u], float(problem.unit_base_s[u]) + problem.result_s), -np.inf, 0.0)
    if np.isfinite(problem.staging_cap_bytes):
        staged = np.stack([m.staged_bytes for m in all_modes], axis=1)
        size = max(problem.staging_cap_bytes, float(staged.max()) if staged.size else 0.0) or 1.0
        r = np.zeros(width)
        r[:ny] = staged.ravel() / size
        add(r, -np.inf, problem.staging_cap_bytes / size)
    objective = np.zeros(width)
    objective[ic] = 1.0
    z_lower = 0.0 if problem.ndp_optional else 1.0
    result = milp(
        objective,
        constraints=LinearConstraint(np.array(rows), np.array(lower), np.array(upper)),
        integrality=np.append(np.ones(width - 1), 0),
        bounds=Bounds(np.append(np.zeros(width - 2), [z_lower, 0.0]), np.append(np.ones(width - 1), np.inf)),
        options={"time_limit": time_limit_s, "mip_rel_gap": 1e-9},
    )
    if result.x is None:
        raise WorkloadError(f"MILP found no placement: {result.message}")
    return result.x[:ny].reshape(n, k).argmax(axis=1) - 1
