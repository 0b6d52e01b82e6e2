"""Helpers of the provider tests: plain ONNX Runtime sessions with NdpExecutionProvider added."""

from __future__ import annotations

import numpy as np
import pytest

import ndp_ep


def _relative_error(ours: np.ndarray, stock: np.ndarray) -> float:
    ours, stock = np.asarray(ours, np.float64), np.asarray(stock, np.float64)
    return float(np.max(np.abs(ours - stock)) / max(float(np.max(np.abs(stock))), 1e-30))


@pytest.fixture
def relative_error():
    """max |ours - stock| / max |stock| (the parity measure of the acceptance criteria)."""
    return _relative_error


@pytest.fixture
def ep_session():
    """``ep_session(model_or_path, threads=1, **ep_options)``: a plain ``onnxruntime.InferenceSession`` on the EP."""
    import onnxruntime as ort

    def make(model, threads: int = 1, record_assignment: bool = False, **ep_options):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        if record_assignment:
            options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        ndp_ep.session_options(options, **ep_options)
        source = model.SerializeToString() if hasattr(model, "SerializeToString") else str(model)
        return ort.InferenceSession(source, options)

    return make
