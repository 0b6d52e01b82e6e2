"""Routing capture of a provider session: the trace (:mod:`hw_model.routing_trace`) of the runs it reported.

A session's :class:`~ndp_ep.reporter.SessionReporter` records nothing beyond its reports unless a capture is
started (:func:`start_capture`): then each run it simulates also appends its routing (its MoE layers' expert
counts, the non-expert seconds it was costed with, the latency it reported) to a
:class:`hw_model.routing_capture.RoutingCapture`, whose memory is bounded (it spools to a temporary file beyond
``resident_bytes``). A capture can start when the session is created (``capture_routing=True``) or at the first
:func:`routing_trace` call, as long as no report was built before it: the provider's routing log still holds
every run then (up to ``routing_capacity`` records). :func:`routing_trace` returns the
:class:`~hw_model.routing_trace.CapturedTrace`; ``save_trace`` (:mod:`hw_model.routing_trace_io`) writes it.
"""

from __future__ import annotations

from typing import Any

from hw_model.routing_capture import DEFAULT_RESIDENT_BYTES, RoutingCapture
from hw_model.routing_trace import CapturedTrace, RoutingSteps, TraceHeader, TraceLayer
from ndp_ep.errors import NdpEpError


def start_capture(reporter, resident_bytes: int = DEFAULT_RESIDENT_BYTES) -> RoutingCapture:
    """Start (or return) the routing capture of ``reporter``; :class:`NdpEpError` when it reported runs already
    without one (their routing is gone: create the session with ``capture_routing=True``)."""
    with reporter._lock:
        capture = reporter.capture
        if capture is None:
            if reporter.aggregates.runs:
                raise NdpEpError(
                    f"routing capture was not on for the {reporter.aggregates.runs} run(s) reported already: create "
                    "the session with capture_routing=True, or ask for the routing trace before reading any report"
                )
            capture = reporter.capture = RoutingCapture(len(reporter.layers), reporter._width, resident_bytes)
        return capture


def capture_header(
    reporter,
    steps: RoutingSteps | None = None,
    *,
    prompt_tokens: int | None = None,
    new_tokens: int | None = None,
    source: str = "",
) -> TraceHeader:
    """The trace header of ``reporter``'s session: its layers as converted, its settings, the versions. Without
    ``prompt_tokens`` / ``new_tokens``: the first step's tokens and the decode steps captured."""
    from hw_model.trace_replay import settings_json
    from ndp_ep.reporter import stored_weight_formats

    formats = stored_weight_formats(reporter._model, reporter.claimed)
    layers = []
    for node, stored in zip(reporter.claimed, formats, strict=True):
        spec = node.spec
        layers.append(
            TraceLayer(
                name=spec.layer,
                num_experts=spec.num_experts,
                top_k=spec.top_k,
                hidden=spec.hidden,
                ffn=spec.ffn,
                gated=bool(spec.gated),
                weight_dtype=spec.weight_dtype,
                block_size=stored.block_size if stored is not None else 0,
                scale_dtype=stored.scale_dtype if stored is not None else "",
            )
        )
    if prompt_tokens is None:
        prompt_tokens = int(max(steps.layer_tokens[0].max(), 0)) if steps is not None and steps.num_steps else 0
    if new_tokens is None:
        new_tokens = int((steps.phase == 1).sum()) if steps is not None else 0
    notes: tuple[str, ...] = ()
    if reporter.aggregates.dropped_runs:
        notes = (f"{reporter.aggregates.dropped_runs} run(s) the routing log dropped are not in the trace",)
    return TraceHeader(
        layers=tuple(layers),
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        settings=settings_json(reporter.settings),
        dtype=reporter.dtype,
        costed_as_stored=reporter.settings.dtype is None,
        gpu_reserved_bytes=float(reporter.non_expert_weight_bytes),
        versions=versions(),
        source=source,
        notes=notes,
    )


def versions() -> dict[str, str]:
    """The ndp-ep and ONNX Runtime versions of this process."""
    import onnxruntime

    from ndp_ep.cli import version

    return {"ndp_ep": version(), "onnxruntime": str(onnxruntime.__version__)}


def reporter_trace(reporter, **header: Any) -> CapturedTrace:
    """The trace of every run ``reporter`` reported since its capture started (starting it now if it can)."""
    start_capture(reporter)
    reporter.reports  # noqa: B018 - simulates (and so captures) the runs not reported yet
    if reporter.simulator is None:
        raise NdpEpError("the model has no MoE block the provider runs: there is no routing to capture")
    with reporter._lock:
        steps = reporter.capture.steps()
        return CapturedTrace(capture_header(reporter, steps, **header), steps)


def routing_trace(session, *, prompt_tokens: int | None = None, new_tokens: int | None = None) -> CapturedTrace:
    """The routing trace of a session: an ``ndp_ep.InferenceSession`` or a plain ``onnxruntime.InferenceSession``
    created with :func:`ndp_ep.session_options` (see the module docstring)."""
    from ndp_ep.reporter import reporter_for

    return reporter_trace(
        reporter_for(session), prompt_tokens=prompt_tokens, new_tokens=new_tokens, source="ndp_ep.routing_trace"
    )
