"""Per-layer simulation of MoE expert work on a GPU + NDP system, driven by the routing actually taken.

A :class:`MoESimulator` is created once per session (or per trace) and fed one MoE layer invocation at a
time: which experts were selected and for how many tokens. It returns a :class:`LayerResult` with the
layer's latency and an event timeline over the resources ``gpu``, ``pcie`` and ``ndp0..ndpN-1``.
The ORT session and the trace-driven ``bench`` both use this class, so their figures never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from hw_model.cost import expert_shard_time_s, kernel_time_s
from hw_model.errors import WorkloadError
from hw_model.hardware import SystemSpec
from hw_model.workload import MoELayerShape

PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class TimelineEvent:
    """One busy interval of one resource (``gpu``, ``pcie``, ``ndp0``...)."""

    resource: str
    start_s: float
    end_s: float
    label: str


@dataclass(frozen=True)
class LayerResult:
    """What one MoE layer invocation cost and where its experts ran."""

    layer_index: int
    phase: str
    tokens: int
    latency_s: float
    placement: Mapping[int, str]
    events: tuple[TimelineEvent, ...]
    bytes_over_host_link: float = 0.0
    extra: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "placement", MappingProxyType(dict(self.placement)))
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))

    def busy_s(self, resource: str) -> float:
        return sum(e.end_s - e.start_s for e in self.events if e.resource == resource)


class MoESimulator:
    """Simulates MoE layers one invocation at a time under a scheduling policy.

    This first policy, ``tp``, runs every activated expert tensor-parallel over all NDP units
    (each unit takes one shard), then reduces the partial sums over the NDP link.
    """

    def __init__(self, system: SystemSpec, layers: Sequence[MoELayerShape], policy: str = "tp") -> None:
        if policy != "tp":
            raise WorkloadError(f"unknown policy {policy!r}")
        if system.num_ndp_units < 1:
            raise WorkloadError("policy 'tp' needs at least one NDP unit")
        self.system = system
        self.layers = tuple(layers)
        self.policy = policy

    def simulate_layer(self, layer_index: int, expert_token_counts: Sequence[int], phase: str) -> LayerResult:
        if phase not in PHASES:
            raise WorkloadError(f"phase must be one of {PHASES}, got {phase!r}")
        if not 0 <= layer_index < len(self.layers):
            raise WorkloadError(f"layer_index {layer_index} out of range (model has {len(self.layers)})")
        layer = self.layers[layer_index]
        counts = np.asarray(expert_token_counts, dtype=np.int64)
        if counts.shape != (layer.num_experts,) or (counts < 0).any():
            raise WorkloadError(
                f"{layer.name}: expected {layer.num_experts} non-negative expert token counts, got {counts.tolist()}"
            )
        units = self.system.num_ndp_units
        unit_clock = [0.0] * units
        events: list[TimelineEvent] = []
        placement: dict[int, str] = {}
        for expert_id in np.flatnonzero(counts):
            tokens = int(counts[expert_id])
            shard_s = expert_shard_time_s(self.system.ndp_unit, layer.expert, tokens, shards=units)
            for unit in range(units):
                start = unit_clock[unit]
                unit_clock[unit] = start + shard_s
                events.append(TimelineEvent(f"ndp{unit}", start, unit_clock[unit], f"e{expert_id}/s{unit}"))
            placement[int(expert_id)] = "ndp"
        compute_end = max(unit_clock)
        tokens_total = int(counts.sum() // layer.top_k) if layer.top_k else 0
        reduce_bytes = layer.expert.partial_sum_bytes(tokens_total) * (units - 1)
        reduce_s = self.system.ndp_link.transfer_time_s(reduce_bytes) if units > 1 else 0.0
        if reduce_s > 0:
            events.append(TimelineEvent("ndp_link", compute_end, compute_end + reduce_s, "reduce partial sums"))
        # The combined output returns to the GPU for the residual add.
        out_bytes = tokens_total * layer.expert.hidden * layer.expert.dtype_bytes
        return_s = self.system.host_link.transfer_time_s(out_bytes)
        start = compute_end + reduce_s
        events.append(TimelineEvent("pcie", start, start + return_s, "expert output to GPU"))
        return LayerResult(
            layer_index=layer_index,
            phase=phase,
            tokens=tokens_total,
            latency_s=start + return_s,
            placement=placement,
            events=tuple(events),
            bytes_over_host_link=out_bytes,
        )


def gpu_op_time_s(system: SystemSpec, flops: float, bytes_moved: float, dtype: str) -> float:
    """Time of one non-expert operation (attention, norm, router...) on the GPU."""
    return kernel_time_s(system.gpu, flops, bytes_moved, dtype, kernels=1)
