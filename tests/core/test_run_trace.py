"""``ndp-ep run --trace FILE``: the run's simulated timeline as Chrome trace-event JSON."""

from __future__ import annotations

import json

import pytest

from ndp_ep.cli import main


def test_run_trace_spans_the_reported_latency_and_its_gpu_time(samples_dir, tmp_path, capsys):
    trace_path = tmp_path / "run.json"
    code = main(["run", str(samples_dir / "moe_decoder.onnx"), "--seq-len", "4", "--json", "--trace", str(trace_path)])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    trace = json.loads(trace_path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert all({"name", "ts", "dur", "pid", "tid"} <= set(e) for e in spans)
    end_s = max(e["ts"] + e["dur"] for e in spans) / 1e6
    assert end_s == pytest.approx(report["simulated_latency_s"], rel=1e-9)
    layer_spans = [e for e in spans if e["cat"] == "layer"]
    assert [e["args"]["layer_name"] for e in layer_spans] == [layer["layer"] for layer in report["layers"]]
    gpu_s = sum(e["dur"] for e in spans if e["args"].get("resource") == "gpu") / 1e6
    expected_gpu_s = report["non_expert_gpu_s"] + sum(layer["busy_s"].get("gpu", 0.0) for layer in report["layers"])
    assert gpu_s == pytest.approx(expected_gpu_s, rel=1e-9)


def test_run_trace_into_a_missing_directory_is_refused_before_running(samples_dir, tmp_path, capsys):
    trace_path = tmp_path / "deeper" / "run.json"
    assert main(["run", str(samples_dir / "moe_block.onnx"), "--trace", str(trace_path)]) == 2
    err = capsys.readouterr().err
    assert str(trace_path.parent) in err and len(err.strip().splitlines()) == 1
    assert not trace_path.parent.exists()
