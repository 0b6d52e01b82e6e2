"""Replaying a captured routing trace (:mod:`hw_model.routing_trace`) on any simulated design.

:func:`replay` drives one :class:`~hw_model.simulator.MoESimulator` through the trace's steps in order, each
step's layers at once with its non-expert GPU seconds spread before its layers, exactly as a session's reporter
(ndp_ep/reporter.py) simulated the run that captured it: under that run's settings (:func:`settings_of_header`)
the replayed step latencies equal the reported ones to the bit. Under other settings (hardware, NDP units,
policy, dtype, knobs) it answers what the same routing would cost there. :func:`settings_json` is what a capture
writes into the header.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hw_model.errors import TraceFormatError
from hw_model.hardware import DTYPE_BYTES, SystemSpec
from hw_model.routing_trace import CapturedTrace
from hw_model.settings import SimulationSettings


def settings_json(settings: SimulationSettings) -> dict[str, Any]:
    """The settings as the header's JSON object: every command-line field (``hw`` as its preset name or TOML path,
    a :class:`SystemSpec` as its name)."""
    out: dict[str, Any] = {}
    for item in SimulationSettings.option_fields():
        value = getattr(settings, item.name)
        if item.name == "hw":
            value = value.name if isinstance(value, SystemSpec) else os.fspath(value)
        out[item.name] = value
    return out


def settings_of_header(header_settings: Mapping[str, Any], **overrides: Any) -> SimulationSettings:
    """The :class:`SimulationSettings` a trace was captured under, with ``overrides`` applied (a field it names
    that this ndp-ep does not know is refused)."""
    known = {item.name for item in SimulationSettings.option_fields()}
    unknown = sorted(set(header_settings) - known)
    if unknown:
        raise TraceFormatError(f"the header's settings name {unknown[0]!r}, which this ndp-ep does not know")
    values = {**header_settings, **overrides}
    return SimulationSettings(**values)


@dataclass(frozen=True)
class ReplayResult:
    """Per step, the simulated seconds (non-expert GPU time plus the MoE layers') and their sum in step order."""

    step_s: tuple[float, ...]
    moe_s: tuple[float, ...]
    total_s: float
    prefill_s: float
    decode_s: float
    decode_steps: int
    summary: Mapping[str, Any]


def replay(trace: CapturedTrace, settings: SimulationSettings | None = None) -> ReplayResult:
    """Simulate ``trace`` under ``settings`` (default: those it was captured under)."""
    from hw_model.simulator import MoESimulator

    header = trace.header
    if settings is None:
        settings = settings_of_header(header.settings)
    shapes = header.layer_shapes(settings.dtype)
    reserved = header.gpu_reserved_bytes
    if settings.dtype is not None and header.dtype in DTYPE_BYTES and settings.dtype != header.dtype:
        reserved *= DTYPE_BYTES[settings.dtype] / DTYPE_BYTES[header.dtype]  # the same weights in another dtype
    if not shapes:
        raise TraceFormatError("the trace has no MoE layer to replay")
    simulator = MoESimulator.from_settings(settings, shapes, gpu_reserved_bytes=reserved)
    every = len(shapes)
    step_s: list[float] = []
    moe_of: list[float] = []
    total = prefill = decode = 0.0
    decode_steps = 0
    gaps = trace.steps.gap_s.tolist()
    for index in range(trace.num_steps):
        phase, layers, tokens, dense = trace.step(index)
        gap = gaps[index]
        moe = 0.0
        if layers and any(tokens):
            step = simulator.simulate_step(
                phase,
                dense,
                layers=None if len(layers) == every else layers,
                gap_before_layer_s=gap / len(layers),
            )
            moe = sum(step.latencies_s)
        seconds = gap + moe
        step_s.append(seconds)
        moe_of.append(moe)
        total += seconds
        if phase == "decode":
            decode += seconds
            decode_steps += 1
        else:
            prefill += seconds
    return ReplayResult(tuple(step_s), tuple(moe_of), total, prefill, decode, decode_steps, simulator.summary())
