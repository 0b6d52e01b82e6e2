"""``tp+lb+prefetch``: ours, the complete framework (``tp+lb`` and dataset-free prefetch)."""

from __future__ import annotations

from hw_model.policies.base import PolicyState
from hw_model.policies.residency import _prefetcher
from hw_model.policies.tp_lb import TensorParallelLoadBalanced
from hw_model.prefetch import ExpertLRUCache
from hw_model.run_context import RunContext


class Ours(TensorParallelLoadBalanced):
    name = "tp+lb+prefetch"
    role = "ours"
    description = (
        "tp+lb + dataset-free prefetch of frequently selected experts into GPU memory (the complete framework), "
        "one expert split between the GPU and the NDP units where that ends the layer sooner"
    )
    source = "arXiv 2601.03992 (dataset-free prefetching)"
    keeps_residents = True
    balances_splits = True

    def new_state(self, ctx: RunContext) -> PolicyState:
        # the staging area keeps its copies, least recently used out first, as gpu-offload's does
        return PolicyState(prefetcher=_prefetcher(ctx), lru=ExpertLRUCache(ctx.staging_cap_bytes))

    def _resident(self, state: PolicyState, layer_index: int, active: list[int]) -> list[bool]:
        assert state.prefetcher is not None and state.lru is not None
        prefetched = state.prefetcher.resident_sets[layer_index]
        cached = state.lru.experts_of(layer_index)
        if not cached:
            return [e in prefetched for e in active]
        return [e in prefetched or e in cached for e in active]
