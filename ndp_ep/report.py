"""Simulated-latency reports of provider runs (what ``InferenceSession.last_report`` holds)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LayerReport:
    """One MoE layer invocation: the routing it took and what the simulated hardware made of it."""

    index: int
    name: str
    tokens: int
    expert_tokens: tuple[int, ...]
    latency_s: float
    placement: dict[int, str]
    busy_s: dict[str, float]

    @property
    def active_experts(self) -> int:
        return sum(1 for c in self.expert_tokens if c)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "layer": self.name,
            "tokens": self.tokens,
            "active_experts": self.active_experts,
            "expert_tokens": list(self.expert_tokens),
            "latency_s": self.latency_s,
            "placement": {str(k): v for k, v in sorted(self.placement.items())},
            "busy_s": self.busy_s,
        }


@dataclass(frozen=True)
class RunReport:
    """The simulated latency of one ``run`` on the configured GPU + NDP system."""

    run_index: int
    hardware: str
    ndp_units: int
    policy: str
    dtype: str
    phase: str
    tokens: int
    non_expert_gpu_s: float
    layers: tuple[LayerReport, ...]
    simulator: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # what the figures leave out or approximate (skipped blocks, unknown shapes)

    def __post_init__(self) -> None:
        if self.run_index < 0 or self.tokens < 0 or self.ndp_units < 0:
            raise ValueError("RunReport: run_index, tokens and ndp_units must be non-negative")
        if self.non_expert_gpu_s < 0 or any(layer.latency_s < 0 for layer in self.layers):
            raise ValueError("RunReport: simulated times must be non-negative")

    @property
    def moe_s(self) -> float:
        return sum(layer.latency_s for layer in self.layers)

    @property
    def simulated_latency_s(self) -> float:
        return self.non_expert_gpu_s + self.moe_s

    def to_json(self) -> dict[str, Any]:
        return {
            "run_index": self.run_index,
            "hardware": self.hardware,
            "ndp_units": self.ndp_units,
            "policy": self.policy,
            "dtype": self.dtype,
            "phase": self.phase,
            "tokens": self.tokens,
            "simulated_latency_s": self.simulated_latency_s,
            "non_expert_gpu_s": self.non_expert_gpu_s,
            "moe_s": self.moe_s,
            "layers": [layer.to_json() for layer in self.layers],
            "simulator": self.simulator,
            "notes": list(self.notes),
        }

    def format_text(self) -> str:
        lines = [
            f"simulated latency {self.simulated_latency_s * 1e3:.3f} ms  ({self.phase}, {self.tokens} tokens, "
            f"{self.hardware} with {self.ndp_units} NDP units, policy {self.policy}, {self.dtype})",
            f"  non-expert ops on GPU  {self.non_expert_gpu_s * 1e3:9.3f} ms",
        ]
        for layer in self.layers:
            where = sorted(set(layer.placement.values()))
            lines.append(
                f"  {layer.name:<28} {layer.latency_s * 1e3:9.3f} ms  {layer.active_experts:>3} experts  "
                f"on {'+'.join(where) or '-'}"
            )
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)
