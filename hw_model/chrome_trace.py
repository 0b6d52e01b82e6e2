"""Simulated timelines as Chrome trace-event JSON, the format ONNX Runtime's profiler writes.

The file opens in Perfetto (https://ui.perfetto.dev) or ``chrome://tracing``::

    {"traceEvents": [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "GPU"}},
        {"name": "thread_name",  "ph": "M", "pid": 1, "tid": 1, "args": {"name": "gpu"}},
        {"name": "e3", "ph": "X", "ts": 12.5, "dur": 40.0, "pid": 1, "tid": 1, "cat": "gpu",
         "args": {"layer": 0, "phase": "prefill", "resource": "gpu"}},
        ...],
     "displayTimeUnit": "ms", "otherData": {...}}

One process per resource group (``MoE layers``, ``GPU``, ``PCIe``, ``NDP``, ``DIMM-link``), one thread per
resource: ``gpu``; ``pcie`` (host to GPU: expert weights, NDP outputs, prefetches) and ``pcie_d2h`` (GPU to
host: hidden states for the NDP units); ``ndp0``..``ndpN-1``; ``ndp_link``. Resources this module does not
know get a process of their own, so a new simulator resource still shows up. ``ts``/``dur`` are
microseconds. Every MoE layer invocation also gets one span on the ``MoE layers`` track covering its whole
latency, so the layers are labelled on the time axis as well as in each event's ``args``.

Input is deliberately plain: a :class:`TraceLayer` holds a layer index, where the layer starts on the
common time axis, and its events as ``(resource, start_s, end_s, label)`` tuples relative to that start
(``hw_model.timeline.TimelineEvent`` is such a tuple), so any producer of timeline events can be exported.
Events of one resource that overlap (which the simulator does not produce, but a future resource model
might) go to extra lanes ``<resource> #2``... so no lane ever holds overlapping spans.

:func:`add_power_counters` adds one power counter track (watts) per resource: its idle level, and its busy level
over its events (a run's report derives both from its energy, so the counters integrate to its joules).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hw_model.errors import WorkloadError
from ndp_io import atomic_write

US_PER_S = 1e6
LAYER_TRACK = "layers"  # the pseudo-resource of the per-layer spans


@dataclass(frozen=True)
class ResourceGroup:
    """How a resource is shown: its process (group) and thread names, sort keys and a colour name."""

    process: str
    process_rank: int
    thread: str
    thread_rank: int
    category: str

    def __post_init__(self) -> None:
        if not self.process or not self.thread or not self.category:
            raise WorkloadError("a resource group needs process, thread and category names")
        if self.process_rank < 0 or self.thread_rank < 0:
            raise WorkloadError("resource group ranks must be non-negative")


def resource_group(resource: str) -> ResourceGroup:
    """The group of a simulator resource name (``gpu``, ``pcie``, ``pcie_d2h``, ``ndpU``, ``ndp_link``)."""
    if resource == LAYER_TRACK:
        return ResourceGroup("MoE layers", 0, "layer", 0, "layer")
    if resource == "gpu":
        return ResourceGroup("GPU", 1, "gpu", 0, "gpu")
    if resource == "pcie":
        return ResourceGroup("PCIe", 2, "pcie h2d", 0, "pcie_h2d")
    if resource == "pcie_d2h":
        return ResourceGroup("PCIe", 2, "pcie d2h", 1, "pcie_d2h")
    match = re.fullmatch(r"ndp(\d+)", resource)
    if match:
        unit = int(match.group(1))
        return ResourceGroup("NDP", 3, f"ndp unit {unit}", unit, "ndp")
    if resource == "ndp_link":
        return ResourceGroup("DIMM-link", 4, "dimm-link", 0, "ndp_link")
    return ResourceGroup(resource, 5, resource, 0, "other")


def resource_sort_key(resource: str) -> tuple[int, int, str]:
    """Display order of resources: layers, GPU, PCIe h2d, PCIe d2h, NDP units by number, DIMM-link, others."""
    group = resource_group(resource)
    return (group.process_rank, group.thread_rank, resource)


@dataclass(frozen=True)
class TraceLayer:
    """One MoE layer invocation on the common time axis.

    ``events`` are ``(resource, start_s, end_s, label)`` relative to ``offset_s``; ``latency_s`` is the span
    of the layer (default: the latest event end). ``args`` are copied into every event's ``args``.
    """

    layer: int
    offset_s: float
    events: tuple[tuple[str, float, float, str], ...]
    phase: str = ""
    name: str = ""
    latency_s: float | None = None
    args: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        events = tuple((str(r), float(s), float(e), str(label)) for r, s, e, label in self.events)
        for resource, start, end, label in events:
            if not (math.isfinite(start) and math.isfinite(end)) or start < 0 or end < start:
                raise WorkloadError(f"layer {self.layer}: bad event {label!r} on {resource}: [{start}, {end}] s")
        object.__setattr__(self, "events", events)
        object.__setattr__(self, "args", MappingProxyType(dict(self.args)))
        if not math.isfinite(self.offset_s) or self.offset_s < 0:
            raise WorkloadError(f"layer {self.layer}: offset_s must be finite and non-negative, got {self.offset_s}")
        if self.latency_s is not None and (not math.isfinite(self.latency_s) or self.latency_s < 0):
            raise WorkloadError(f"layer {self.layer}: latency_s must be finite and non-negative")

    @property
    def span_s(self) -> float:
        """The layer's duration: ``latency_s`` or, when not given, the latest event end."""
        if self.latency_s is not None:
            return self.latency_s
        return max((end for _, _, end, _ in self.events), default=0.0)


def _assign_lanes(spans: list[tuple[float, float, int]]) -> list[int]:
    """Lane per span (sorted by start) so spans in one lane never overlap; lane 0 first."""
    lane_end: list[float] = []
    lanes = [0] * len(spans)
    for start, end, index in sorted(spans):
        lane = next((i for i, busy_until in enumerate(lane_end) if busy_until <= start + 1e-15), len(lane_end))
        if lane == len(lane_end):
            lane_end.append(0.0)
        lane_end[lane] = end
        lanes[index] = lane
    return lanes


def chrome_trace(layers: Iterable[TraceLayer], metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The trace-event JSON object of ``layers`` (see the module docstring)."""
    layers = list(layers)
    # absolute spans per resource, the per-layer span first
    per_resource: dict[str, list[tuple[float, float, str, TraceLayer]]] = {}
    for layer in layers:
        title = layer.name or f"layer {layer.layer}"
        if layer.phase:
            title = f"{title} {layer.phase}"
        per_resource.setdefault(LAYER_TRACK, []).append((layer.offset_s, layer.offset_s + layer.span_s, title, layer))
        for resource, start, end, label in layer.events:
            per_resource.setdefault(resource, []).append((layer.offset_s + start, layer.offset_s + end, label, layer))

    events: list[dict[str, Any]] = []
    pids: dict[str, int] = {}
    tids: dict[tuple[int, str], int] = {}
    for resource in sorted(per_resource, key=resource_sort_key):
        group = resource_group(resource)
        if group.process not in pids:
            pids[group.process] = len(pids) + 1
            pid = pids[group.process]
            events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": group.process}})
            events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        pid = pids[group.process]
        spans = per_resource[resource]
        lanes = _assign_lanes([(start, end, i) for i, (start, end, _, _) in enumerate(spans)])
        for lane in sorted(set(lanes)):
            thread = group.thread if lane == 0 else f"{group.thread} #{lane + 1}"
            tid = len([key for key in tids if key[0] == pid]) + 1
            tids[(pid, thread)] = tid
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": thread}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        for (start, end, label, layer), lane in zip(spans, lanes, strict=True):
            thread = group.thread if lane == 0 else f"{group.thread} #{lane + 1}"
            args: dict[str, Any] = {"layer": layer.layer}
            if layer.phase:
                args["phase"] = layer.phase
            if layer.name:
                args["layer_name"] = layer.name
            if resource != LAYER_TRACK:
                args["resource"] = resource
            args.update(layer.args)
            events.append(
                {
                    "name": label,
                    "ph": "X",
                    "ts": start * US_PER_S,
                    "dur": (end - start) * US_PER_S,
                    "pid": pid,
                    "tid": tids[(pid, thread)],
                    "cat": group.category,
                    "args": args,
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": dict(metadata or {})}


def sequential_layers(
    layers: Iterable[tuple[int, str, Sequence[tuple[str, float, float, str]], float]],
    gap_before_s: float = 0.0,
    gap_label: str = "non-expert ops",
    args: Mapping[str, Any] | None = None,
    names: Sequence[str] | None = None,
) -> list[TraceLayer]:
    """Lay ``(layer index, phase, events, latency_s)`` invocations out one after another.

    ``gap_before_s`` of GPU work (e.g. the attention and other non-expert ops before each MoE layer) precedes
    every layer and is drawn as one ``gpu`` event labelled ``gap_label`` belonging to that layer. ``names``
    (one per invocation) label the layers; ``args`` go into every event.
    """
    if not math.isfinite(gap_before_s) or gap_before_s < 0:
        raise WorkloadError(f"gap_before_s must be finite and non-negative, got {gap_before_s}")
    invocations = list(layers)
    if names is not None and len(names) != len(invocations):
        raise WorkloadError(f"{len(names)} layer names for {len(invocations)} layer invocations")
    out: list[TraceLayer] = []
    clock = 0.0
    for position, (index, phase, events, latency_s) in enumerate(invocations):
        shifted = [(r, s + gap_before_s, e + gap_before_s, label) for r, s, e, label in events]
        if gap_before_s > 0:
            shifted.insert(0, ("gpu", 0.0, gap_before_s, gap_label))
        name = names[position] if names is not None else ""
        layer = TraceLayer(
            index, clock, tuple(shifted), phase, name=name, latency_s=gap_before_s + latency_s, args=args or {}
        )
        out.append(layer)
        clock += layer.span_s
    return out


def write_chrome_trace(path: str | Path, trace: Mapping[str, Any]) -> Path:
    """Write ``trace`` (from :func:`chrome_trace`) as compact JSON, atomically (a temp file, then rename)."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "w", encoding="utf-8") as handle:
        json.dump(trace, handle, separators=(",", ":"))
    return path


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "x"


def write_bench_traces(records_or_results: Any, directory: str | Path, ndp_units: int | None = None) -> list[Path]:
    """One trace file per (model, policy) of the timelines ``ndp-ep bench`` keeps for its Gantt plots.

    Accepts either the gantt mapping :func:`hw_model.bench.run_bench` returns (``{model: {policy: {phase:
    events}}}``) or an iterable of job results (objects with ``.record`` holding ``model``, ``policy`` and
    ``ndp_units`` and ``.gantt`` holding ``{phase: events}``). Each file holds the kept layer invocations
    (layer 0 of the prefill, then one mid-stream decode step) one after another; returns the paths written.
    """
    runs: list[tuple[str, str, int | None, Mapping[str, Sequence]]] = []
    if isinstance(records_or_results, Mapping):
        for model, per_policy in records_or_results.items():
            for policy, phases in per_policy.items():
                runs.append((str(model), str(policy), ndp_units, phases))
    else:
        for result in records_or_results:
            phases = getattr(result, "gantt", None)
            record = getattr(result, "record", None)
            if not isinstance(record, Mapping) or phases is None:
                raise WorkloadError("write_bench_traces expects run_bench's gantt mapping or job results")
            if phases:
                runs.append((str(record["model"]), str(record["policy"]), record.get("ndp_units"), phases))
    directory = Path(directory)
    written: list[Path] = []
    for model, policy, units, phases in runs:
        invocations = [(0, phase, events, max((e[2] for e in events), default=0.0)) for phase, events in phases.items()]
        meta = {"model": model, "policy": policy}
        if units is not None:
            meta["ndp_units"] = units
        trace = chrome_trace(sequential_layers(invocations, args={"policy": policy}), metadata=meta)
        suffix = f"_{units}ndp" if units is not None else ""
        written.append(write_chrome_trace(directory / f"trace_{_safe(model)}{suffix}_{_safe(policy)}.json", trace))
    return written


def add_power_counters(
    trace: dict[str, Any], levels: Mapping[str, tuple[float, float]], end_s: float
) -> dict[str, Any]:
    """Add a power counter (``ph: "C"``, watts) per resource of ``levels`` (resource -> (idle W, busy W)) to
    ``trace`` (from :func:`chrome_trace`), in that resource's process: the idle level from 0, the busy level over
    each of its events, the idle level again after each, up to ``end_s``. Returns ``trace``."""
    events = trace["traceEvents"]
    pids = {e["args"]["name"]: e["pid"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    spans: dict[str, list[tuple[float, float]]] = {}
    for event in events:
        resource = event.get("args", {}).get("resource")
        if event.get("ph") == "X" and resource in levels:
            start = event["ts"] / US_PER_S
            spans.setdefault(resource, []).append((start, start + event["dur"] / US_PER_S))
    counters = []
    for resource, (idle_w, busy_w) in sorted(levels.items(), key=lambda item: resource_sort_key(item[0])):
        group = resource_group(resource)
        if group.process not in pids:
            pids[group.process] = max(pids.values(), default=0) + 1
        pid = pids[group.process]
        name = f"{resource} power"
        points = [(0.0, idle_w)]
        clock = 0.0
        for start, end in sorted(spans.get(resource, [])):  # union of the busy spans
            if end <= clock:
                continue
            start = max(start, clock)
            if start > clock:
                points.append((clock, idle_w))
            points.append((start, busy_w))
            clock = end
        points.append((clock, idle_w))
        points.append((max(end_s, clock), idle_w))
        for ts, watts in points:
            counters.append({"name": name, "ph": "C", "ts": ts * US_PER_S, "pid": pid, "args": {"W": watts}})
    events.extend(counters)
    return trace


def counter_energy_j(trace: Mapping[str, Any]) -> float:
    """Joules under the power counters of ``trace`` (each level held until the counter's next sample)."""
    by_name: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for event in trace["traceEvents"]:
        if event.get("ph") == "C" and "W" in event.get("args", {}):
            by_name.setdefault((event["pid"], event["name"]), []).append((event["ts"] / US_PER_S, event["args"]["W"]))
    total = 0.0
    for points in by_name.values():
        for (t0, watts), (t1, _) in zip(points, points[1:], strict=False):
            total += watts * (t1 - t0)
    return total


def busy_s_by_resource(trace: Mapping[str, Any]) -> dict[str, float]:
    """Seconds of ``X`` events per simulator resource (their ``args.resource``), read back from a trace object.

    The per-layer spans of the ``MoE layers`` track are not a resource and are left out.
    """
    busy: dict[str, float] = {}
    for event in trace["traceEvents"]:
        resource = event.get("args", {}).get("resource")
        if event.get("ph") == "X" and resource is not None:
            busy[resource] = busy.get(resource, 0.0) + event["dur"] / US_PER_S
    return busy


__all__ = [
    "LAYER_TRACK",
    "ResourceGroup",
    "add_power_counters",
    "counter_energy_j",
    "TraceLayer",
    "busy_s_by_resource",
    "chrome_trace",
    "resource_group",
    "resource_sort_key",
    "sequential_layers",
    "write_bench_traces",
    "write_chrome_trace",
]
