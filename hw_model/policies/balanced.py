"""MoNDE's balancing rule, shared by ``monde``, ``monde+cache`` and ``tp``: move experts to the GPU in
load-aware order, as many as balance GPU and NDP time."""

from __future__ import annotations

import time
from operator import add, sub

import numpy as np

from hw_model.layout import InvocationLayout
from hw_model.policies.base import Policy, PolicyState
from hw_model.policies.packing import staging_cap_bytes
from hw_model.run_context import RunContext
from hw_model.scheduler import best_prefix_lists


def load_aware_order(ndp: np.ndarray, tokens: np.ndarray, resident: np.ndarray) -> np.ndarray:
    """MoNDE's order of moving experts to the GPU: resident ones first (no copy), hottest first; then,
    repeatedly, the hottest remaining expert of the currently busiest unit (ties: lower index). ``ndp`` is
    experts x units NDP time; the order is of row indices."""
    order = _load_aware_order(ndp.tolist(), tokens.tolist(), resident.tolist(), ndp.shape[1])
    return np.asarray(order, dtype=np.int64)


def _load_aware_order(loads: list[list[float]], heat: list[int], res: list[bool], units: int) -> list[int]:
    """:func:`load_aware_order` over plain lists (what the balancing rule calls: a decode invocation has a
    handful of experts, where numpy's per-call cost would dominate)."""
    n = len(heat)
    order = sorted((i for i in range(n) if res[i]), key=lambda i: -heat[i])
    left = [i for i in range(n) if not res[i]]  # ascending, so the first of equal heat is the lower index
    load = [0.0] * units
    for i in left:
        load = list(map(add, load, loads[i]))
    while left:
        pool = left
        if units:
            busiest = load.index(max(load))
            pool = [i for i in left if loads[i][busiest] > 0] or left
        pick = max(pool, key=heat.__getitem__)  # the first of the hottest: the lowest index
        order.append(pick)
        left.remove(pick)
        load = list(map(sub, load, loads[pick]))
    return order


class _Balanced(Policy):
    """MoNDE's rule: move experts to the GPU in load-aware order, as many as balance GPU and NDP time."""

    def place(self, ctx: RunContext, state: PolicyState, out: InvocationLayout, phase: str) -> None:
        layer_index = out.layer_index
        resident = self._resident(state, layer_index, out.active)
        chosen = self._moved(ctx, state, out, resident)
        weight_bytes = ctx.expert_bytes[layer_index]
        on_ndp: list[int] = []
        ndp_tokens: list[int] = []
        for e, tokens, res in zip(out.active, out.active_tokens, resident, strict=True):
            if e in chosen:
                out.to_gpu(e, tokens, res)
                self._keep(state, layer_index, e, weight_bytes)
            else:
                on_ndp.append(e)
                ndp_tokens.append(tokens)
        out.on_ndp(on_ndp, ndp_tokens)
        out.extra["resident_selected"] = float(sum(resident))
        out.finish()

    def _moved(self, ctx: RunContext, state: PolicyState, out: InvocationLayout, resident: list[bool]) -> set[int]:
        """The active experts this rule moves to the GPU, memoised (a pure speed-up: the choice is identical).

        The rule sees each expert only through its tokens, its home unit (whole layouts) and its residency, and
        among equal ones takes the lowest id first; resident experts go first, hottest first, equal heat in id
        order. So the choice is a function of the resident experts' (tokens, home) in that order and of how many
        non-resident experts share each (tokens, home): memoised by that signature as, per resident expert,
        whether it moves and, per group, how many of its lowest ids move. A choice that does not take a group's
        lowest ids is not memoised."""
        ids = out.active
        tokens = out.active_tokens
        units = out.units
        homes = [0] * len(ids) if self.tensor_parallel or not units else [e % units for e in ids]
        groups: dict[tuple[int, int], list[int]] = {}  # (tokens, home) of non-resident experts -> ids, ascending
        first: list[tuple[int, int, int]] = []  # resident (tokens, home, id), hottest first, then by id
        for e, t, h, r in zip(ids, tokens, homes, resident, strict=True):
            if r:
                first.append((t, h, e))
            else:
                members = groups.get((t, h))
                if members is None:
                    groups[t, h] = [e]
                else:
                    members.append(e)
        if first:
            first.sort(key=lambda item: -item[0])
        key = (
            ctx.layer_classes[out.layer_index],
            tuple([item[:2] for item in first]),
            tuple(sorted([(group, len(members)) for group, members in groups.items()])),
        )
        memo = state.pack_memo.get(key)
        if memo is None:
            items = out.item_lists(ids, tokens, resident)
            started = time.perf_counter()
            order = _load_aware_order(items["ndp"], tokens, resident, units)
            result_s, result_pcie_s = out.result_s()
            # best_prefix of _placement_problem's problem, on the lists (same answer, no numpy per-call cost)
            base = [out.activation_s()] * units
            kept = len(first) * ctx.expert_bytes[out.layer_index] if self.keeps_residents else None  # its cache's
            staging = staging_cap_bytes(ctx, state, kept)
            k = best_prefix_lists(items, order, base, staging, result_s, result_pcie_s, True, True)
            state.decision_times_s.append(time.perf_counter() - started)
            chosen = {ids[i] for i in order[:k]}
            moved = {group: sum(e in chosen for e in members) for group, members in groups.items()}
            if all(set(members[: moved[group]]) == chosen.intersection(members) for group, members in groups.items()):
                if len(state.pack_memo) > 200_000:
                    state.pack_memo.clear()
                state.pack_memo[key] = (tuple(item[2] in chosen for item in first), moved)
            return chosen
        first_moves, moved = memo
        chosen = {item[2] for item, moves in zip(first, first_moves, strict=True) if moves}
        for group, members in groups.items():
            chosen.update(members[: moved[group]])
        return chosen

    def _resident(self, state: PolicyState, layer_index: int, active: list[int]) -> list[bool]:
        """Per active expert, whether its weights are on the GPU already."""
        return [False] * len(active)

    def _keep(self, state: PolicyState, layer_index: int, e: int, weight_bytes: float) -> None:
        return None
