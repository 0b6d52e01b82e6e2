"""Energy in a run's report: ``ndp-ep run --json`` (``energy_j``, ``avg_power_w``, per resource, per layer), the
text report's line, and the trace's power counters, which integrate to the report's joules."""

from __future__ import annotations

import json

import pytest

from hw_model.chrome_trace import counter_energy_j
from ndp_ep.cli import main


def test_run_json_carries_energy_per_resource_and_per_layer_and_the_trace_counters_integrate_to_it(
    samples_dir, tmp_path, capsys
):
    trace_path = tmp_path / "run.json"
    code = main(["run", str(samples_dir / "moe_decoder.onnx"), "--seq-len", "4", "--json", "--trace", str(trace_path)])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    energy = report["energy"]
    assert report["energy_j"] == pytest.approx(sum(energy["by_resource_j"].values()))
    assert report["avg_power_w"] == pytest.approx(report["energy_j"] / report["simulated_latency_s"])
    assert energy["elapsed_s"] == pytest.approx(report["simulated_latency_s"])
    assert energy["dominant"] in energy["by_resource_j"]
    layers = report["layers"]
    assert all(layer["energy_j"] > 0 for layer in layers)
    # each layer is priced over its own latency; the run adds the non-expert GPU time at static + memory power
    assert sum(layer["energy_j"] for layer in layers) < report["energy_j"]
    trace = json.loads(trace_path.read_text())
    counters = {e["name"] for e in trace["traceEvents"] if e["ph"] == "C"}
    assert {"gpu power", "pcie power", "ndp0 power"} <= counters
    assert counter_energy_j(trace) == pytest.approx(report["energy_j"], rel=1e-9)


def test_the_text_report_states_energy_and_average_power(samples_dir, capsys):
    assert main(["run", str(samples_dir / "moe_block.onnx")]) == 0
    out = capsys.readouterr().out
    assert "simulated energy" in out and "average power" in out
