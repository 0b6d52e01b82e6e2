"""Captured routing traces in a sweep grid's ``traces`` axis (``traces = ["synthetic", "run.npz"]``).

A trace file written by ``--save-routing`` (:mod:`hw_model.routing_trace`) carries its model's shapes, so it is a
workload of its own: it is not crossed with the grid's ``models``; it gets one point per hardware, hardware-axis
value, NDP count, residency fraction and policy, with the model named after the capture (``model_name_of``) and
the skew level ``captured``. A point replays the trace (:func:`hw_model.bench_trace.replay_record`) under the
trace's own settings with the point's hardware, NDP count, policy and residency fraction. Older token traces
(``ndp-ep-trace/1``) stay what they were: routing for the grid's built-in models.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hw_model.bench_trace import CAPTURED_LEVEL, model_name_of, replay_record
from hw_model.hardware import SystemSpec
from hw_model.routing_trace import CapturedTrace
from hw_model.routing_trace_io import is_routing_trace, load_captured
from hw_model.trace_replay import settings_of_header

__all__ = ["CAPTURED_LEVEL", "captured_model", "captured_traces", "run_captured"]


def captured_traces(traces: Iterable[str], synthetic: str) -> tuple[str, ...]:
    """The captured routing traces among a grid's ``traces`` (each read once here: a bad one is refused now)."""
    found = tuple(t for t in traces if t != synthetic and is_routing_trace(t))
    for trace in found:
        load_captured(trace)
    return found


def captured_model(path: str) -> str:
    """The model name the points of a captured trace carry."""
    return model_name_of(load_captured(path).header, Path(path).stem)


def run_captured(path: str, system: SystemSpec, policy: str, residency_fraction: float, cache: dict) -> dict[str, Any]:
    """One sweep point of a captured trace: its replay's main-table record (``cache`` keeps the trace read)."""
    trace = cache.get(("captured", path))
    if not isinstance(trace, CapturedTrace):
        trace = cache[("captured", path)] = load_captured(path)
    settings = settings_of_header(
        trace.header.settings, hw=system, ndp_units=None, policy=policy, residency_fraction=residency_fraction
    )
    return replay_record(trace, settings, model_name_of(trace.header, Path(path).stem))
