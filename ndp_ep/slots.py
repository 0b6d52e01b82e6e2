"""Every token slot's expert id and routing weight, for ``ndp_ep.InferenceSession(capture_routing="slots")``.

The provider's routing log holds each invocation's expert counts (native/src/routing_log.cc), which is what the
reports and a replay need. The ids and weights of every slot are the sharded ops' second and third inputs: with
``capture_routing="slots"`` the session hands ONNX Runtime the model with those tensors added as graph outputs, asks
for them in every ``run`` beside the caller's outputs, returns only the caller's, and keeps the rest per run tag
until the run is reported, when the routing capture (:class:`hw_model.routing_capture.RoutingCapture`) takes them
(:meth:`SlotCapture.take`). At most :data:`MAX_PENDING_RUNS` runs wait (the oldest are dropped, and the trace then
has no slots, saying so); ``run_with_ort_values`` and io binding runs have none either.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

MAX_PENDING_RUNS = 4096


class SlotCapture:
    """The slot outputs of one session's sharded ops (in the reporter's layer order) and the runs' values."""

    def __init__(self, model, claimed: Sequence[Any]) -> None:
        nodes = {node.name: node for node in model.graph.node}
        self.names: list[tuple[str, str]] = [(nodes[c.name].input[1], nodes[c.name].input[2]) for c in claimed]
        self.extra = [name for pair in self.names for name in pair]
        self.outputs = [output.name for output in model.graph.output]
        self._pending: OrderedDict[int, list[tuple[np.ndarray, np.ndarray]]] = OrderedDict()
        self._lock = threading.Lock()
        self.dropped = 0

    def model_with_outputs(self, model):
        """A copy of ``model`` whose graph also outputs every sharded op's expert ids and routing weights."""
        copy = type(model)()
        copy.CopyFrom(model)
        for name in self.extra:
            if name not in self.outputs:
                copy.graph.output.add().name = name  # ONNX Runtime infers its type
        return copy

    def requested(self, output_names: Sequence[str] | None) -> list[str]:
        """The outputs to ask ONNX Runtime for: the caller's (all the model's when None), then the slots'."""
        return [*(self.outputs if output_names is None else output_names), *self.extra]

    def split(self, tag: int, results: list) -> list:
        """The caller's results; the slot values kept under ``tag``."""
        own = len(results) - len(self.extra)
        values = results[own:]
        layers = [
            (np.asarray(values[2 * i]).reshape(-1).astype(np.int32), np.asarray(values[2 * i + 1]).reshape(-1))
            for i in range(len(self.names))
        ]
        with self._lock:
            self._pending[tag] = [(ids, weights.astype(np.float32)) for ids, weights in layers]
            while len(self._pending) > MAX_PENDING_RUNS:
                self._pending.popitem(last=False)
                self.dropped += 1
        return results[:own]

    def take(self, tag: int) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """The slots of the run tagged ``tag`` (removed), or None."""
        with self._lock:
            return self._pending.pop(tag, None)


def slot_capture(option: object, converted, claimed: Sequence[Any], ort_model, base_dir) -> tuple[Any, Any]:
    """``InferenceSession``'s ``capture_routing`` option: ``(SlotCapture, the model ONNX Runtime gets)`` for
    ``"slots"`` (with the slot outputs, its external weights inline), ``(None, ort_model)`` for False and True;
    anything else raises :class:`ndp_ep.NdpEpError`."""
    from ndp_ep.errors import NdpEpError

    if option is False or option is True or (option == "slots" and not claimed):
        return None, ort_model
    if option != "slots":
        raise NdpEpError(f"capture_routing must be False, True or 'slots', got {option!r}")
    capture = SlotCapture(converted, claimed)
    model = capture.model_with_outputs(converted)
    if base_dir is not None and isinstance(ort_model, str):  # a converted model on disk: its weights beside it
        from graph_passes.model_io import load_external_data
        from ndp_ep.errors import graph_pass_errors

        with graph_pass_errors():
            load_external_data(model, base_dir)
    return capture, model.SerializeToString()
