"""ndp_ep/profiling.py: a profiled session's ONNX Runtime profile also holds each run's simulated tracks, placed at
that run's measured start, spanning its simulated latency."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import ndp_ep
from ndp_ep.profiling import SIMULATED_PID_BASE, add_simulated_tracks


def _profiled(tmp_path):
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    return options


def _check(events, reports):
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    simulated = [e for e in events if e.get("pid", 0) >= SIMULATED_PID_BASE and e.get("ph") == "X"]
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name" and e["pid"] >= SIMULATED_PID_BASE}
    assert {"simulated: GPU", "simulated: NDP", "simulated: MoE layers"} <= names
    assert len(runs) == len(reports)
    for run, report in zip(runs, reports, strict=True):
        mine = [e for e in simulated if e["args"]["ort_run_ts"] == run["ts"]]
        end_us = max(e["ts"] + e["dur"] for e in mine) - run["ts"]
        assert end_us == pytest.approx(report.simulated_latency_s * 1e6, rel=1e-9)
        assert min(e["ts"] for e in mine) == pytest.approx(run["ts"])


def test_inference_session_end_profiling_adds_the_simulated_tracks(samples_dir, tmp_path):
    sess = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx", _profiled(tmp_path))
    for tokens in (5, 1, 1):
        sess.run(None, {"input_ids": np.arange(tokens, dtype=np.int64)[None]})
    path = sess.end_profiling()
    _check(json.loads(Path(path).read_text()), sess.reports)


def test_plain_session_profile_gets_the_tracks_on_request(samples_dir, tmp_path):
    converted = tmp_path / "m.onnx"
    ndp_ep.convert_model(samples_dir / "moe_decoder.onnx", converted)
    ndp_ep.register()
    options = ndp_ep.session_options(hw="paper", ndp_units=2)
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "plain")
    sess = ort.InferenceSession(str(converted), options)
    sess.run(None, {"input_ids": np.arange(3, dtype=np.int64)[None]})
    path = add_simulated_tracks(sess.end_profiling(), sess)
    _check(json.loads(path.read_text()), [ndp_ep.last_report(sess)])


def test_not_a_profile_is_one_typed_line(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("{}")
    with pytest.raises(ndp_ep.NdpEpError, match="not an ONNX Runtime profile"):
        add_simulated_tracks(path, [])
