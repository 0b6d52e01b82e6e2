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
prefix step alone over one given order (MoNDE's balancing rule). :func:`solve_exact` is the reference optimum
from a MILP (``scipy.optimize.milp``, HiGHS), used in tests to bound the packer's loss; :func:`solve_exact_modes`
that of the richer problem (other ways to run an item, :class:`ItemMode`). All of them minimise :func:`span_s`.
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
    """What moving each item from the NDP units to the GPU changes (the packer's incremental view), with the
    units reduced to one where every item is sliced evenly over identical units (they move in lockstep)."""

    def __init__(self, problem: PlacementProblem) -> None:
        k_ndp, d_ndp, k_gpu, d_gpu = problem.unit_bins()
        base = problem.unit_base_s
        even = k_ndp.shape[1] > 1 and all((a == a[:, :1]).all() for a in (k_ndp, d_ndp, k_gpu, d_gpu))
        if even and (base == base[0]).all():  # the problem's terms with only its first unit
            base = base[:1]
            k_ndp, d_ndp, k_gpu, d_gpu = k_ndp[:, :1], d_ndp[:, :1], k_gpu[:, :1], d_gpu[:, :1]
        self.problem = problem
        self.unit_base_s = base
        self.unit_base_list: list[float] = base.tolist()
        self.kernels = k_ndp.sum(axis=0)  # every item on the units
        self.dram = d_ndp.sum(axis=0)
        self.dk = k_ndp - k_gpu  # what moving an item to the GPU takes off each bin
        self.dd = d_ndp - d_gpu
        self.t = problem.transfer_s
        self.g = problem.gpu_compute_s
        self.b = problem.transfer_bytes
        self.tail = _copied_gpu_s(problem)
        self.cap = problem.staging_cap_bytes * (1 + 1e-9)

    def span(
        self,
        pcie_s: np.ndarray | float,
        gpu_s: np.ndarray | float,
        kernels_s: np.ndarray,
        dram_s: np.ndarray,
        tail_s: np.ndarray | float,
        on_ndp: np.ndarray | bool,
    ) -> np.ndarray:
        """:func:`span_s` over the (possibly reduced) units."""
        p = self.problem
        return span_terms_s(
            p.pcie_base_s,
            p.gpu_base_s,
            self.unit_base_s,
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


def _prefix_spans(moves: _Moves, orders: np.ndarray) -> np.ndarray:
    """``[orders, items + 1]``: the objective after moving the first ``k`` items of each order to the GPU
    (``k`` = 0..items), ``inf`` where the staged bytes exceed the cap."""
    rows, n = orders.shape
    zero = np.zeros((rows, 1))
    pcie = np.concatenate((zero, np.cumsum(moves.t[orders], axis=1)), axis=1)
    gpu = np.concatenate((zero, np.cumsum(moves.g[orders], axis=1)), axis=1)
    units = moves.dk.shape[1]
    zeros = np.zeros((rows, 1, units))
    kernels = moves.kernels - np.concatenate((zeros, np.cumsum(moves.dk[orders], axis=1)), axis=1)
    dram = moves.dram - np.concatenate((zeros, np.cumsum(moves.dd[orders], axis=1)), axis=1)
    tail = np.concatenate((np.full((rows, 1), np.inf), np.minimum.accumulate(moves.tail[orders], axis=1)), axis=1)
    on_ndp = np.arange(n + 1) < n
    spans = moves.span(pcie, gpu, kernels, dram, tail, np.broadcast_to(on_ndp, (rows, n + 1)))
    staged = np.concatenate((zero, np.cumsum(moves.b[orders], axis=1)), axis=1)
    spans[staged > moves.cap] = np.inf
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
    for u in range(len(unit_base_s)):
        start = unit_base_s[u] + result_s if paid else 0.0
        span = max(span, start + max(kernels_s[u], dram_s[u]))
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
    t, g, b = m.t, m.g, m.b
    bins = np.maximum(m.dk, m.dd)
    saved = np.maximum(bins.max(axis=1), 0.0) + 1e-30 if bins.size else np.full(n, 1e-30)

    # Phase 1: fill the GPU in order of cost per NDP second saved; keep the best prefix over three orderings
    # (by the GPU side's bottleneck, its total, its compute), evaluated together as one [3, n + 1] batch.
    costs = np.stack((np.maximum(t, g), t + g, g))
    orders = np.argsort(costs / saved, axis=1, kind="stable")
    spans = _prefix_spans(m, orders)
    on_gpu = np.zeros(n, dtype=bool)
    which, k = divmod(int(np.argmin(spans)), n + 1)
    if np.isfinite(spans[which, k]):
        on_gpu[orders[which, :k]] = True

    # Phase 2: a few single moves (any item, either way) and swaps, each step the one that lowers the objective
    # most, while one does.
    ratio = np.maximum(t, g) / saved
    for _ in range(_IMPROVEMENT_STEPS):
        kernels = m.kernels - m.dk[on_gpu].sum(axis=0)
        dram = m.dram - m.dd[on_gpu].sum(axis=0)
        pcie, gpu, staged = float(t[on_gpu].sum()), float(g[on_gpu].sum()), float(b[on_gpu].sum())
        tails = np.sort(m.tail[on_gpu])
        tail, tail2 = (tails[0] if tails.size else np.inf), (tails[1] if tails.size > 1 else np.inf)
        left = n - int(on_gpu.sum())
        p = m.problem
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
            kernels.tolist(),
            dram.tolist(),
            float(tail),
            left > 0,
        )
        # single moves: +1 brings an item to the GPU, -1 sends it home
        sign = np.where(on_gpu, -1.0, 1.0)
        tail_without = np.where(m.tail == tail, tail2, tail)
        flip = m.span(
            pcie + sign * t,
            gpu + sign * g,
            kernels - sign[:, None] * m.dk,
            dram - sign[:, None] * m.dd,
            np.where(on_gpu, tail_without, np.minimum(tail, m.tail)),
            left - sign > 0,
        )
        flip[staged + sign * b > m.cap] = np.inf
        best_flip = int(np.argmin(flip))
        best = (float(flip[best_flip]), best_flip, -1)
        in_idx = np.flatnonzero(on_gpu)
        out_idx = np.flatnonzero(~on_gpu)
        if in_idx.size and out_idx.size:
            # swaps between the GPU items cheapest to send home and the NDP items cheapest to bring in
            back = in_idx[np.argsort(-ratio[in_idx], kind="stable")[:_SWAP_CANDIDATES]]
            come = out_idx[np.argsort(ratio[out_idx], kind="stable")[:_SWAP_CANDIDATES]]
            swap = m.span(
                pcie - t[back][:, None] + t[come],
                gpu - g[back][:, None] + g[come],
                kernels + m.dk[back][:, None, :] - m.dk[come][None, :, :],
                dram + m.dd[back][:, None, :] - m.dd[come][None, :, :],
                np.minimum(tail_without[back][:, None], m.tail[come][None, :]),
                np.full((back.size, come.size), left > 0),
            )
            swap[staged - b[back][:, None] + b[come] > m.cap] = np.inf
            s = int(np.argmin(swap))
            if swap.flat[s] < best[0]:
                r, c = np.unravel_index(s, swap.shape)
                best = (float(swap.flat[s]), int(back[r]), int(come[c]))
        if not best[0] < current * (1 - 1e-12):
            break
        on_gpu[best[1]] = not on_gpu[best[1]]
        if best[2] >= 0:
            on_gpu[best[2]] = True
    return on_gpu


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
