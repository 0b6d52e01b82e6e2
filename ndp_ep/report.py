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
    step: Any = None
    """The simulator's :class:`hw_model.simulator.StepResult` this invocation is ``position`` of (not in JSON);
    the properties below read its :class:`~hw_model.simulator.LayerResult`, built on first read."""
    position: int = 0

    @property
    def timeline(self) -> Any:
        """The simulator's :class:`hw_model.simulator.LayerResult` of this invocation (None without one)."""
        return self.step[self.position] if self.step is not None else None

    @property
    def placement(self) -> dict[int, str]:
        """Expert id to where it ran: ``"gpu"``, ``"ndp"`` (sliced over the units), ``"ndpU"`` or ``"split"``."""
        return dict(self.timeline.placement) if self.timeline is not None else {}

    @property
    def busy_s(self) -> dict[str, float]:
        """Busy seconds per simulated resource during this invocation."""
        return dict(sorted(self.timeline.busy_by_resource().items())) if self.timeline is not None else {}

    @property
    def events(self) -> tuple[tuple[str, float, float, str], ...]:
        """The simulated timeline, ``(resource, start_s, end_s, label)`` from the layer's start."""
        return tuple(self.timeline.events) if self.timeline is not None else ()

    @property
    def active_experts(self) -> int:
        return sum(1 for c in self.expert_tokens if c)

    def __repr__(self) -> str:
        return (
            f"LayerReport({self.name!r}, tokens={self.tokens}, active_experts={self.active_experts}, "
            f"latency_s={self.latency_s:.3e})"
        )

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
    weights: str = ""  # what the expert weights were costed as (default: ``dtype``)

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
            "weights": self.weights or self.dtype,
            "phase": self.phase,
            "tokens": self.tokens,
            "simulated_latency_s": self.simulated_latency_s,
            "non_expert_gpu_s": self.non_expert_gpu_s,
            "moe_s": self.moe_s,
            "layers": [layer.to_json() for layer in self.layers],
            "simulator": self.simulator,
            "notes": list(self.notes),
        }

    def __repr__(self) -> str:
        return (
            f"RunReport(run_index={self.run_index}, phase={self.phase!r}, tokens={self.tokens}, "
            f"simulated_latency_s={self.simulated_latency_s:.3e}, layers={len(self.layers)}, "
            f"hardware={self.hardware!r}, policy={self.policy!r})"
        )

    def __str__(self) -> str:
        """The readable report of :meth:`format_text` (``print(report)``)."""
        return self.format_text()

    def chrome_trace(self) -> dict[str, Any]:
        """This run's simulated timeline as Chrome trace-event JSON (see :mod:`hw_model.chrome_trace`).

        The MoE layers run one after another, each preceded by an equal share of ``non_expert_gpu_s`` on the
        GPU (the session charges the non-expert ops that way), so the trace spans ``simulated_latency_s``.
        """
        from hw_model.chrome_trace import TraceLayer, chrome_trace, sequential_layers

        meta = {k: v for k, v in self.to_json().items() if k not in ("layers", "simulator")}
        if not self.layers:
            only = TraceLayer(0, 0.0, (("gpu", 0.0, self.non_expert_gpu_s, "non-expert ops"),), self.phase)
            return chrome_trace([only], metadata=meta)
        invocations = [(layer.index, self.phase, layer.events, layer.latency_s) for layer in self.layers]
        gap = self.non_expert_gpu_s / len(self.layers)
        names = [layer.name for layer in self.layers]
        return chrome_trace(sequential_layers(invocations, gap, "non-expert ops", names=names), metadata=meta)

    def format_text(self) -> str:
        """The headline (simulated latency, phase, tokens, hardware, policy, the dtype weights are costed as),
        then one aligned row per MoE layer: its latency, how many experts it activated and where they ran."""
        from ndp_ep.text import plural, table

        lines = [
            f"simulated latency {self.simulated_latency_s * 1e3:.3f} ms  "
            f"({self.phase}, {plural(self.tokens, 'token')}, "
            f"{self.hardware} with {plural(self.ndp_units, 'NDP unit')}, "
            f"policy {self.policy}, weights costed as {self.weights or self.dtype})",
        ]
        rows = [["non-expert ops on GPU", f"{self.non_expert_gpu_s * 1e3:.3f} ms", "", ""]]
        for layer in self.layers:
            where = sorted(set(layer.placement.values()))
            rows.append(
                [
                    layer.name,
                    f"{layer.latency_s * 1e3:.3f} ms",
                    plural(layer.active_experts, "expert"),
                    f"on {'+'.join(where) or '-'}",
                ]
            )
        lines += table(rows, "<><<", indent="  ")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)
