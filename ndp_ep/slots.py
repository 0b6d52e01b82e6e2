"""Every token slot's expert id and routing weight, for ``ndp_ep.InferenceSession(capture_routing="slots")``.

The provider's routing log holds each invocation's expert counts (native/src/routing_log.cc), which is what the
reports and a replay need. The ids and weights of every slot are the sharded ops' second and third inputs: with
``capture_routing="slots"`` the session hands ONNX Runtime the model with those tensors added as graph outputs, asks
for them in every ``run`` beside the caller's outputs, returns only the caller's, and keeps the rest per run tag
until the run is reported, when the routing capture (:class:`hw_model.routing_capture.RoutingCapture`) takes them
(:meth:`SlotCapture.take`). At most :data:`ndp_ep.pending.MAX_PENDING_RUNS` runs wait (the oldest are dropped,
and the trace then has no slots, saying so); ``run_with_ort_values`` and io binding runs have none either. With
``pre_gating=True`` the same copy also carries the pre-gating predictors' nodes and outputs
(:mod:`ndp_ep.pregating`), whose ids each run scores against the ops' ids it fetched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ndp_ep.pending import PendingRuns


class SlotCapture:
    """The slot outputs of one session's sharded ops (in the reporter's layer order) and the runs' values."""

    def __init__(self, model, claimed: Sequence[Any], keep_slots: bool = True, predictor=None) -> None:
        nodes = {node.name: node for node in model.graph.node}
        self.predictor = predictor  # a PreGating (ndp_ep/pregating.py), or None
        fetched = keep_slots or (predictor is not None and predictor.outputs)  # the ids the predictions are scored on
        self.names: list[tuple[str, str]] = (
            [(nodes[c.name].input[1], nodes[c.name].input[2]) for c in claimed] if fetched else []
        )
        self.extra = [name for pair in self.names for name in pair]
        self.extra += predictor.outputs if self.names and predictor is not None else []
        self.slot_source = self.take if keep_slots else None  # what the routing capture takes every slot from
        self.outputs = [output.name for output in model.graph.output]
        self._pending = PendingRuns()  # per run tag: each layer's (ids, weights)

    def model_with_outputs(self, model):
        """A copy of ``model`` whose graph also outputs every sharded op's expert ids and routing weights."""
        copy = type(model)()
        copy.CopyFrom(model)
        for name in self.extra[: 2 * len(self.names)]:
            if name not in self.outputs:
                copy.graph.output.add().name = name  # ONNX Runtime infers its type
        if self.predictor is not None:
            self.predictor.add_to(copy)
        return copy

    def requested(self, output_names: Sequence[str] | None) -> list[str]:
        """The outputs to ask ONNX Runtime for: the caller's (all the model's when None), then the slots'."""
        return [*(self.outputs if output_names is None else output_names), *self.extra]

    def split(self, tag: int, results: list) -> list:
        """The caller's results; the slot values kept under ``tag``."""
        own = len(results) - len(self.extra)
        if own == len(results):
            return results
        values = results[own:]
        layers = [
            (np.asarray(values[2 * i]).reshape(-1).astype(np.int32), np.asarray(values[2 * i + 1]).reshape(-1))
            for i in range(len(self.names))
        ]
        if self.predictor is not None and self.predictor.outputs:
            self.predictor.count(tag, [ids for ids, _ in layers], values[2 * len(self.names) :])
        if self.slot_source is None:
            return results[:own]
        self._pending.put(tag, [(ids, weights.astype(np.float32)) for ids, weights in layers])
        return results[:own]

    def take(self, tag: int) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """The slots of the run tagged ``tag`` (removed), or None."""
        return self._pending.take(tag)


def slot_capture(
    option: object, converted, claimed: Sequence[Any], ort_model, base_dir, pre_gating: object = False
) -> tuple[Any, Any]:
    """``InferenceSession``'s ``capture_routing`` and ``pre_gating`` options: ``(SlotCapture, the model ONNX Runtime
    gets)`` for ``"slots"`` or ``pre_gating=True`` (with the slot outputs and the predictors, its external weights
    inline; the model as it is when no output is added), ``(None, ort_model)`` for neither or a model without sharded
    ops; anything else raises :class:`ndp_ep.NdpEpError`."""
    from ndp_ep.errors import NdpEpError

    if pre_gating is not False and pre_gating is not True:
        raise NdpEpError(f"pre_gating must be True or False, got {pre_gating!r}")
    if option is not False and option is not True and option != "slots":
        raise NdpEpError(f"capture_routing must be False, True or 'slots', got {option!r}")
    if not claimed or (option != "slots" and not pre_gating):
        return None, ort_model
    from ndp_ep.pregating import PreGating

    predictor = PreGating(converted, claimed) if pre_gating else None
    capture = SlotCapture(converted, claimed, keep_slots=option == "slots", predictor=predictor)
    if not capture.extra:  # no predictor to score, no slots to keep
        return capture, ort_model
    model = capture.model_with_outputs(converted)
    if base_dir is not None and isinstance(ort_model, str):  # a converted model on disk: its weights beside it
        from graph_passes.model_io import load_external_data
        from ndp_ep.errors import graph_pass_errors

        with graph_pass_errors():
            load_external_data(model, base_dir)
    return capture, model.SerializeToString()


def attach(capture: SlotCapture | None, reporter, capture_routing: object) -> None:
    """Start ``reporter``'s routing capture when ``capture_routing`` is on (every slot from ``capture`` with
    ``"slots"``) and hand it the runs' pre-gating (:meth:`ndp_ep.pregating.PreGating.take`) when that is on."""
    if capture_routing:
        from ndp_ep.routing import start_capture

        start_capture(reporter, slot_source=capture.slot_source if capture is not None else None)
    if capture is not None and capture.predictor is not None and capture.predictor.outputs:
        reporter.pre_gating_source = capture.predictor.take
