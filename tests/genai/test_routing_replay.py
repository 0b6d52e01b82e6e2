"""Issue 30's acceptance: a GenAI fixture generated with --save-routing, benched from its own trace at 2/4/6 NDP
units with every policy; the run's own policy and hardware replay to the generate report's total exactly; and
``bench --model-from`` on Qwen3.5-MoE / LFM2 fixtures (converted and not) prints the main table."""

from __future__ import annotations

import json

import pytest

from hw_model.policies import POLICIES
from hw_model.routing_trace_io import load_captured
from hw_model.trace_replay import replay
from ndp_ep.cli import main

from .conftest import GENAI_DIR

pytest.importorskip("onnxruntime_genai")


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """``ndp-ep generate qwen3_5_moe_int4 --save-routing`` (its folder converted in memory): the trace and report."""
    path = tmp_path_factory.mktemp("routing") / "qwen.npz"
    folder = GENAI_DIR / "qwen3_5_moe_int4"
    args = ["generate", str(folder), "--prompt-tokens", "16", "--new-tokens", "8", "--no-check", "--json"]
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*args, "--save-routing", str(path)]) == 0
    return path, json.loads(out.getvalue())


def test_generate_trace_replays_to_the_generate_total_exactly(captured):
    path, result = captured
    trace = load_captured(path)
    assert (trace.header.prompt_tokens, trace.header.new_tokens) == (16, 8)
    assert trace.num_steps == 1 + result["decode_steps"]
    replayed = replay(trace)
    assert replayed.total_s == result["simulated_total_s"]  # to the bit
    assert list(replayed.step_s[1:]) == result["decode_s_per_token"]


def test_bench_on_the_captured_trace_prints_every_policy_at_2_4_6_units(captured, capsys):
    path, result = captured
    assert main(["bench", "--trace", str(path), "--ndp-units", "2,4,6", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| model | NDP |"))
    assert all(f" {policy} |" in header for policy in POLICIES)
    rows = [line for line in out.splitlines() if line.startswith("| qwen3_5_moe_int4 |")]
    assert [row.split("|")[2].strip() for row in rows] == ["2", "4", "6"]
    assert main(["bench", "--trace", str(path), "--ndp-units", "4", "--policies", result["policy"], "--json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert result["ndp_units"] == 4 and record["latency_s"] == result["simulated_total_s"]


@pytest.mark.parametrize("fixture", ["lfm2_moe_int4", "qwen3_5_moe_fp32"])
def test_bench_model_from_an_unconverted_fixture_prints_its_main_table(fixture, capsys):
    model = GENAI_DIR / fixture / "model.onnx"
    assert main(["bench", "--model-from", str(model), "--quick", "--ndp-units", "2,4", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(f"| {fixture} |")]
    assert len(rows) == 2 and "synthetic routing, Zipf skew" in out


def test_bench_model_from_a_converted_model(tmp_path, capsys):
    import ndp_ep

    converted = tmp_path / "lfm2.onnx"
    ndp_ep.convert_model(GENAI_DIR / "lfm2_moe_fp32" / "model.onnx", converted)
    assert main(["bench", "--model-from", str(converted), "--quick", "--ndp-units", "4", "--json", "--jobs", "1"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert {r["policy"] for r in records} == set(POLICIES) and all(r["model"] == "lfm2" for r in records)
    assert all(r["steps"] == 1 + 8 for r in records)  # --quick: a 32-token prefill, then 8 decode steps
