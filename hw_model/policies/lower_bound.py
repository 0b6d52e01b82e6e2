"""``lower-bound``: a per-invocation lower bound on every policy (a bound, not a system)."""

from __future__ import annotations

import numpy as np

from hw_model.layout import InvocationLayout
from hw_model.policies.base import Policy, PolicyState
from hw_model.run_context import RunContext
from hw_model.timeline import LayerTimeline, TimelineEvent
from hw_model.workload import MoELayerShape


class LowerBound(Policy):
    name = "lower-bound"
    role = "bound"
    description = (
        "expert compute spread fractionally over the GPU and all NDP units with no copies; the GPU takes at "
        "most as many experts per layer as the GPU memory pool holds"
    )
    source = "ours (a bound, not a system)"
    needs_ndp = False
    layout = "sliced"

    def place(self, ctx: RunContext, state: PolicyState, out: InvocationLayout, phase: str) -> None:
        _lower_bound(ctx, out)


def gpu_expert_slots(ctx: RunContext, layer: MoELayerShape) -> float:
    """How many of ``layer``'s experts the whole GPU memory pool (residency + staging) holds at once."""
    return (ctx.residency_cap_bytes + ctx.staging_cap_bytes) / layer.expert.weight_bytes()


def _lower_bound(ctx: RunContext, out: InvocationLayout) -> None:
    """A per-invocation lower bound on every policy; the larger of two relaxations of one problem:

    - compute: the expert work spread fractionally over the GPU and all NDP units, no copies (GPU vs NDP);
    - memory: the GPU holds at most :func:`gpu_expert_slots` experts for free; every further expert it takes
      costs a PCIe copy at full link bandwidth (NDP vs PCIe; the experts with most NDP time go first).
    """
    system, costs = ctx.system, ctx.costs
    units = system.num_ndp_units
    layer = out.layer
    expert = layer.expert
    gpu_s = np.array([costs.gpu_s(expert, tokens) for tokens in out.active_tokens])
    if units:
        # per-unit time if the expert's work is spread evenly, whichever of whole/sharded kernels is cheaper
        ndp_s = np.array(
            [
                min(costs.ndp_s(expert, tokens, 1) / units, costs.ndp_s(expert, tokens, units))
                for tokens in out.active_tokens
            ]
        )
        gpu_load, ndp_load = 0.0, float(ndp_s.sum())
        for i in np.argsort(gpu_s / np.maximum(ndp_s, 1e-30), kind="stable").tolist():
            share = min(1.0, max(0.0, (ndp_load - gpu_load) / (gpu_s[i] + ndp_s[i])))
            gpu_load += share * gpu_s[i]
            ndp_load -= share * ndp_s[i]
            if share < 1.0:
                break
        copy_s = expert.weight_bytes() / system.host_link.bandwidth_bytes_per_s
        free = gpu_expert_slots(ctx, layer)
        left, pcie = float(ndp_s.sum()), 0.0
        for d in np.sort(ndp_s)[::-1].tolist():
            take_free = min(1.0, free)
            free -= take_free
            left -= take_free * d
            if take_free < 1.0:
                rest = 1.0 - take_free
                share = min(rest, max(0.0, (left - pcie) / (d + copy_s)))
                left -= share * d
                pcie += share * copy_s
                if share < rest:
                    break
        memory_bound = max(left, pcie)
    else:
        gpu_load, ndp_load = float(gpu_s.sum()), 0.0
        extra = max(0.0, len(out.active) - gpu_expert_slots(ctx, layer))
        memory_bound = extra * expert.weight_bytes() / system.host_link.bandwidth_bytes_per_s
    gpu_load, ndp_load, memory_bound = float(gpu_load), float(ndp_load), float(memory_bound)
    latency = max(gpu_load, ndp_load, memory_bound)
    events = [TimelineEvent("gpu", 0.0, gpu_load, "expert work (fractional)")] if gpu_load > 0 else []
    events += [
        TimelineEvent(f"ndp{u}", 0.0, ndp_load, "expert work (fractional)") for u in range(units) if ndp_load > 0
    ]
    timeline = LayerTimeline(tuple(events), latency, 0.0, 0.0, "none")
    out.extra["memory_bound_s"] = memory_bound
    out.finish_with_timeline(timeline, dict.fromkeys(out.active, "split"))
