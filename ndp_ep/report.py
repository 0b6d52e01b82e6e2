"""Simulated-latency reports of provider runs (what ``InferenceSession.last_report`` holds).

A session's reporter builds one :class:`RunReport` per run with :meth:`RunReport.of_step`, which leaves the
run's :class:`LayerReport` s to be built from the simulated step (:class:`StepLayers`) when ``layers`` is first
read: reading ``last_report`` after every run then costs no per-layer objects nobody looks at. Every field
reads the same as a report built whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class LayerReport:
    """One MoE layer invocation: the routing it took and what the simulated hardware made of it."""

    index: int
    name: str
    tokens: int
    expert_tokens: tuple[int, ...]
    latency_s: float
    step: Any = None
    """The simulator's :class:`hw_model.step_results.StepResult` this invocation is ``position`` of (not in JSON);
    the properties below read its :class:`~hw_model.step_results.LayerResult`, built on first read."""
    position: int = 0

    @property
    def timeline(self) -> Any:
        """The simulator's :class:`hw_model.step_results.LayerResult` of this invocation (None without one)."""
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

    @property
    def energy(self) -> Any:
        """This invocation's :class:`hw_model.energy.EnergyReport` over its latency (None without a timeline or
        without the hardware's energy tables)."""
        return self.timeline.energy() if self.timeline is not None else None

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
            **_energy_json(self.energy, detail=False),
        }


class StepLayers(NamedTuple):
    """What a report's :class:`LayerReport` s are built from: the invocations of one simulated step, in order.
    Invocation ``i`` ran layer ``indices[i]`` (named ``names[indices[i]]``, with ``widths[indices[i]]`` experts)
    on ``tokens[i]`` tokens routed as row ``i`` of ``counts`` (per expert; zero beyond the layer's experts; not
    modified afterwards); ``step`` is the simulator's :class:`hw_model.step_results.StepResult` (its
    ``latencies_s`` and timelines)."""

    indices: Sequence[int]
    names: Sequence[str]
    widths: Sequence[int]
    tokens: Sequence[int]
    counts: np.ndarray  # [invocations, widest layer's experts]
    step: Any

    def build(self) -> tuple[LayerReport, ...]:
        names, widths, step = self.names, self.widths, self.step
        rows = self.counts.tolist()
        return tuple(
            LayerReport(
                index=index,
                name=names[index],
                tokens=tokens,
                expert_tokens=tuple(row[: widths[index]]),
                latency_s=latency_s,
                step=step,
                position=position,
            )
            for position, (index, tokens, row, latency_s) in enumerate(
                zip(self.indices, self.tokens, rows, step.latencies_s, strict=True)
            )
        )


def _energy_json(energy: Any, detail: bool = True) -> dict[str, Any]:
    """``energy_j`` and ``avg_power_w`` (None without energy figures), and with ``detail`` the per-resource
    breakdown (``energy``: :meth:`hw_model.energy.EnergyReport.to_json`)."""
    if energy is None:
        out: dict[str, Any] = {"energy_j": None, "avg_power_w": None}
        if detail:
            out["energy"] = None
        return out
    out = {"energy_j": energy.total_j, "avg_power_w": energy.avg_power_w}
    if detail:
        out["energy"] = energy.to_json()
    else:
        out["energy_by_resource_j"] = dict(energy.by_resource_j)
    return out


def run_energy_of(layers: Sequence[LayerReport], elapsed_s: float, non_expert_gpu_s: float) -> Any:
    """The :class:`hw_model.energy.EnergyReport` of a run: its layers' work priced over ``elapsed_s`` (the run's
    simulated latency), its non-expert GPU time as memory-bound GPU work; None without layers or energy tables."""
    results = [layer.timeline for layer in layers if layer.timeline is not None]
    if not results:
        return None
    from hw_model.energy import NDP_FLOPS, run_energy

    work = [sum(column) for column in zip(*(r.work for r in results), strict=True)]
    busy: dict[str, float] = {}
    for r in results:
        for resource, seconds in r.busy_by_resource().items():
            busy[resource] = busy.get(resource, 0.0) + seconds
    pcie = sum(r.bytes_over_host_link + r.extra.get("prefetch_bytes", 0.0) for r in results)
    return run_energy(
        results[0].system,
        work,
        pcie_bytes=pcie,
        elapsed_s=elapsed_s,
        busy_s=busy,
        dtype=results[0].dtype,
        uses_ndp=results[0].needs_ndp or work[NDP_FLOPS] > 0,
        extra_gpu_busy_s=non_expert_gpu_s,
    )


def power_levels(energy: Any, trace: dict[str, Any], units: int) -> dict[str, tuple[float, float]]:
    """(idle W, busy W) per trace resource such that the counters integrate to ``energy`` (an
    :class:`hw_model.energy.EnergyReport`): each resource's static power when idle, plus its dynamic joules spread
    over its busy time in ``trace`` (the GPU's memory energy with the GPU, the DRAM, core and host-copy energy over
    the NDP units, PCIe's over both directions)."""
    from hw_model.chrome_trace import busy_s_by_resource

    busy = busy_s_by_resource(trace)
    elapsed = energy.elapsed_s or 1.0
    total, static = energy.by_resource_j, energy.static_j
    ndp = [f"ndp{u}" for u in range(units)]
    groups = {
        ("gpu",): (("gpu", "gpu_memory"), ("gpu",)),
        ("pcie", "pcie_d2h"): (("pcie",), ("pcie",)),
        tuple(ndp): (("ndp_core", "ndp_dram", "host"), ("ndp_core", "ndp_dram")),
        ("ndp_link",): (("ndp_link",), ("ndp_link",)),
    }
    levels: dict[str, tuple[float, float]] = {}
    for resources, (parts, static_parts) in groups.items():
        if not resources:
            continue
        static_j = sum(static.get(p, 0.0) for p in static_parts)
        dynamic_j = sum(total.get(p, 0.0) for p in parts) - static_j
        busy_s = sum(busy.get(r, 0.0) for r in resources)
        idle_w = static_j / elapsed / len(resources)
        if busy_s <= 0:  # nothing ran there: its dynamic joules (if any) spread over the run
            idle_w += dynamic_j / elapsed / len(resources)
        for resource in resources:
            levels[resource] = (idle_w, idle_w + (dynamic_j / busy_s if busy_s > 0 else 0.0))
    return levels


def simulated_summary(snapshot: Any) -> dict[str, Any]:
    """A report's ``simulator``: the summary of a :class:`hw_model.step_results.SummarySnapshot` without its measured
    wall-clock values (:data:`MEASURED_SUMMARY_KEYS`), so that a report depends only on the routing simulated."""
    summary = snapshot.as_dict()
    for key in MEASURED_SUMMARY_KEYS:
        summary.pop(key, None)
    return summary


# what MoESimulator.summary() measures rather than simulates: how long the packer took to decide (wall time)
MEASURED_SUMMARY_KEYS = ("decision_time_median_s",)
# the fields a report from RunReport.of_step builds when first read: field -> (what it is built from, how)
_LAZY_FIELDS = {"layers": ("_step_layers", StepLayers.build), "simulator": ("_summary", simulated_summary)}


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
    simulator: dict[str, Any] = field(default_factory=dict)  # the simulator's counters as of this run (simulated only)
    notes: tuple[str, ...] = ()  # what the figures leave out or approximate (skipped blocks, unknown shapes)
    weights: str = ""  # what the expert weights were costed as (default: ``dtype``)
    pre_gating: Any = None
    """The run's :class:`ndp_ep.pregating.PreGatingHits` (each layer's experts predicted from the previous layer's
    hidden state, against those it took) with ``InferenceSession(pre_gating=True)``; None otherwise."""

    def __post_init__(self) -> None:
        _check_report(
            self.run_index, self.tokens, self.ndp_units, self.non_expert_gpu_s, [x.latency_s for x in self.layers]
        )

    @classmethod
    def of_step(
        cls,
        run_index: int,
        hardware: str,
        ndp_units: int,
        policy: str,
        dtype: str,
        weights: str,
        phase: str,
        tokens: int,
        non_expert_gpu_s: float,
        step_layers: StepLayers,
        summary: Any,
        notes: tuple[str, ...],
        pre_gating: Any = None,
    ) -> RunReport:
        """The report whose ``layers`` are ``step_layers.build()`` and whose ``simulator`` is
        :func:`simulated_summary` of ``summary`` (a :class:`hw_model.step_results.SummarySnapshot` of the run), each
        built when first read (the constructor's checks, now)."""
        _check_report(run_index, tokens, ndp_units, non_expert_gpu_s, step_layers.step.latencies_s)
        report = cls.__new__(cls)
        report.__dict__.update(  # frozen: its fields are set as the dataclass's __init__ would, without __setattr__
            run_index=run_index,
            hardware=hardware,
            ndp_units=ndp_units,
            policy=policy,
            dtype=dtype,
            phase=phase,
            tokens=tokens,
            non_expert_gpu_s=non_expert_gpu_s,
            notes=notes,
            weights=weights,
            pre_gating=pre_gating,
            _step_layers=step_layers,
            _summary=summary,
        )
        return report

    def __getattr__(self, name: str) -> Any:
        """``layers`` and ``simulator`` of a report from :meth:`of_step`, built on first read (only called for a
        missing attribute; two threads reading at once build equal values, either one is kept)."""
        lazy = _LAZY_FIELDS.get(name)
        if lazy is not None:
            source = self.__dict__.get(lazy[0])
            if source is not None:
                value = lazy[1](source)
                self.__dict__[name] = value
                return value
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def moe_s(self) -> float:
        source = self.__dict__.get("_step_layers")
        if source is not None and "layers" not in self.__dict__:  # the same sum, without building the layers
            return sum(source.step.latencies_s)
        return sum(layer.latency_s for layer in self.layers)

    @property
    def simulated_latency_s(self) -> float:
        return self.non_expert_gpu_s + self.moe_s

    @property
    def energy(self) -> Any:
        """The run's :class:`hw_model.energy.EnergyReport` (:func:`run_energy_of`; computed once)."""
        if "_energy" not in self.__dict__:
            self.__dict__["_energy"] = run_energy_of(self.layers, self.simulated_latency_s, self.non_expert_gpu_s)
        return self.__dict__["_energy"]

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
            **_energy_json(self.energy),
            "layers": [layer.to_json() for layer in self.layers],
            "simulator": self.simulator,
            "notes": list(self.notes),
            **({"pre_gating": self.pre_gating.to_json()} if self.pre_gating is not None else {}),
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
        from hw_model.chrome_trace import TraceLayer, add_power_counters, chrome_trace, sequential_layers

        meta = {k: v for k, v in self.to_json().items() if k not in ("layers", "simulator")}
        if not self.layers:
            only = TraceLayer(0, 0.0, (("gpu", 0.0, self.non_expert_gpu_s, "non-expert ops"),), self.phase)
            return chrome_trace([only], metadata=meta)
        invocations = [(layer.index, self.phase, layer.events, layer.latency_s) for layer in self.layers]
        gap = self.non_expert_gpu_s / len(self.layers)
        names = [layer.name for layer in self.layers]
        trace = chrome_trace(sequential_layers(invocations, gap, "non-expert ops", names=names), metadata=meta)
        if self.energy is not None:
            add_power_counters(trace, power_levels(self.energy, trace, self.ndp_units), self.simulated_latency_s)
        return trace

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
        energy = self.energy
        if energy is not None:
            lines.append(
                f"  energy: {energy.total_j * 1e3:.3f} mJ simulated, average power {energy.avg_power_w:.1f} W "
                f"(most on {energy.dominant}: {energy.by_resource_j[energy.dominant] * 1e3:.3f} mJ)"
            )
        pin_cost = self.simulator.get("pin_cost_s") if isinstance(self.simulator, dict) else None
        if pin_cost is not None:  # hw_model/pins.py: the session's runs so far, against the policy's own choice
            lines.append(
                f"  placement pins: {pin_cost * 1e3:+.4f} ms over the session's runs so far against the policy's "
                "own placement"
            )
        if self.pre_gating is not None:
            lines.append(f"  {self.pre_gating.format_text()}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def _check_report(
    run_index: int, tokens: int, ndp_units: int, non_expert_gpu_s: float, latencies_s: Sequence[float]
) -> None:
    """A :class:`RunReport`'s checks, however it is built: counts and simulated times non-negative."""
    if run_index < 0 or tokens < 0 or ndp_units < 0:
        raise ValueError("RunReport: run_index, tokens and ndp_units must be non-negative")
    if non_expert_gpu_s < 0 or any(latency < 0 for latency in latencies_s):
        raise ValueError("RunReport: simulated times must be non-negative")
