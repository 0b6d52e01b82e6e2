"""A tight, valid lower bound on the expert latency of one MoE layer invocation, from the policies' own costs.

Per invocation (its active experts with their token counts, and the experts resident in the GPU pool), a small
mixed-integer LP spreads each active expert ``i`` over the ways the simulator can run it, as fractions summing to 1:

    r_i  on the GPU from residency (only if resident)          GPU  += r_i * gpu_s(t_i)
    c_i  on the GPU after a PCIe copy that reads its DIMMs      GPU  += c_i * gpu_s(t_i),  PCIe += c_i * transfer_s,
                                                                DRAM += c_i * the copy's reads
    s_i  sliced over every NDP unit (tensor parallel)           each unit: kernels += s_i * ndp_s(t_i, N),
                                                                DRAM += s_i * ndp_dram_s(t_i, N)
    h_i  whole on its home unit                                 home unit: kernels += h_i * ndp_s(t_i, 1), ...

and bounds the layer's latency by ``T + combine``, ``T`` no less than the GPU's work, the PCIe link's (copies,
then the NDP outputs' way back), and each NDP unit's start-up (the hidden states' copy), ``max(kernels, DRAM)``
and the outputs' way back, the units' fixed parts paid only where a unit has work (a binary per unit or per
invocation). Every coefficient is the simulator's own (:class:`~hw_model.run_context.ExpertCosts`, the
:class:`~hw_model.layout.InvocationLayout`'s activation copy, the timeline's combine), so each term is no more than
what :func:`hw_model.timeline.build_layer_timeline` charges for any placement a policy can record (a split of one
expert between the GPU and the units is one point of the fractions; a fraction's kernels cost no more than its
share of the whole kernel, the fixed costs included).

Two families of weight layout are bounded apart, and the bound is the smaller:

- ``tp``: experts stored sliced over every unit (``sliced``, ``dual`` and ``host`` layouts): a copy reads every
  DIMM in parallel; any NDP work makes every unit busy (the units' loads are bounded by their mean);
- ``whole``: expert ``e`` stored on unit ``e mod N``: a copy reads its home DIMM alone (at that DIMM's channel
  bandwidth), and costs DRAM time only where that unit has work of its own (one binary per unit).

Residency is an input: :func:`invocation_bound_s` takes it per active expert; :func:`joint_bound_s` bounds several
invocations at once with residency chosen fractionally under one shared GPU pool (prefill, where every layer runs
once). Which experts a trace phase keeps resident is :mod:`hw_model.bench_bound`'s (the causal oracle and the
perfect-foresight variant); docs/bench.md explains both. Solved with SciPy's HiGHS (``scipy.optimize.milp``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hw_model.cost import expert_shard_time_s
from hw_model.layout import InvocationLayout, LayoutState
from hw_model.run_context import RunContext
from hw_model.timeline import build_layer_timeline
from hw_model.workload import ExpertShape

FAMILIES = ("tp", "whole")
# the objective in microseconds: HiGHS stops its branch and bound within an absolute gap of 1e-6 objective units
_OBJECTIVE_SCALE = 1e6

__all__ = [
    "FAMILIES",
    "Invocation",
    "InvocationBound",
    "bound_context",
    "invocation_bound_s",
    "joint_bound_s",
    "whole_floor_s",
]


@dataclass(frozen=True)
class Invocation:
    """One MoE layer invocation to bound: the layer, its active experts (ascending) and their token counts."""

    layer_index: int
    active: tuple[int, ...]
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class InvocationBound:
    """A bound and the family of weight layouts that attains it (``tp`` or ``whole``)."""

    latency_s: float
    family: str


def bound_context(ctx: RunContext) -> RunContext:
    """``ctx`` as the bound reads it: copies reading every DIMM, NDP work tensor-parallel (the ``tp`` family's
    costs; the ``whole`` family's are read from the costs directly)."""
    units = ctx.system.num_ndp_units
    return RunContext(
        system=ctx.system,
        layers=ctx.layers,
        costs=ctx.costs,
        residency_cap_bytes=ctx.residency_cap_bytes,
        staging_cap_bytes=ctx.staging_cap_bytes,
        copy_sources=units,
        tensor_parallel=True,
        tuning=ctx.tuning,
    )


class _Block:
    """One invocation's rows over its own variables (the last one is its ``T``): the objective is ``T``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.rows: list[tuple[dict[int, float], float, float]] = []  # (coefficients, low, high)
        self.lower = np.zeros(size)
        self.upper = np.ones(size)
        self.upper[-1] = np.inf
        self.integer = np.zeros(size, dtype=np.int64)
        self.residency: list[int] = []  # the r_i variables (their upper bound is the residency)
        self.fixed_s = 0.0  # added to T (the combine)
        self.switch = -1  # the tp family's y (any NDP work): solved as two LPs, y = 0 and y = 1

    def row(self, coefficients: dict[int, float], low: float, high: float) -> None:
        self.rows.append((coefficients, low, high))


def _fixed_parts(ctx: RunContext, inv: Invocation) -> tuple[InvocationLayout, float, float, float]:
    """The invocation as the simulator lays it out, and its fixed parts: the hidden states' copy to the units,
    the least of the outputs' way back (one PCIe copy of the fewest rows a unit with work can have) and the
    combine on the GPU."""
    layout = InvocationLayout(ctx, LayoutState(), inv.layer_index, list(inv.active), list(inv.tokens))
    layer = layout.layer
    row_bytes = layer.expert.hidden * layer.expert.dtype_bytes
    rows = min(min(inv.tokens), layout.tokens)
    result_s = ctx.system.host_link.transfer_time_s(rows * row_bytes)
    units = ctx.system.num_ndp_units
    combine_s = build_layer_timeline(
        ctx.system, layer, layout.tokens, [[] for _ in range(units)], [0] * units, [], True
    )
    return layout, layout.activation_s(), result_s, combine_s.latency_s


def _tp_block(ctx: RunContext, inv: Invocation, binaries: bool = True) -> _Block:
    """The ``tp`` family's block: variables r, c, s, h, g (n each), y (any NDP work), w (any sliced work), T.

    A share of an expert on the GPU costs the fixed part of :func:`gpu_share_terms_s` once (``g_i``, a binary: some
    share of expert ``i`` runs there) and its share of the rest. Beyond the units' mean load: every ``h_i`` is a
    binary (a policy runs an expert whole with all its tokens or not at all), and the home unit of an expert run whole
    carries it all besides every unit's sliced shards (one row per expert, whatever its home); where some work is
    sliced and none whole, every unit carries the same work and ends at once, so the outputs' way back is
    :func:`_sliced_result_s` (the ``w`` rows). Without ``binaries`` (a joint program, solved with every binary
    relaxed, where ``g_i`` would be its share) the GPU's rows are the plain shares."""
    layout, activation_s, result_s, combine_s = _fixed_parts(ctx, inv)
    costs, expert = ctx.costs, layout.expert
    n, units = len(inv.active), ctx.system.num_ndp_units
    block = _Block(5 * n + 3)
    y, w, t = 5 * n, 5 * n + 1, 5 * n + 2
    block.switch = y
    block.fixed_s = combine_s
    block.integer[3 * n : 5 * n] = 1
    block.integer[w] = 1
    transfer_s = costs.transfer_s(expert, max(units, 1) if units else 0)
    read_s = costs.copy_read_s(expert, units) if units else 0.0
    gpu, pcie = {t: -1.0}, {t: -1.0}
    kernels, dram = {t: -1.0}, {t: -1.0}
    whole_kernels: list[float] = []
    whole_dram: list[float] = []
    start_s = activation_s + result_s
    big = start_s
    for i, tokens in enumerate(inv.tokens):
        r, c, s, h = i, n + i, 2 * n + i, 3 * n + i
        block.residency.append(r)
        block.row({r: 1.0, c: 1.0, s: 1.0, h: 1.0}, 1.0, 1.0)
        if binaries:
            fixed_s, share_s = gpu_share_terms_s(ctx, expert, tokens)
            gpu[r] = gpu[c] = share_s
            gpu[4 * n + i] = fixed_s
            block.row({r: 1.0, c: 1.0, 4 * n + i: -1.0}, -np.inf, 0.0)  # g_i: any share of expert i on the GPU
        else:
            gpu[r] = gpu[c] = costs.gpu_s(expert, tokens)
        pcie[c] = transfer_s
        if units:
            block.row({s: 1.0, y: -1.0}, -np.inf, 0.0)
            block.row({h: 1.0, y: -1.0}, -np.inf, 0.0)
            block.row({s: 1.0, w: -1.0}, -np.inf, 0.0)
            sliced_kernels, sliced_dram = costs.ndp_pair(expert, tokens, units)
            kernels[s], dram[s] = sliced_kernels, sliced_dram
            whole_kernels.append(costs.ndp_s(expert, tokens, 1))
            whole_dram.append(costs.ndp_dram_s(expert, tokens, 1))
            kernels[h] = whole_kernels[-1] / units
            dram[h] = whole_dram[-1] / units
            dram[c] = read_s
            big += read_s
        else:
            block.upper[s] = block.upper[h] = 0.0
    block.row(gpu, -np.inf, 0.0)
    if units:
        pcie[y] = result_s
        kernels[y] = start_s
        dram[y] = start_s + big  # without NDP work (y = 0) the copies' reads delay nothing: relaxed by big
        block.row(kernels, -np.inf, 0.0)
        block.row(dram, -np.inf, big)
        _home_rows(block, kernels, dram, big, whole_kernels, whole_dram)
        extra_s = _sliced_result_s(ctx, layout, inv) - result_s
        if extra_s > 0:  # w - sum(h) is 1 exactly where some work is sliced and none whole, else at most 0
            for row, high in ((kernels, 0.0), (dram, big)):
                with_extra = dict(row)
                with_extra[w] = extra_s
                for i in range(n):
                    with_extra[3 * n + i] = row[3 * n + i] - extra_s
                block.row(with_extra, -np.inf, high)
    else:
        block.upper[y] = block.upper[w] = 0.0
    block.row(pcie, -np.inf, 0.0)
    return block


def gpu_share_terms_s(ctx: RunContext, expert: ExpertShape, tokens: int) -> tuple[float, float]:
    """``(fixed, rest)`` with ``fixed + f * rest`` no more than the GPU time of any share ``f`` of ``expert``'s FFN
    columns (``tokens`` tokens) a placement can record (all of them, or a split's 1/k or all but 1/k, k >= 2), and
    equal to all of it at ``f = 1``: ``rest`` is the steepest slope from a share's time to the whole one's, over
    every such share (a share's time depends only on its width, so the shares beyond ``ffn`` columns, all one column
    or all of them, add nothing new). A share's kernels pay their fixed costs whole: without this a fractional share
    would be credited with a fraction of them. Memoised in the run's costs."""
    costs = ctx.costs
    key = (id(expert), 8, tokens, 0)
    memo = costs._memo
    if key in memo:
        return memo[key], memo[(id(expert), 9, tokens, 0)]
    gpu = ctx.system.gpu
    whole_s = costs.gpu_s(expert, tokens)
    by_width: dict[int, float] = {}

    def share_s(shards: float) -> float:
        width = max(1, math.ceil(expert.ffn / shards))  # as ExpertShard sizes a shard
        value = by_width.get(width)
        if value is None:
            value = by_width[width] = expert_shard_time_s(gpu, expert, tokens, shards)
        return value

    slope = 0.0
    for k in range(2, expert.ffn + 2):
        slope = max(slope, (whole_s - share_s(float(k))) / (1 - 1 / k))  # 1/k on the GPU
        slope = max(slope, k * (whole_s - share_s(k / (k - 1))))  # all but 1/k
    slope = min(slope, whole_s)
    costs._store(key, expert, whole_s - slope)
    costs._store((id(expert), 9, tokens, 0), expert, slope)
    return whole_s - slope, slope


def _home_rows(
    block: _Block,
    kernels: dict[int, float],
    dram: dict[int, float],
    big: float,
    whole_kernels: list[float],
    whole_dram: list[float],
) -> None:
    """Per active expert ``i``: the unit that runs it whole runs all of it, with every unit's share of the sliced
    work and copies' reads (the rows ``kernels`` / ``dram`` with the other whole experts left out)."""
    n = len(whole_kernels)
    for i in range(n):
        for row, whole, high in ((kernels, whole_kernels, 0.0), (dram, whole_dram, big)):
            own = {var: value for var, value in row.items() if not 3 * n <= var < 4 * n}
            own[3 * n + i] = whole[i]
            block.row(own, -np.inf, high)


def _sliced_result_s(ctx: RunContext, layout: InvocationLayout, inv: Invocation) -> float:
    """The least the outputs' way back takes after every unit ends at once with only sliced work: each unit's copy
    of its partial output (rows: the fewer of the invocation's and of the least sliced expert's tokens) one after
    another over PCIe, or the reduction over the DIMM-link and one copy where the layout is tensor-parallel."""
    system, units = ctx.system, ctx.system.num_ndp_units
    row_bytes = layout.expert.hidden * layout.expert.dtype_bytes
    rows = min(min(inv.tokens), layout.tokens)
    each = units * system.host_link.transfer_time_s(rows * row_bytes)
    if not ctx.tensor_parallel or units < 2:
        return each
    all_rows = layout.tokens * row_bytes
    reduce_s = (units - 1) * system.ndp_link.transfer_time_s(all_rows)
    return min(each, reduce_s + system.host_link.transfer_time_s(all_rows))


def _whole_block(ctx: RunContext, inv: Invocation, binaries: bool = True) -> _Block:
    """The ``whole`` family's block: variables r, c, h (n each), z (per unit: it has work), T (``binaries``: as
    the ``tp`` family's builder takes it; this block's binaries are the same either way)."""
    layout, activation_s, result_s, combine_s = _fixed_parts(ctx, inv)
    costs, expert = ctx.costs, layout.expert
    n, units = len(inv.active), ctx.system.num_ndp_units
    block = _Block(3 * n + units + 1)
    t = 3 * n + units
    block.integer[3 * n : 3 * n + units] = 1
    block.fixed_s = combine_s
    transfer_s = costs.transfer_s(expert, 1)
    read_s = costs.copy_read_s(expert, 1)
    gpu, pcie = {t: -1.0}, {t: -1.0}
    kernels: list[dict[int, float]] = [{t: -1.0} for _ in range(units)]
    dram: list[dict[int, float]] = [{t: -1.0} for _ in range(units)]
    big = [0.0] * units
    start_s = activation_s + result_s
    for i, (e, tokens) in enumerate(zip(inv.active, inv.tokens, strict=True)):
        r, c, h = i, n + i, 2 * n + i
        block.residency.append(r)
        block.row({r: 1.0, c: 1.0, h: 1.0}, 1.0, 1.0)
        g = costs.gpu_s(expert, tokens)
        gpu[r] = gpu[c] = g
        pcie[c] = transfer_s
        home = e % units
        z = 3 * n + home
        block.row({h: 1.0, z: -1.0}, -np.inf, 0.0)
        kernels[home][h] = costs.ndp_s(expert, tokens, 1)
        dram[home][h] = costs.ndp_dram_s(expert, tokens, 1)
        dram[home][c] = read_s
        big[home] += read_s
    block.row(gpu, -np.inf, 0.0)
    for u in range(units):
        z = 3 * n + u
        pcie[z] = result_s  # each unit with work copies its output over PCIe after the weight copies
        kernels[u][z] = start_s
        dram[u][z] = start_s + big[u]
        block.row(kernels[u], -np.inf, 0.0)
        block.row(dram[u], -np.inf, big[u])
    block.row(pcie, -np.inf, 0.0)
    return block


def whole_floor_s(ctx: RunContext, inv: Invocation, resident: Sequence[bool]) -> float:
    """A quick lower bound on the ``whole`` family's program (no solver): in any placement, each unit either has work
    of its own, and then ends no sooner than its start-up plus, for each non-resident expert homed there, the less of
    running it whole and reading its copy; or has none, and then every non-resident expert homed there is copied over
    PCIe (and computed on the GPU). The least over which units have work (at most ``2 ** units`` cases)."""
    _, activation_s, result_s, combine_s = _fixed_parts(ctx, inv)
    costs, expert, units = ctx.costs, ctx.layers[inv.layer_index].expert, ctx.system.num_ndp_units
    transfer_s, read_s = costs.transfer_s(expert, 1), costs.copy_read_s(expert, 1)
    start_s = activation_s + result_s
    dram = [0.0] * units
    copies = [0.0] * units
    gpu = [0.0] * units
    for e, tokens, res in zip(inv.active, inv.tokens, resident, strict=True):
        if not res:
            home = e % units
            dram[home] += min(costs.ndp_dram_s(expert, tokens, 1), read_s)
            copies[home] += transfer_s
            gpu[home] += costs.gpu_s(expert, tokens)
    loaded = [u for u in range(units) if copies[u] > 0]
    best = float("inf")
    for mask in range(1 << len(loaded)):  # bit set: that unit has no work
        pcie = gpu_s = unit_s = 0.0
        for bit, u in enumerate(loaded):
            if mask >> bit & 1:
                pcie += copies[u]
                gpu_s += gpu[u]
            else:
                pcie += result_s
                unit_s = max(unit_s, start_s + dram[u])
        best = min(best, max(pcie, gpu_s, unit_s))
    return (best if loaded else 0.0) + combine_s


def _solve(
    blocks: Sequence[_Block],
    residency: Sequence[Sequence[float]],
    pool: tuple[list[float], float] | None,
    *,
    relax: bool = False,
    time_limit_s: float = 5.0,
) -> float:
    """A lower bound on the least sum of the blocks' ``T`` (plus their fixed parts), exact unless ``relax`` (binaries
    relaxed to [0, 1]: an LP, solved without a time limit) or the time limit ends the branch and bound (its dual
    bound is returned).
    ``residency[b][i]``: the upper bound of block ``b``'s ``r_i``; ``pool``: (bytes of each residency variable in
    block order, pool bytes) for a joint fill."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    offsets = np.cumsum([0] + [b.size for b in blocks])
    total = int(offsets[-1])
    objective = np.zeros(total)
    lower, upper, integer = [], [], []
    data: list[float] = []
    rows_i: list[int] = []
    cols: list[int] = []
    lows: list[float] = []
    highs: list[float] = []
    residency_columns: list[int] = []
    for b, block in enumerate(blocks):
        base = int(offsets[b])
        objective[base + block.size - 1] = _OBJECTIVE_SCALE
        up = block.upper.copy()
        for k, var in enumerate(block.residency):
            up[var] = residency[b][k]
            residency_columns.append(base + var)
        lower.append(block.lower)
        upper.append(up)
        integer.append(block.integer)
        for coefficients, low, high in block.rows:
            row = len(lows)
            for var, value in coefficients.items():
                rows_i.append(row)
                cols.append(base + var)
                data.append(value)
            lows.append(low)
            highs.append(high)
    if pool is not None:
        sizes, pool_bytes = pool
        row = len(lows)
        for column, size in zip(residency_columns, sizes, strict=True):
            rows_i.append(row)
            cols.append(column)
            data.append(size)
        lows.append(-np.inf)
        highs.append(pool_bytes)
    matrix: Any
    if total * len(lows) <= 4096:  # one invocation: a dense matrix (scipy.sparse's checks cost more than the solve)
        matrix = np.zeros((len(lows), total))
        np.add.at(matrix, (np.array(rows_i, dtype=np.int64), np.array(cols, dtype=np.int64)), data)
    else:
        matrix = coo_matrix((data, (rows_i, cols)), shape=(len(lows), total)).tocsr()
    result = milp(
        objective,
        constraints=LinearConstraint(matrix, np.array(lows), np.array(highs)),
        bounds=Bounds(np.concatenate(lower), np.concatenate(upper)),
        integrality=None if relax else np.concatenate(integer),
        options={"mip_rel_gap": 1e-9} if relax else {"mip_rel_gap": 1e-9, "time_limit": time_limit_s},
    )
    fixed_s = sum(block.fixed_s for block in blocks)
    dual = getattr(result, "mip_dual_bound", None)
    if result.status == 0 and result.x is not None:
        # the branch and bound stops within HiGHS's absolute gap: its bound, not its best solution, is below every
        # placement
        if not relax and dual is not None and np.isfinite(dual):
            return min(float(result.fun), float(dual)) / _OBJECTIVE_SCALE + fixed_s
        return float(result.fun) / _OBJECTIVE_SCALE + fixed_s
    if result.status == 1 and dual is not None and np.isfinite(dual):  # time limit: the branch and bound's bound
        return float(dual) / _OBJECTIVE_SCALE + fixed_s
    raise RuntimeError(f"the bound's program failed: {result.message}")


def _solve_family(
    family: str,
    ctx: RunContext,
    invocations: Sequence[Invocation],
    upper: Sequence[Sequence[float]],
    pool: tuple[list[float], float] | None,
    beat_s: float = float("inf"),
) -> float:
    """The family's bound of ``invocations`` (see :func:`_solve`). One invocation: the ``tp`` family exactly, as two
    LPs (y = 0, y = 1); the ``whole`` family's LP relaxation, and its exact program only where that relaxation is
    below ``beat_s`` (the bound is the least over the families, so a family above another's value needs no more).
    Several invocations (a joint program): the LP relaxation of the binaries (still a lower bound; the units'
    fixed parts it relaxes are microseconds against a prefill layer's milliseconds)."""
    blocks = [_BUILDERS[family](ctx, inv, len(invocations) == 1) for inv in invocations]
    if len(blocks) > 1:
        return _solve(blocks, upper, pool, relax=True)
    if family == "tp":
        block = blocks[0]
        values = []
        for y in (0.0, 1.0) if block.upper[block.switch] > 0 else (0.0,):
            block.lower[block.switch] = block.upper[block.switch] = y
            values.append(_solve(blocks, upper, pool, relax=y == 0.0))  # y = 0: no binary can be 1
        return min(values)
    relaxed = _solve(blocks, upper, pool, relax=True)
    return relaxed if relaxed >= beat_s else _solve(blocks, upper, pool)


_BUILDERS = {"tp": _tp_block, "whole": _whole_block}


def invocation_bound_s(
    ctx: RunContext, inv: Invocation, resident: Sequence[bool], families: Sequence[str] = FAMILIES
) -> InvocationBound:
    """The bound of one invocation with ``resident[i]`` saying whether active expert ``i`` is in the GPU pool: the
    least over ``families`` (``ctx`` as :func:`bound_context` makes it)."""
    best = InvocationBound(float("inf"), "")
    upper = [[1.0 if flag else 0.0 for flag in resident]]
    for family in families:
        if family == "whole" and (
            ctx.system.num_ndp_units == 0 or whole_floor_s(ctx, inv, resident) >= best.latency_s
        ):  # a family that cannot go below another's value changes nothing
            continue
        value = _solve_family(family, ctx, [inv], upper, None, best.latency_s)
        if value < best.latency_s:
            best = InvocationBound(value, family)
    return best


def joint_bound_s(
    ctx: RunContext, invocations: Sequence[Invocation], pool_bytes: float, families: Sequence[str] = FAMILIES
) -> InvocationBound:
    """The bound of ``invocations`` together (the sum of their latencies), any fractions of their active experts
    resident as long as they fit ``pool_bytes`` together (the pool filled for free): the least over ``families``."""
    best = InvocationBound(float("inf"), "")
    sizes = [ctx.expert_bytes[inv.layer_index] for inv in invocations for _ in inv.active]
    upper = [[1.0] * len(inv.active) for inv in invocations]
    for family in families:
        if family == "whole" and ctx.system.num_ndp_units == 0:
            continue
        value = _solve_family(family, ctx, invocations, upper, (sizes, pool_bytes))
        if value < best.latency_s:
            best = InvocationBound(value, family)
    return best
