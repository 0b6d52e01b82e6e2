"""What the policies keeping experts resident share: the dataset-free prefetcher built from the run's
settings, and where a copy made for an expert run on the GPU is kept (prefetcher or LRU staging area)."""

from __future__ import annotations

from hw_model.policies.base import PolicyState
from hw_model.policies.packing import staging_cap_bytes
from hw_model.prefetch import ExpertPrefetcher, PrefetchConfig
from hw_model.run_context import RunContext


def _keep_copies(
    ctx: RunContext, state: PolicyState, layer_index: int, experts: list[tuple[int, bool]], weight_bytes: float
) -> None:
    """``experts`` (``(expert, resident)`` pairs, ``weight_bytes`` each) ran on the GPU: a copy made for one (not
    resident) is adopted by the prefetcher when its plan wants the expert, or else kept in the LRU staging area
    until its space is needed. A resident expert the prefetcher holds stays out of the staging area (it was not
    copied); one resident in the staging area is touched there. With a prefetcher, the staging area is as large
    as :func:`~hw_model.policies.packing.staging_cap_bytes` says now (with ``dynamic_staging``: all of the pool
    the residents leave, least recently used copies going out as residents arrive)."""
    prefetcher, lru = state.prefetcher, state.lru
    if prefetcher is not None and lru is not None:
        lru.resize(staging_cap_bytes(ctx, state))
    if prefetcher is None:
        if lru is not None:
            lru.use_all([(layer_index, e) for e, _ in experts], weight_bytes)
        return
    held = prefetcher.resident_sets[layer_index]  # grows as copies are adopted, so tested before adopting
    staged = [
        (layer_index, e)
        for e, resident in experts
        if e not in held and (resident or not prefetcher.adopt_staged(layer_index, e))
    ]
    if lru is not None and staged:
        lru.use_all(staged, weight_bytes)


def _prefetcher(ctx: RunContext) -> ExpertPrefetcher:
    config = PrefetchConfig(
        residency_cap_bytes=ctx.residency_cap_bytes,
        update_interval_tokens=ctx.tuning.prefetch_interval_tokens,
        decay=ctx.tuning.prefetch_decay,
        change_z=ctx.tuning.prefetch_change_z,
        lazy_eviction=bool(ctx.tuning.prefetch_lazy_eviction),
    )
    return ExpertPrefetcher(
        [layer.num_experts for layer in ctx.layers], [layer.expert.weight_bytes() for layer in ctx.layers], config
    )
