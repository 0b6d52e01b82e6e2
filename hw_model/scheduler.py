"""Load-balancing placement of one MoE layer's expert work on the GPU and the NDP units.

The problem (one MoE layer invocation). Expert weights live in the NDP units' DRAM. Every *item* is one
activated expert; if it stays in memory it adds ``ndp_time_s[i, u]`` to each NDP unit ``u`` (a tensor-parallel
expert adds a shard's time to every unit that holds a slice of it; a whole expert adds its full time to its
one home unit). Or it runs on the GPU, which must first pull its weights over PCIe unless they are resident::

    item i ──┬── NDP:  unit u's kernels += ndp_time_s[i, u]   for every unit u holding a slice of i
             │         unit u's DRAM    += ndp_dram_s[i, u]   (when given)
             └── GPU:  pcie_load    += transfer_s[i]      (0 when resident in GPU memory)
                       gpu_load     += gpu_compute_s[i]
                       staged_bytes += transfer_bytes[i]  <= staging_cap_bytes
                       unit u       += copy_unit_s[i, u]  the copy reads unit u's DRAM (0 when resident)

    makespan = max(pcie_load, gpu_load, max_u unit_load[u])   (PCIe copies and GPU compute overlap)

With the plain fields a unit's load is the sum of its kernels and its copies' reads. The optional fields cost
the layer as :func:`hw_model.timeline.build_layer_timeline` lays it out: with ``ndp_dram_s`` a unit has two
bins, its kernels and its DRAM (its kernels' bytes plus the copies' reads), and ends with the later one; with
``copy_tail`` the GPU side ends no earlier than the copies plus the shortest GPU work of a copied item (that
item starts after its copy); ``result_s`` / ``result_pcie_s`` are the NDP outputs' way back to the GPU after the
last unit ends (and its PCIe part, queued after the copies); with ``ndp_optional`` the units' start-up
(``unit_base_s``) and that way back are paid only when some item stays on the units. :func:`span_s` is the one
home of that objective; everything else here sums a placement's loads and hands them to it.

:func:`pack` is the run-time decision, a "lightweight bin packing": the GPU bin (two dimensions, PCIe time and
compute time, plus a memory cap) is filled with the items that cost the GPU least per NDP second they save,
keeping the best prefix of three such orderings, then a few single moves and swaps. :func:`best_prefix` is the
prefix step alone over one given order (MoNDE's balancing rule). The reference optima, from a MILP, that the tests
bound the packer's loss with are in :mod:`hw_model.oracles` (``solve_exact``, and ``solve_exact_modes`` for the
richer problem). All of them minimise :func:`span_s`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hw_model.errors import WorkloadError

_IMPROVEMENT_STEPS = 12
_SWAP_CANDIDATES = 8


@dataclass(frozen=True)
class PlacementProblem:
    """One layer's items. Times in seconds, sizes in bytes; ``ndp_time_s`` is ``[items, units]``. The fields after
    ``copy_unit_s`` default to the plain sums (see the module docstring)."""

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
    ndp_dram_s: np.ndarray | None = None  # [items, units]; None: one bin per unit (kernels and copy reads summed)
    result_s: float = 0.0
    result_pcie_s: float = 0.0
    ndp_optional: bool = False
    copy_tail: bool = False

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
        for name in ("copy_unit_s", "ndp_dram_s"):
            value = getattr(self, name)
            if value is None and name == "ndp_dram_s":
                continue
            arr = np.zeros_like(ndp) if value is None else np.asarray(value, dtype=np.float64)
            if arr.shape != ndp.shape or (arr < 0).any() or not np.isfinite(arr).all():
                raise WorkloadError(f"PlacementProblem.{name} must be a finite non-negative [items, units] array")
            object.__setattr__(self, name, arr)
        if not self.staging_cap_bytes >= 0:
            raise WorkloadError("PlacementProblem.staging_cap_bytes must be non-negative")
        for name in ("gpu_base_s", "pcie_base_s", "result_s", "result_pcie_s"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0):
                raise WorkloadError(f"PlacementProblem.{name} must be a finite non-negative number")

    @property
    def num_items(self) -> int:
        return int(self.ndp_time_s.shape[0])

    @property
    def num_units(self) -> int:
        return int(self.ndp_time_s.shape[1])

    def unit_bins(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``[items, units]`` loads on each unit's kernel bin and DRAM bin: (kernels, DRAM) of an item left on the
        units, then (kernels, DRAM) of an item on the GPU (its copy's reads). Without ``ndp_dram_s`` the kernel
        bin carries the copies and the DRAM bin stays empty."""
        zeros = np.zeros_like(self.ndp_time_s)
        if self.ndp_dram_s is None:
            return self.ndp_time_s, zeros, self.copy_unit_s, zeros
        return self.ndp_time_s, self.ndp_dram_s, zeros, self.copy_unit_s


def span_s(
    problem: PlacementProblem,
    pcie_s: np.ndarray | float,
    gpu_s: np.ndarray | float,
    kernels_s: np.ndarray,
    dram_s: np.ndarray,
    tail_s: np.ndarray | float,
    on_ndp: np.ndarray | bool,
) -> np.ndarray:
    """The objective every solver here minimises, from a placement's loads (leading axes: a batch of placements):
    ``pcie_s`` the copies' PCIe seconds, ``gpu_s`` the GPU seconds, ``kernels_s`` / ``dram_s`` (``[..., units]``)
    each unit's kernel and DRAM bins, all without the problem's bases; ``tail_s`` the shortest GPU work of a copied
    item (``inf``: nothing copied); ``on_ndp`` whether any item stays on the units."""
    p = problem
    return span_terms_s(
        p.pcie_base_s,
        p.gpu_base_s,
        p.unit_base_s,
        p.result_s,
        p.result_pcie_s,
        p.ndp_optional,
        p.copy_tail,
        pcie_s,
        gpu_s,
        kernels_s,
        dram_s,
        tail_s,
        on_ndp,
    )


def span_terms_s(
    pcie_base_s: float,
    gpu_base_s: float,
    unit_base_s: np.ndarray,
    result_s: float,
    result_pcie_s: float,
    ndp_optional: bool,
    copy_tail: bool,
    pcie_s: np.ndarray | float,
    gpu_s: np.ndarray | float,
    kernels_s: np.ndarray,
    dram_s: np.ndarray,
    tail_s: np.ndarray | float,
    on_ndp: np.ndarray | bool,
) -> np.ndarray:
    """:func:`span_s` with the problem's terms given one by one (for callers that have them without building a
    :class:`PlacementProblem`)."""
    paid = np.asarray(on_ndp) | (not ndp_optional)  # whether the units' start-up and the way back are paid
    after = np.where(np.isinf(tail_s), 0.0, tail_s) if copy_tail else 0.0
    after = np.maximum(after, np.where(paid, result_pcie_s, 0.0))
    pcie = pcie_base_s + pcie_s + after
    gpu = gpu_base_s + gpu_s
    if len(unit_base_s):
        start = np.where(paid[..., None], unit_base_s + result_s, 0.0)
        unit = (start + np.maximum(kernels_s, dram_s)).max(axis=-1)
    else:
        unit = 0.0
    return np.maximum(np.maximum(pcie, gpu), unit)


def _copied_gpu_s(problem: PlacementProblem) -> np.ndarray:
    """Per item, its GPU seconds if running it there needs a copy, else ``inf`` (the copy tail's candidates)."""
    return np.where(problem.transfer_s > 0, problem.gpu_compute_s, np.inf)


def makespan_s(problem: PlacementProblem, on_gpu: np.ndarray) -> float:
    """The objective of a placement; ``on_gpu[i]`` says item ``i`` runs on the GPU."""
    on_gpu = np.asarray(on_gpu, dtype=bool)
    off = ~on_gpu
    k_ndp, d_ndp, k_gpu, d_gpu = problem.unit_bins()
    tails = _copied_gpu_s(problem)[on_gpu]
    return float(
        span_s(
            problem,
            float(problem.transfer_s[on_gpu].sum()),
            float(problem.gpu_compute_s[on_gpu].sum()),
            k_ndp[off].sum(axis=0) + k_gpu[on_gpu].sum(axis=0),
            d_ndp[off].sum(axis=0) + d_gpu[on_gpu].sum(axis=0),
            float(tails.min()) if tails.size else np.inf,
            bool(off.any()),
        )
    )


def is_feasible(problem: PlacementProblem, on_gpu: np.ndarray) -> bool:
    """Whether the staged (non-resident) bytes fit the GPU staging capacity."""
    staged = float(problem.transfer_bytes[np.asarray(on_gpu, dtype=bool)].sum())
    return staged <= problem.staging_cap_bytes * (1 + 1e-9)


class _Moves:
    """What moving each item from the NDP units to the GPU changes (the packer's incremental view). Where every
    item is sliced evenly over identical units (they move in lockstep), or there is one unit, one unit stands for
    all and the per-unit arrays drop the units axis (``[items]``, a float per placement; the maximum over one unit
    is that unit, so the objective is the same to the last bit)."""

    def __init__(self, problem: PlacementProblem) -> None:
        p = problem
        ndp, copy, dram = p.ndp_time_s, p.copy_unit_s, p.ndp_dram_s
        base = p.unit_base_s
        units = ndp.shape[1]
        self.problem = p
        self.units = units
        self.cap = p.staging_cap_bytes * (1 + 1e-9)
        # without ndp_dram_s every DRAM bin stays exactly 0.0 (sums and differences of zeros): None stands for it
        bins = (ndp, copy) if dram is None else (ndp, copy, dram)
        base_list = base.tolist()
        self.lockstep = units == 1 or (
            units > 1
            and base_list.count(base_list[0]) == units
            and not any(np.count_nonzero(a != a[:, :1]) for a in bins)
        )
        t, g, b = p.transfer_s, p.gpu_compute_s, p.transfer_bytes
        # rows: transfer, GPU, staged bytes, then in lockstep dk(, dd): one gather and one cumsum in _prefix_spans
        stack = np.empty((3 + (self.lockstep and (1 if dram is None else 2)), len(t)))
        stack[0], stack[1], stack[2] = t, g, b
        self.stack = stack
        # dk / dd: what moving an item to the GPU takes off each kernel / DRAM bin (ndp - 0.0 is ndp, exactly)
        if self.lockstep:
            base = base[:1]
            ndp, copy = ndp[:, 0], copy[:, 0]
            if dram is None:
                np.subtract(ndp, copy, out=stack[3])
            else:
                stack[3] = ndp
                np.subtract(dram[:, 0], copy, out=stack[4])
            self.dk, self.dd = stack[3], (None if dram is None else stack[4])
            self.kernels = np.add.reduce(ndp)  # every item on the units
            self.dram = None if dram is None else np.add.reduce(dram[:, 0])
            self.unit_rows = stack[3:]
            self.unit_totals = np.array((self.kernels,) if dram is None else (self.kernels, self.dram))
        else:
            self.dk = ndp - copy if dram is None else ndp
            self.dd = None if dram is None else dram - copy
            # [dk(, dd), units, items]: the units first, so the maximum over them is a few long ops
            self.unit_rows = np.empty((1 if dram is None else 2, units, len(t)))
            self.unit_rows[0] = self.dk.T
            if self.dd is not None:
                self.unit_rows[1] = self.dd.T
            self.kernels = ndp.sum(axis=0)
            self.dram = None if dram is None else dram.sum(axis=0)
            self.unit_totals = self.kernels[None] if dram is None else np.array((self.kernels, self.dram))
        self.t, self.g, self.b = self.stack[0], self.stack[1], self.stack[2]
        self.unit_base_list: list[float] = base_list[: len(base)]
        self.zero_list = [0.0] * len(self.unit_base_list)
        self.start = base + p.result_s  # [units]; in lockstep [1], and start_one its float
        self.start_one = float(base[0]) + p.result_s if self.lockstep else 0.0
        self.after = max(0.0, p.result_pcie_s)  # np.maximum(0.0, result_pcie_s): where the way back is always paid
        self.tail = _copied_gpu_s(problem) if p.copy_tail else np.empty(0)  # read only with copy_tail

    def span(
        self,
        pcie_s: np.ndarray | float,
        gpu_s: np.ndarray | float,
        kernels_s: np.ndarray | float,
        dram_s: np.ndarray | float | None,
        tail_s: np.ndarray | float,
        on_ndp: np.ndarray | bool | None,
    ) -> np.ndarray:
        """:func:`span_s` over the (possibly reduced) units: :func:`span_terms_s`'s operations on the same values,
        less those that cannot change them. ``dram_s`` None: every DRAM bin 0.0; ``tail_s`` is read only with
        ``copy_tail``, ``on_ndp`` only with ``ndp_optional``."""
        p = self.problem
        paid = np.asarray(on_ndp) if p.ndp_optional else None
        result_pcie = p.result_pcie_s if paid is None else np.where(paid, p.result_pcie_s, 0.0)
        after: np.ndarray | float
        if p.copy_tail:
            after = np.maximum(np.where(np.isinf(tail_s), 0.0, tail_s), result_pcie)
        else:
            after = self.after if paid is None else np.maximum(0.0, result_pcie)
        span = np.maximum(p.pcie_base_s + pcie_s + after, p.gpu_base_s + gpu_s)
        if not self.units:
            return np.maximum(span, 0.0)
        bins = np.maximum(kernels_s, 0.0 if dram_s is None else dram_s)
        if self.lockstep:
            start = self.start_one if paid is None else np.where(paid, self.start_one, 0.0)
            return np.maximum(span, start + bins)
        start = self.start.reshape(self.start.shape + (1,) * (bins.ndim - 1))  # per-unit arrays are [units, ...]
        if paid is not None:
            start = np.where(paid, start, 0.0)
        return np.maximum(span, np.maximum.reduce(start + bins, axis=0))


def _prefix_spans(moves: _Moves, orders: np.ndarray) -> np.ndarray:
    """``[orders, items + 1]``: the objective after moving the first ``k`` items of each order to the GPU
    (``k`` = 0..items), ``inf`` where the staged bytes exceed the cap."""
    m = moves
    p = m.problem
    rows, n = orders.shape
    sums = np.zeros((len(m.stack), rows, n + 1))
    np.cumsum(m.stack[:, orders], axis=2, out=sums[:, :, 1:])
    if m.lockstep:
        kernels = m.kernels - sums[3]
        dram = None if m.dram is None else m.dram - sums[4]
    else:
        unit_sums = np.zeros((*m.unit_rows.shape[:2], rows, n + 1))  # [dk(, dd), units, orders, items + 1]
        np.cumsum(m.unit_rows[:, :, orders], axis=3, out=unit_sums[..., 1:])
        kernels = m.kernels[:, None, None] - unit_sums[0]
        dram = None if m.dram is None else m.dram[:, None, None] - unit_sums[1]
    tail: np.ndarray | float = np.inf  # read only with copy_tail
    if p.copy_tail:
        tail = np.empty((rows, n + 1))
        tail[:, 0] = np.inf
        np.minimum.accumulate(m.tail[orders], axis=1, out=tail[:, 1:])
    on_ndp = np.arange(n + 1) < n if p.ndp_optional else None
    spans = m.span(sums[0], sums[1], kernels, dram, tail, on_ndp)
    staged = sums[2]
    if staged[:, -1].max() > m.cap:  # the staged bytes only grow along an order
        spans[staged > m.cap] = np.inf
    return spans


def best_prefix(problem: PlacementProblem, order: Sequence[int]) -> int:
    """How many items of ``order`` to move to the GPU: the prefix with the smallest objective (the first minimum,
    so the fewest moves) within the staging cap; 0 when none fits (every item when there are no units)."""
    n = len(order)
    spans = _prefix_spans(_Moves(problem), np.asarray(order, dtype=np.int64).reshape(1, n))[0]
    if problem.num_units == 0:  # with no units nothing can stay in memory: moving no item is not an option
        spans[0] = np.inf
    if not np.isfinite(spans).any():
        return n if problem.num_units == 0 else 0
    return int(np.argmin(spans))


def _column_totals(rows: list[list[float]], columns: int) -> list[float]:
    """``np.asarray(rows)[:, :columns].sum(axis=0)`` to the last bit: numpy adds the rows in order where there are
    two or more columns, and one column pairwise (in order below 8 rows), so only that case goes to numpy."""
    n = len(rows)
    if columns == 1 and n >= 8:
        return [float(np.sum(np.array([row[0] for row in rows])))]
    totals = [0.0] * columns
    for i in range(n):
        row = rows[i]
        for u in range(columns):
            totals[u] += row[u]
    return totals


def _span_one(
    pcie_base_s: float,
    gpu_base_s: float,
    unit_base_s: list[float],
    result_s: float,
    result_pcie_s: float,
    ndp_optional: bool,
    copy_tail: bool,
    pcie_s: float,
    gpu_s: float,
    kernels_s: list[float],
    dram_s: list[float],
    tail_s: float,
    on_ndp: bool,
) -> float:
    """:func:`span_terms_s` of one placement in plain floats (the same operations in the same order, so the same
    bits; ``tests/hw_model/test_scheduler.py`` checks it)."""
    paid = on_ndp or not ndp_optional
    after = (0.0 if math.isinf(tail_s) else tail_s) if copy_tail else 0.0
    after = max(after, result_pcie_s if paid else 0.0)
    span = max(pcie_base_s + pcie_s + after, gpu_base_s + gpu_s)
    # max(a, b) is a unless b > a: the same comparisons, without the calls
    for base, kernels, dram in zip(unit_base_s, kernels_s, dram_s, strict=True):
        unit = (base + result_s if paid else 0.0) + (dram if dram > kernels else kernels)
        if unit > span:
            span = unit
    return span


def best_prefix_lists(
    items: dict[str, list],
    order: list[int],
    unit_base_s: list[float],
    staging_cap_bytes: float,
    result_s: float,
    result_pcie_s: float,
    ndp_optional: bool,
    copy_tail: bool,
) -> int:
    """:func:`best_prefix` of the problem over :meth:`hw_model.layout.InvocationLayout.item_lists` ``items`` (its
    ``ndp``, ``dram``, ``copy``, ``transfer``, ``gpu`` and ``staged``; no GPU or PCIe base) with the other terms
    given, in plain Python (the balancing rule's few experts; numpy's per-call cost would dominate): the same
    answer to the last bit (``tests/hw_model/test_scheduler.py``)."""
    ndp: list[list[float]] = items["ndp"]
    dram: list[list[float]] = items["dram"]
    copy: list[list[float]] = items["copy"]
    transfer: list[float] = items["transfer"]
    gpu: list[float] = items["gpu"]
    staged: list[float] = items["staged"]
    n = len(order)
    units = len(unit_base_s)
    columns = units
    if units > 1:  # lockstep (every row even over the units, equal bases): one unit stands for all, as in _Moves
        even = unit_base_s.count(unit_base_s[0]) == units
        for rows in (ndp, dram, copy):
            for i in range(len(rows)):
                row = rows[i]
                if even and row.count(row[0]) != units:
                    even = False
        if even:
            columns = 1
    base = unit_base_s[:columns]
    kernels = _column_totals(ndp, columns)
    drams = _column_totals(dram, columns)
    moved_k = [0.0] * columns
    moved_d = [0.0] * columns
    limit = staging_cap_bytes * (1 + 1e-9)
    pcie = on_gpu = stage = 0.0
    tail = math.inf
    best = (
        math.inf
        if units == 0
        else _span_one(
            0.0, 0.0, base, result_s, result_pcie_s, ndp_optional, copy_tail, 0.0, 0.0, kernels, drams, tail, n > 0
        )
    )
    best_k = 0 if best < math.inf else -1
    left_k = [0.0] * columns
    left_d = [0.0] * columns
    for k in range(1, n + 1):
        i = order[k - 1]
        pcie += transfer[i]
        on_gpu += gpu[i]
        stage += staged[i]
        if transfer[i] > 0 and gpu[i] < tail:
            tail = gpu[i]
        row_k, row_d, row_c = ndp[i], dram[i], copy[i]
        for u in range(columns):
            moved_k[u] += row_k[u] - 0.0
            moved_d[u] += row_d[u] - row_c[u]
            left_k[u] = kernels[u] - moved_k[u]
            left_d[u] = drams[u] - moved_d[u]
        if stage > limit:
            continue
        span = _span_one(
            0.0, 0.0, base, result_s, result_pcie_s, ndp_optional, copy_tail, pcie, on_gpu, left_k, left_d, tail, k < n
        )
        if span < best:
            best, best_k = span, k
    if best_k < 0:
        return n if units == 0 else 0
    return best_k


def pack(problem: PlacementProblem) -> np.ndarray:
    """Greedy placement (the run-time decision) over :func:`span_s`. Returns ``on_gpu``, a boolean per item."""
    n = problem.num_items
    if n == 0:
        return np.zeros(0, dtype=bool)
    m = _Moves(problem)
    on_gpu, orders, ratios = _fill_by_ratio(m, n)
    return _improve(m, n, on_gpu, orders, ratios)


def _fill_by_ratio(m: _Moves, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`pack`'s first phase: ``on_gpu`` after it, the three orders it tried and their ratios."""
    t, g = m.t, m.g
    if not m.units:
        saved = np.full(n, 1e-30)
    else:
        bins = np.maximum(m.dk, 0.0 if m.dd is None else m.dd)
        if m.lockstep and m.dd is None:  # max(max(dk, 0.0), 0.0) is max(dk, 0.0)
            saved = bins + 1e-30
        else:
            saved = np.maximum(bins if m.lockstep else np.maximum.reduce(bins, axis=1), 0.0) + 1e-30

    # Phase 1: fill the GPU in order of cost per NDP second saved; keep the best prefix over three orderings
    # (by the GPU side's bottleneck, its total, its compute), evaluated together as one [3, n + 1] batch.
    ratios = np.empty((3, n))
    np.maximum(t, g, out=ratios[0])
    np.add(t, g, out=ratios[1])
    ratios[2] = g
    ratios /= saved
    orders = np.argsort(ratios, axis=1, kind="stable")
    spans = _prefix_spans(m, orders)
    on_gpu = np.zeros(n, dtype=bool)
    which, k = divmod(int(np.argmin(spans)), n + 1)
    if np.isfinite(spans[which, k]):
        on_gpu[orders[which, :k]] = True
    return on_gpu, orders, ratios


def _improve(m: _Moves, n: int, on_gpu: np.ndarray, orders: np.ndarray, ratios: np.ndarray) -> np.ndarray:
    """:func:`pack`'s second phase, from the first one's placement ``on_gpu`` (changed in place and returned)."""
    p = m.problem
    stack = m.stack
    # Phase 2: a few single moves (any item, either way) and swaps, each step the one that lowers the objective
    # most, while one does. The moves and swaps are one batch: [moves, then swaps as back x come].
    # the swap candidates in the order a stable argsort of the ratio over the GPU's (NDP's) items gives them
    cheapest = orders[0]
    dearest = np.argsort(-ratios[0], kind="stable") if n > 1 else cheapest
    unit_rows = m.unit_rows  # [dk(, dd), (units,) items]
    # [items, dk(, dd) of each unit] for the sums over the GPU's items (numpy adds the items in order over 2+ columns);
    # in lockstep those sums are rows of stack
    unit_items = m.dk if m.lockstep or m.dd is None else np.concatenate((m.dk, m.dd), axis=1)
    # a move or swap can exceed the cap only if the staged bytes plus the largest item's do (rounding is monotonic)
    b_max = float(np.maximum.reduce(m.b)) if m.cap < math.inf else 0.0
    tail = tail2 = math.inf
    tails_b: np.ndarray | float = math.inf  # read only with copy_tail
    on_ndp: np.ndarray | None = None  # read only with ndp_optional
    for _ in range(_IMPROVEMENT_STEPS):
        in_idx, pcie, gpu, staged, left, bins_now, kernels_list, dram_list = _placed(m, n, on_gpu, unit_items)
        if p.copy_tail:
            tails = np.sort(m.tail[in_idx])
            tail = float(tails[0]) if tails.size else math.inf
            tail2 = float(tails[1]) if tails.size > 1 else math.inf
        current = _span_one(
            p.pcie_base_s,
            p.gpu_base_s,
            m.unit_base_list,
            p.result_s,
            p.result_pcie_s,
            p.ndp_optional,
            p.copy_tail,
            pcie,
            gpu,
            kernels_list,
            dram_list,
            tail,
            left > 0,
        )
        if in_idx.size and left:
            # swaps between the GPU items cheapest to send home and the NDP items cheapest to bring in
            back = dearest[on_gpu[dearest]][:_SWAP_CANDIDATES]
            come = cheapest[~on_gpu[cheapest]][:_SWAP_CANDIDATES]
        else:
            back = come = in_idx[:0]
        nb, nc = back.size, come.size
        size = n + nb * nc
        # single moves: +1 brings an item to the GPU, -1 sends it home
        sign = np.where(on_gpu, -1.0, 1.0)
        step = stack * sign  # sign * t, sign * g, sign * b(, sign * dk(, sign * dd))
        unit_step = step[3:] if m.lockstep else unit_rows * sign
        sums = np.empty((3, size))  # PCIe, GPU, staged bytes
        bins = np.empty((*bins_now.shape, size))  # kernel(, DRAM) bins (per unit)
        now = np.array((pcie, gpu, staged))
        np.add(now[:, None], step[:3], out=sums[:, :n])
        np.subtract(bins_now[..., None], unit_step, out=bins[..., :n])
        if nb:
            # pcie - t[back] + t[come], kernels + dk[back] - dk[come] (and the others alike) as [.., back, come]; the
            # moves home of back are the first terms already (x + -1.0 * y is x - y, x - -1.0 * y is x + y)
            np.add(sums[:, back][:, :, None], stack[:3, None, come], out=sums[:, n:].reshape(3, nb, nc))
            np.subtract(
                bins[..., back][..., None],
                unit_rows[..., None, come],
                out=bins[..., n:].reshape((*bins_now.shape, nb, nc)),
            )
        if p.copy_tail:
            tails_b = np.empty(size)
            tail_without = np.where(m.tail == tail, tail2, tail)
            np.copyto(tails_b[:n], np.where(on_gpu, tail_without, np.minimum(tail, m.tail)))
            if nb:
                np.minimum(tail_without[back][:, None], m.tail[come][None, :], out=tails_b[n:].reshape(nb, nc))
        if p.ndp_optional:
            on_ndp = np.empty(size, dtype=bool)
            np.greater(left - sign, 0, out=on_ndp[:n])
            on_ndp[n:] = left > 0
        spans = m.span(sums[0], sums[1], bins[0], None if m.dram is None else bins[1], tails_b, on_ndp)
        if staged + b_max > m.cap:  # else no move or swap can exceed the cap (rounding is monotonic)
            spans[sums[2] > m.cap] = np.inf
        # the first minimum: a move before any swap as good
        j = int(spans.argmin())
        value = float(spans[j])
        if not value < current * (1 - 1e-12):
            break
        if j < n:
            on_gpu[j] = not on_gpu[j]
        else:
            r, c = divmod(j - n, nc)
            on_gpu[back[r]] = False
            on_gpu[come[c]] = True
    return on_gpu


def _placed(
    m: _Moves, n: int, on_gpu: np.ndarray, unit_items: np.ndarray
) -> tuple[np.ndarray, float, float, float, int, np.ndarray, list, list]:
    """The loads of the placement ``on_gpu`` for :func:`_improve`: the GPU's items, PCIe, GPU and staged sums, how
    many items stay on the units, and the units' bins (as an array and as lists)."""
    in_idx = on_gpu.nonzero()[0]
    moved = m.stack[:, in_idx]
    # each row on its own: a [rows, k] reduction along k does not add in numpy's 1-D (pairwise) order
    pcie, gpu, staged = [float(np.add.reduce(row)) for row in moved[:3]]
    left = n - in_idx.size
    if m.lockstep:
        bins_now = m.unit_totals - np.array([np.add.reduce(row) for row in moved[3:]])  # [kernels(, dram)]
        kernels_list = bins_now[:1].tolist()
        dram_list = m.zero_list if m.dram is None else bins_now[1:].tolist()
    else:
        moved_units = np.add.reduce(unit_items[in_idx], axis=0).reshape(m.unit_totals.shape)
        bins_now = m.unit_totals - moved_units  # [kernels(, dram), units]
        kernels_list = bins_now[0].tolist()
        dram_list = m.zero_list if m.dram is None else bins_now[1].tolist()
    return in_idx, pcie, gpu, staged, left, bins_now, kernels_list, dram_list
