"""``monde+cache``: MoNDE keeping the experts it moves in an LRU GPU cache."""

from __future__ import annotations

from hw_model.policies.balanced import _Balanced
from hw_model.policies.base import PolicyState
from hw_model.prefetch import ExpertLRUCache
from hw_model.run_context import RunContext


class MondeCache(_Balanced):
    name = "monde+cache"
    role = "baseline"
    description = "monde + an LRU GPU cache of the experts it moved, as large as our residency budget"
    source = "MoNDE (DAC 2024) with the GPU cache of offloading systems (e.g. Fiddler, MoE-Infinity)"
    keeps_residents = True

    def new_state(self, ctx: RunContext) -> PolicyState:
        return PolicyState(lru=ExpertLRUCache(ctx.residency_cap_bytes))

    def _resident(self, state: PolicyState, layer_index: int, active: list[int]) -> list[bool]:
        assert state.lru is not None
        cached = state.lru.experts_of(layer_index)
        return [e in cached for e in active]

    def _keep(self, state: PolicyState, layer_index: int, e: int, weight_bytes: float) -> None:
        assert state.lru is not None
        state.lru.use((layer_index, e), weight_bytes)
