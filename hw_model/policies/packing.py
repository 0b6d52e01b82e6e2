"""The load-balancing packer (:mod:`hw_model.scheduler`) as ``tp+lb`` and ours call it: the placement problem of
one invocation, its decision memoised per item sequence, and the plan reused while the activation
histogram stays close to the one it was made on."""

from __future__ import annotations

import time

import numpy as np

from hw_model.layout import InvocationLayout
from hw_model.policies.base import PolicyState
from hw_model.run_context import RunContext
from hw_model.scheduler import PlacementProblem, pack


def _scheduled_gpu_set(
    ctx: RunContext, state: PolicyState, out: InvocationLayout, resident: list[bool], phase: str
) -> tuple[list[bool], frozenset[int] | None]:
    """Per active expert of the invocation ``out``, whether the packer puts it on the GPU (``resident[i]``: whether
    active expert ``i`` is there already); and the new plan (its GPU set), or None when the plan was reused (while
    the smoothed activation histogram stays close to the plan's, and, with ``replan_on_copies``, the invocation
    selects every expert the plan copied: reused for others, its copies would be lost)."""
    tracker = state.histograms[phase]
    layer_index, active = out.layer_index, out.active
    tuning = ctx.tuning
    if tracker.drift.pop(layer_index) <= tuning.drift_threshold and (
        not tuning.replan_on_copies or tracker.plan_copies[layer_index].issubset(active)
    ):
        planned_gpu = tracker.plans[layer_index]
        # the plan is kept unless residency disagrees with it (replan_on_residency)
        if not tuning.replan_on_residency or all(
            [resident[i] == (active[i] in planned_gpu) for i in range(len(active))]
        ):
            state.reuses += 1
            # respect residency: resident active experts run on the GPU (no copy); others as planned
            return [resident[i] or active[i] in planned_gpu for i in range(len(active))], None  # index loop: simulator
    staging_cap = staging_cap_bytes(ctx, state)
    # Items differ only by token count and residency, so the packer's decision is a function of the items'
    # (tokens, resident) sequence: memoised per sequence (a pure speed-up, the decision is identical). A new
    # sequence is put in one canonical order (by tokens, then residency, then position), so the packer runs
    # once per distinct set of items, whatever their order.
    active_tokens = out.active_tokens
    signature = (ctx.layer_classes[layer_index], tuple(active_tokens), tuple(resident), staging_cap)
    on_gpu = state.pack_memo.get(signature)
    if on_gpu is None:
        canonical = sorted(range(len(active)), key=list(zip(active_tokens, resident, strict=True)).__getitem__)
        tokens = [active_tokens[i] for i in canonical]
        res = [resident[i] for i in canonical]
        canonical_signature = (signature[0], tuple(tokens), tuple(res), staging_cap)
        decision = state.pack_memo.get(canonical_signature)
        if decision is None:
            decision = _pack_decision(ctx, state, out, [active[i] for i in canonical], tokens, res, staging_cap)
            state.pack_memo[canonical_signature] = decision
        on_gpu = [False] * len(active)
        for i, chosen in zip(canonical, decision, strict=True):
            on_gpu[i] = chosen
        state.pack_memo[signature] = on_gpu
    state.recomputations += 1
    if phase == "decode":
        state.decode_recomputations += 1
    planned = frozenset([e for e, chosen in zip(active, on_gpu, strict=True) if chosen])
    copies = frozenset([active[i] for i in range(len(active)) if on_gpu[i] and not resident[i]])
    tracker.replan(layer_index, planned, copies)
    return on_gpu, planned


def staging_cap_bytes(ctx: RunContext, state: PolicyState, kept_bytes: float | None = None) -> float:
    """The bytes one invocation's on-demand copies may take: the fixed staging share, or with ``dynamic_staging``
    all of the GPU pool but what must stay: a prefetcher's residents, or (a cache without one) ``kept_bytes``, the
    cached experts the invocation itself uses (the cache's others make room, least recently used first)."""
    held = state.prefetcher.held_bytes if state.prefetcher is not None else kept_bytes
    if not ctx.tuning.dynamic_staging or held is None:
        return ctx.staging_cap_bytes
    pool = ctx.residency_cap_bytes + ctx.staging_cap_bytes
    return max(ctx.staging_cap_bytes, pool - held)


def _placement_problem(
    ctx: RunContext, out: InvocationLayout, items: dict[str, np.ndarray], staging_cap: float | None = None
) -> PlacementProblem:
    """The packer's problem for the invocation ``out`` over the per-item arrays ``items`` (see
    :meth:`InvocationLayout.item_arrays`): every unit starts busy with the activation copy, its NDP work and
    copy reads are costed as the timeline does (kernels and DRAM, the outputs' way back, copy before compute);
    on-demand copies within ``staging_cap`` bytes (default: the fixed staging share)."""
    result_s, result_pcie_s = out.result_s()
    return PlacementProblem(
        ndp_time_s=items["ndp"],
        gpu_compute_s=items["gpu"],
        transfer_s=items["transfer"],
        transfer_bytes=items["staged"],
        staging_cap_bytes=ctx.staging_cap_bytes if staging_cap is None else staging_cap,
        unit_base_s=np.full(out.units, out.activation_s()),
        copy_unit_s=items["copy"],
        ndp_dram_s=items["dram"],
        result_s=result_s,
        result_pcie_s=result_pcie_s,
        ndp_optional=True,
        copy_tail=True,
    )


def _pack_decision(
    ctx: RunContext,
    state: PolicyState,
    out: InvocationLayout,
    ids: list[int],
    tokens: list[int],
    resident: list[bool],
    staging_cap: float | None = None,
) -> list[bool]:
    """The load-balancing packer's choice (per item: on the GPU?) for experts ``ids`` of the invocation ``out``
    with ``tokens`` tokens each, ``resident`` or not, copies within ``staging_cap`` bytes; its wall time is recorded
    as a decision time."""
    problem = _placement_problem(ctx, out, out.item_arrays(ids, tokens, resident), staging_cap)
    started = time.perf_counter()
    decision = pack(problem).tolist()
    state.decision_times_s.append(time.perf_counter() - started)
    if len(state.pack_memo) > 200_000:
        state.pack_memo.clear()
    return decision
