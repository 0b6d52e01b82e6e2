"""The split and variable-degree math: running part of one expert's FFN columns on the GPU (ours' balancing split,
:func:`balanced_split`, and ``tp+lb+prefetch+split``'s) and running experts whole on their home unit
(``tp+lb+prefetch+vtp``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hw_model.cost import expert_shard_time_s
from hw_model.layout import InvocationLayout, LayoutState
from hw_model.oracles import ItemMode
from hw_model.policies.base import PolicyState
from hw_model.policies.packing import _placement_problem
from hw_model.run_context import RunContext
from hw_model.scheduler import makespan_s, pack, span_terms_s

SPLIT_PARTS = range(2, 9)  # k: 1/k of an expert's FFN columns on the GPU
# the splits ours' balancing split tries: 1/k of the columns on the GPU (k > 0) or all but 1/k of them (-k)
BALANCE_SPLITS = (*SPLIT_PARTS, *[-k for k in SPLIT_PARTS])
# an invocation of more active experts than this (a prefill's) lays out only the balancing split's best few
# candidates by the packer's objective (a decode invocation's few experts lay out every one: the objective misranks)
_UNSCREENED_EXPERTS = 16
_EXACT_CANDIDATES = 4


def _split_part_costs(out: InvocationLayout, tokens: int, k: int) -> tuple[float, float, float, float]:
    """Running 1/``k`` of an expert's FFN columns (``tokens`` tokens) on the GPU and the rest sliced over the
    units: (each unit's kernel seconds for the rest, each unit's DRAM seconds for the rest and for reading the
    part's copy, PCIe seconds of that copy, GPU seconds), as :meth:`InvocationLayout.lay_out` lays it out."""
    costs, expert, sources = out.costs, out.expert, out.sources
    key = (id(expert), tokens, k, out.units, sources)
    memo = costs.split_parts.get(key)
    if memo is not None:
        return memo
    costs._shapes[id(expert)] = expert
    rest = out.units * k / (k - 1)  # the remaining (k-1)/k of the width, sliced over the units
    kernels, dram = costs.ndp_pair(expert, tokens, rest)
    transfer_part = out.ctx.system.host_link.latency_s + expert.weight_bytes() / k / costs.copy_bandwidth(sources)
    gpu_part = expert_shard_time_s(out.ctx.system.gpu, expert, tokens, k)
    value = (max(kernels, dram), dram + costs.copy_read_s(expert, sources) / k, transfer_part, gpu_part)
    costs.split_parts[key] = value
    return value


def _split_mode(out: InvocationLayout, tokens: list[int], k: int) -> ItemMode:
    """Every active expert (``tokens[i]`` tokens each) split with 1/``k`` on the GPU, as a mode of the packer's
    problem."""
    parts = [_split_part_costs(out, t, k) for t in tokens]
    kernels = np.repeat([[p[0]] for p in parts], out.units, axis=1)
    dram = np.repeat([[p[1]] for p in parts], out.units, axis=1)
    weight_bytes = out.expert.weight_bytes()
    staged = np.full(len(tokens), weight_bytes / k)
    return ItemMode(kernels, [p[2] for p in parts], [p[3] for p in parts], staged, dram)


def _best_split(
    ctx: RunContext, out: InvocationLayout, resident: list[bool], on_gpu: Sequence[bool]
) -> tuple[int, int] | None:
    """(position in ``out.active`` of the expert split, k) when running 1/k of the hottest NDP expert on the GPU
    (k in :data:`SPLIT_PARTS`) lowers the packer's objective, else None."""
    active, tokens = out.active, out.active_tokens
    on_ndp = [i for i in range(len(active)) if not on_gpu[i]]
    if not on_ndp:
        return None
    hot = max(on_ndp, key=lambda i: (tokens[i], -active[i]))
    # The packer's objective (makespan_modes_s over the placement problem, every other expert as placed) of the
    # placement itself (row 0) and with the hot expert split 1/k (row m for the m-th k), as one batch: each row's
    # loads are summed as makespan_modes_s sums them, so the spans are the same to the last bit.
    items = out.as_arrays(out.item_lists(active, tokens, resident))
    gpu_mask = np.asarray(on_gpu, dtype=bool)
    rows = len(SPLIT_PARTS) + 1
    pcie = np.repeat(np.where(gpu_mask, items["transfer"], 0.0)[None, :], rows, axis=0)
    gpu = np.repeat(np.where(gpu_mask, items["gpu"], 0.0)[None, :], rows, axis=0)
    kernels = np.repeat(np.where(gpu_mask[:, None], 0.0, items["ndp"])[None], rows, axis=0)
    dram = np.repeat(np.where(gpu_mask[:, None], items["copy"], items["dram"])[None], rows, axis=0)
    for m in range(1, rows):
        part = _split_part_costs(out, tokens[hot], SPLIT_PARTS[m - 1])
        kernels[m, hot] = part[0]
        dram[m, hot] = part[1]
        pcie[m, hot] = part[2]
        gpu[m, hot] = part[3]
    result_s, result_pcie_s = out.result_s()
    spans = span_terms_s(
        0.0,
        0.0,
        np.full(out.units, out.activation_s()),
        result_s,
        result_pcie_s,
        True,
        True,
        pcie.sum(axis=1),
        gpu.sum(axis=1),
        kernels.sum(axis=1),
        dram.sum(axis=1),
        np.where(pcie > 0, gpu, np.inf).min(axis=1),
        np.ones(rows, dtype=bool),  # the hot expert stays on the units in every row
    ).tolist()
    current = spans[0]
    best: tuple[float, int] | None = None
    for m in range(1, rows):
        span = spans[m]
        if span < current * (1 - 1e-9) and (best is None or span < best[0]):
            best = (span, SPLIT_PARTS[m - 1])
    return None if best is None else (hot, best[1])


def split_choice(
    ctx: RunContext, out: InvocationLayout, resident: list[bool], on_gpu: Sequence[bool] | np.ndarray
) -> tuple[int, int] | None:
    """``tp+lb+prefetch+split``'s choice after the packer put active expert ``i`` on the GPU where ``on_gpu[i]``:
    (position in ``out.active`` of the expert split, k), or None."""
    return _best_split(ctx, out, resident, [bool(g) for g in on_gpu])


def variable_degree_choice(
    ctx: RunContext, out: InvocationLayout, resident: list[bool]
) -> tuple[np.ndarray, np.ndarray]:
    """``tp+lb+prefetch+vtp``'s decision for the invocation ``out`` (``resident[i]``: whether active expert ``i`` is
    on the GPU already): per active expert, on the GPU, and run whole on its home unit. The packer runs over the
    NDP times :func:`choose_whole` picks and, when it picked any expert whole, over every expert sliced as well;
    the placement with the shorter makespan is kept (whole experts alone can leave the units unbalanced where
    slicing them would not: up to 2x the richer problem's optimum, ``benchmarks/bench_scheduler.py --richer``)."""
    active, tokens = out.active, out.active_tokens
    whole = choose_whole(out)
    mixed = _placement_problem(ctx, out, out.item_arrays(active, tokens, resident, whole))
    on_gpu = pack(mixed)
    if whole.any():
        sliced = _placement_problem(ctx, out, out.item_arrays(active, tokens, resident))
        sliced_gpu = pack(sliced)
        if makespan_s(sliced, sliced_gpu) < makespan_s(mixed, on_gpu):
            return sliced_gpu, np.zeros_like(whole)
    return on_gpu, whole


def choose_whole(out: InvocationLayout) -> np.ndarray:
    """Per active expert, whether to run it whole on its home unit (per-unit bins): every unit takes the same
    number ``m`` of its own coldest experts whole (``m`` = the fewest active experts any unit is home to), which
    keeps the units balanced while each whole expert saves the fixed costs of N - 1 shards; kept only if the
    busiest unit's load drops. Everything else stays sliced."""
    costs, expert, units = out.costs, out.expert, out.units
    tokens = out.active_tokens
    homes = [out.home(e) for e in out.active]
    by_unit: list[list[int]] = [[] for _ in range(units)]
    for i in sorted(range(len(tokens)), key=lambda i: tokens[i]):
        by_unit[homes[i]].append(i)
    m = min(len(members) for members in by_unit) if units > 1 else 0
    whole = np.zeros(len(tokens), dtype=bool)
    if m == 0:
        return whole
    for members in by_unit:
        whole[members[:m]] = True
    sliced_s = [max(costs.ndp_s(expert, c, units), costs.ndp_dram_s(expert, c, units)) for c in tokens]
    whole_s = [max(costs.ndp_s(expert, c, 1), costs.ndp_dram_s(expert, c, 1)) for c in tokens]
    before = sum(sliced_s)
    after = [sum(s for i, s in enumerate(sliced_s) if not whole[i])] * units
    for i in np.flatnonzero(whole).tolist():
        after[homes[i]] += whole_s[i]
    return whole if max(after) < before * (1 - 1e-12) else np.zeros(len(tokens), dtype=bool)


def balanced_split(
    ctx: RunContext, state: PolicyState, out: InvocationLayout, on_gpu: Sequence[bool], resident: Sequence[bool]
) -> tuple[int, int] | None:
    """Ours' balancing split after the packer put active expert ``i`` on the GPU where ``on_gpu[i]``: (position in
    ``out.active`` of the expert split, k as :meth:`InvocationLayout.split` takes it), or None.

    The packer moves whole experts, so the GPU and the units rarely end together: one expert split between them
    closes the difference. Tried: the NDP expert with the most tokens and the GPU expert with the fewest, of each
    residency (a resident one runs its GPU part from the copy the GPU holds; otherwise that part is copied), each
    with 1/k or all but 1/k of its FFN columns on the GPU (k in :data:`SPLIT_PARTS`); kept is the one whose laid-out
    invocation ends soonest, if it ends sooner than the packer's. Memoised per run by the items (tokens, on the GPU,
    resident) in one canonical order, the choice kept as its rank there: it depends on them alone (every expert is
    stored sliced, so equal items cost the same whichever experts they are)."""
    tokens = out.active_tokens
    order = sorted(range(len(tokens)), key=lambda i: (tokens[i], bool(on_gpu[i]), bool(resident[i])))
    items = tuple([(tokens[i], bool(on_gpu[i]), bool(resident[i])) for i in order])
    key = ("balanced split", ctx.layer_classes[out.layer_index], items)
    memo = state.pack_memo
    ranked: tuple[int, int] | None
    if key in memo:
        ranked = memo[key]
    else:
        choice = _best_balanced_split(ctx, state, out, on_gpu, resident)
        ranked = None if choice is None else (order.index(choice[0]), choice[1])
        memo[key] = ranked
    return None if ranked is None else (order[ranked[0]], ranked[1])


def _best_balanced_split(
    ctx: RunContext, state: PolicyState, out: InvocationLayout, on_gpu: Sequence[bool], resident: Sequence[bool]
) -> tuple[int, int] | None:
    """:func:`balanced_split`'s search: the candidates (in a long invocation the best few by the packer's objective)
    laid out as the simulator lays them out (the run's layout memo shared: equal decisions cost the same)."""
    active, tokens = out.active, out.active_tokens
    picks: dict[tuple[bool, bool], int] = {}
    for i in range(len(active)):
        side = (bool(on_gpu[i]), bool(resident[i]))
        j = picks.get(side)
        if j is None or (tokens[i] < tokens[j] if side[0] else tokens[i] > tokens[j]):
            picks[side] = i
    candidates = [(i, k) for i in sorted(picks.values()) for k in BALANCE_SPLITS]
    screened = list(range(len(candidates)))
    if len(active) > _UNSCREENED_EXPERTS:  # a long layout (prefill): only the best few by the packer's objective
        spans = _candidate_spans_s(out, on_gpu, resident, candidates)
        screened = sorted(screened, key=spans.__getitem__)[:_EXACT_CANDIDATES]
    scratch = LayoutState(layout_memo=state.layout_memo)
    best_s = _split_latency_s(ctx, scratch, out, on_gpu, resident, -1, 0)
    choice: tuple[int, int] | None = None
    for c in sorted(screened):
        i, k = candidates[c]
        latency_s = _split_latency_s(ctx, scratch, out, on_gpu, resident, i, k)
        if latency_s < best_s * (1 - 1e-9):
            best_s, choice = latency_s, (i, k)
    return choice


def _split_item_s(out: InvocationLayout, tokens: int, k: int, resident: bool) -> tuple[float, float, float, float]:
    """One expert (``tokens`` tokens) split with ``k`` as :meth:`InvocationLayout.lay_out` lays it out: (each unit's
    kernel bin as the packer has it, the larger of its kernels and its DRAM time; each unit's DRAM seconds, its
    copy's reads included unless ``resident``; PCIe seconds of that copy; GPU seconds)."""
    costs, expert, units, sources = out.costs, out.expert, out.units, out.sources
    if k > 0:
        gpu_shards, rest, share = float(k), units * k / (k - 1), 1 / k
    else:
        gpu_shards, rest, share = -k / (-k - 1), float(units * -k), (-k - 1) / -k
    kernels, dram = costs.ndp_pair(expert, tokens, rest)
    gpu_s = expert_shard_time_s(out.ctx.system.gpu, expert, tokens, gpu_shards)
    if resident:
        return max(kernels, dram), dram, 0.0, gpu_s
    dram += costs.copy_read_s(expert, sources) * share
    pcie_s = out.ctx.system.host_link.latency_s + expert.weight_bytes() * share / costs.copy_bandwidth(sources)
    return max(kernels, dram), dram, pcie_s, gpu_s


def _candidate_spans_s(
    out: InvocationLayout, on_gpu: Sequence[bool], resident: Sequence[bool], candidates: list[tuple[int, int]]
) -> list[float]:
    """The packer's objective (:func:`span_terms_s`, every unit alike: every expert is sliced) of the placement with
    each candidate ``(position, k)``'s expert split: the screen before the exact layouts."""
    items = out.item_lists(out.active, out.active_tokens, resident)
    n, c = len(out.active), len(candidates)
    gpu_mask = np.asarray(on_gpu, dtype=bool)
    pcie = np.repeat(np.where(gpu_mask, items["transfer"], 0.0)[None, :], c, axis=0)
    gpu = np.repeat(np.where(gpu_mask, items["gpu"], 0.0)[None, :], c, axis=0)
    first_unit = [row[0] for row in items["ndp"]], [row[0] for row in items["dram"]], [row[0] for row in items["copy"]]
    kernels = np.repeat(np.where(gpu_mask, 0.0, first_unit[0])[None, :], c, axis=0)
    dram = np.repeat(np.where(gpu_mask, first_unit[2], first_unit[1])[None, :], c, axis=0)
    copied_gpu = np.repeat(np.where(gpu_mask & (np.asarray(items["transfer"]) > 0), items["gpu"], np.inf)[None], c, 0)
    for row, (i, k) in enumerate(candidates):
        part = _split_item_s(out, out.active_tokens[i], k, bool(resident[i]))
        kernels[row, i], dram[row, i], pcie[row, i], gpu[row, i] = part
        copied_gpu[row, i] = part[3] if part[2] > 0 else np.inf
    result_s, result_pcie_s = out.result_s()
    return span_terms_s(
        0.0,
        0.0,
        np.full(1, out.activation_s()),
        result_s,
        result_pcie_s,
        True,
        True,
        pcie.sum(axis=1),
        gpu.sum(axis=1),
        kernels.sum(axis=1)[:, None],
        dram.sum(axis=1)[:, None],
        copied_gpu.min(axis=1) if n else np.full(c, np.inf),
        np.ones(c, dtype=bool),  # the split expert keeps part of it on the units
    ).tolist()


def _split_latency_s(
    ctx: RunContext,
    scratch: LayoutState,
    out: InvocationLayout,
    on_gpu: Sequence[bool],
    resident: Sequence[bool],
    at: int,
    k: int,
) -> float:
    """The latency of ``out``'s experts placed as ``on_gpu`` says, the one at position ``at`` split with ``k``."""
    layout = InvocationLayout(ctx, scratch, out.layer_index, out.active, out.active_tokens)
    record_split(layout, on_gpu, resident, at, k)
    return layout.finish().latency_s


def record_split(
    out: InvocationLayout, on_gpu: Sequence[bool], resident: Sequence[bool], at: int, k: int
) -> list[tuple[int, bool]]:
    """Record active expert ``i`` on the GPU where ``on_gpu[i]`` (its copy unless ``resident[i]``), sliced otherwise,
    but the one at position ``at`` split with ``k``; returns ``(expert, resident)`` of those whose GPU copy ran (the
    split one if resident)."""
    on_the_gpu: list[tuple[int, bool]] = []
    for i in range(len(out.active)):
        e, tokens, res = out.active[i], out.active_tokens[i], bool(resident[i])
        if i == at:
            out.split(e, tokens, k, res)
            if res:
                on_the_gpu.append((e, True))
        elif on_gpu[i]:
            out.to_gpu(e, tokens, res)
            on_the_gpu.append((e, res))
        else:
            out.sliced([e], [tokens])
    return on_the_gpu
