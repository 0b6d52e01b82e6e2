"""``gpu-offload``: the expert-offloading baseline (every expert on the GPU, no NDP compute)."""

from __future__ import annotations

from hw_model.layout import InvocationLayout
from hw_model.policies.base import Policy, PolicyState
from hw_model.policies.residency import _keep_copies, _prefetcher
from hw_model.prefetch import ExpertLRUCache
from hw_model.run_context import RunContext


class GpuOffload(Policy):
    name = "gpu-offload"
    role = "baseline"
    description = (
        "every expert on the GPU; the same dataset-free prefetcher as ours keeps experts resident, misses are "
        "copied on demand into an LRU staging area (plain DIMMs, no NDP compute) as large as the pool the residents "
        "leave"
    )
    source = "expert-offloading systems (MoE-Infinity, ProMoE, HOBBIT); ../shared/reference/hardware.md"
    needs_ndp = False
    layout = "host"
    keeps_residents = True

    def new_state(self, ctx: RunContext) -> PolicyState:
        return PolicyState(prefetcher=_prefetcher(ctx), lru=ExpertLRUCache(ctx.staging_cap_bytes))

    def place(self, ctx: RunContext, state: PolicyState, out: InvocationLayout, phase: str) -> None:
        prefetcher, lru = state.prefetcher, state.lru
        assert prefetcher is not None and lru is not None
        layer_index = out.layer_index
        prefetched, cached = prefetcher.resident_sets[layer_index], lru.experts_of(layer_index)
        on_the_gpu = [(e, e in prefetched or e in cached) for e in out.active]
        for (e, resident), tokens in zip(on_the_gpu, out.active_tokens, strict=True):
            out.to_gpu(e, tokens, resident)
        _keep_copies(ctx, state, layer_index, on_the_gpu, ctx.expert_bytes[layer_index])
        out.finish()
