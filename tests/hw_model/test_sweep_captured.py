"""Captured routing traces in a sweep's ``traces`` axis (hw_model/sweep/captured.py): points of the trace's own
model, not crossed with ``models``, each replaying the trace under the point's hardware, units and policy."""

from __future__ import annotations

import numpy as np
import pytest

from hw_model.errors import HwModelError
from hw_model.routing_trace import TraceHeader, TraceLayer, from_token_ids
from hw_model.routing_trace_io import save_trace
from hw_model.sweep import SYNTHETIC, SweepGrid, expand, run_point
from hw_model.trace_replay import replay, settings_of_header


def _captured(tmp_path):
    rng = np.random.default_rng(0)
    layers = tuple(TraceLayer(f"moe{i}", num_experts=16, top_k=2, hidden=128, ffn=256) for i in range(2))
    header = TraceHeader(
        layers=layers, prompt_tokens=6, new_tokens=5, settings={"hw": "paper", "policy": "tp+lb+prefetch"},
        source="ndp-ep run /models/tiny.onnx",
    )  # fmt: skip
    ids = np.stack([np.stack([rng.choice(16, 2, replace=False) for _ in range(11)]) for _ in range(2)])
    return save_trace(from_token_ids(header, ids), tmp_path / "tiny.npz"), header


def test_captured_trace_points_are_its_own_model_and_replay_it(tmp_path):
    path, _ = _captured(tmp_path)
    grid = SweepGrid(
        models=("olmoe-1b-7b",), ndp_units=(2, 4), policies=("monde", "tp+lb+prefetch"),
        traces=(SYNTHETIC, str(path)), prompt_tokens=8, generated_tokens=4,
    )  # fmt: skip
    points = expand(grid)
    captured = [p for p in points if p.trace == str(path)]
    assert len(points) == 2 * 2 * 2 and len(captured) == 4  # olmoe x synthetic, then the trace's own 4
    assert {p.model for p in captured} == {"tiny"} and {p.skew_level for p in captured} == {"captured"}
    from hw_model.routing_trace_io import load_captured

    trace = load_captured(path)
    for point in captured:
        record = run_point(point)
        settings = settings_of_header(
            trace.header.settings,
            ndp_units=point.ndp_units,
            policy=point.policy,
            residency_fraction=point.residency_fraction,  # the grid's default: 1.0
        )
        expected = replay(trace, settings)
        assert "error" not in record and record["latency_s"] == expected.total_s


def test_a_foreign_npz_in_traces_is_refused_when_the_grid_is_built(tmp_path):
    path, _ = _captured(tmp_path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(HwModelError, match="truncated or corrupt"):
        SweepGrid(models=("olmoe-1b-7b",), traces=(str(path),))
