"""`ndp-ep bench`: the table's records, determinism, and the CLI (quick runs only)."""

from __future__ import annotations

import json

import pytest

from hw_model.bench import BenchConfig, quick_config, run_bench
from hw_model.bench_tables import format_table
from hw_model.policies import POLICIES, policy_names

BASELINES = policy_names("baseline")

REQUIRED = {"model", "ndp_units", "policy", "latency_s", "speedup_vs_monde"}


def _quick(**kw) -> BenchConfig:
    return quick_config(BenchConfig(models=("olmoe-1b-7b",), ndp_units=(2, 4), gantt=False, **kw))


def test_quick_bench_records_are_complete_and_deterministic():
    records, _ = run_bench(_quick())
    again, _ = run_bench(_quick())
    assert [r["latency_s"] for r in records] == [r["latency_s"] for r in again]
    assert len(records) == 2 * len(POLICIES)
    for r in records:
        assert set(r) >= REQUIRED
        assert r["latency_s"] > 0
    by = {(r["ndp_units"], r["policy"]): r for r in records}
    for units in (2, 4):
        assert by[(units, "monde")]["speedup_vs_monde"] == pytest.approx(1.0)
        assert all(by[(units, "lower-bound")]["latency_s"] <= by[(units, p)]["latency_s"] for p in POLICIES)
    assert "tp+lb+prefetch over monde" in format_table(records)
    assert all(r["best_baseline"] in BASELINES for r in records)


def test_cli_quick_run_writes_json_and_plots(cli, tmp_path):
    out = tmp_path / "out"
    table = tmp_path / "table.json"
    proc = cli(
        "bench",
        "--quick",
        "--models",
        "olmoe-1b-7b",
        "--ndp-units",
        "2",
        "--jobs",
        "1",
        "--out",
        str(out),
        "--json-out",
        str(table),
        "--trace-dir",
        str(tmp_path / "traces"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "over the strongest baseline" in proc.stdout
    records = json.loads(table.read_text())
    assert {r["policy"] for r in records} == set(POLICIES)
    assert all(set(r) >= REQUIRED for r in records)
    assert sorted((tmp_path / "traces").glob("trace_olmoe-1b-7b_*.json"))  # --trace-dir: Chrome traces
    pytest.importorskip("matplotlib")
    assert (out / "latency_bars.png").stat().st_size > 0
    assert (out / "utilisation.png").is_file()
    assert (out / "gantt_olmoe-1b-7b.png").is_file()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--hw", "no-such-preset"], "unknown hardware"),
        (["--models", "gpt-5"], "unknown model"),
        (["--policies", "fastest"], "unknown policy"),
        (["--skew", "extreme"], "--skew"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(cli, tmp_path, args, message):
    proc = cli("bench", "--quick", "--out", str(tmp_path), *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_json_goes_to_stdout_and_nothing_is_written_unasked(cli, tmp_path):
    proc = cli("bench", "--quick", "--models", "olmoe-1b-7b", "--ndp-units", "2", "--jobs", "1", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert {r["policy"] for r in json.loads(proc.stdout)} == set(POLICIES)
    assert list(tmp_path.iterdir()) == []


def test_cli_runs_from_a_trace_file_and_rejects_a_mismatched_one(cli, tmp_path):
    from hw_model.traces import TraceKnobs, synthetic_trace

    trace = tmp_path / "olmoe.npz"
    synthetic_trace(16, 64, 8, 16, 4, TraceKnobs(skew=0.5)).save(trace)
    args = ["bench", "--no-sweeps", "--no-plots", "--ndp-units", "2", "--jobs", "1", "--out", str(tmp_path)]
    proc = cli(*args, "--models", "olmoe-1b-7b", "--trace", str(trace), "--json-out", str(tmp_path / "t.json"))
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads((tmp_path / "t.json").read_text())) == len(POLICIES)
    proc = cli(*args, "--models", "mixtral-8x7b", "--trace", str(trace))
    assert proc.returncode == 2
    assert "trace has 64 experts" in proc.stderr


def test_cli_bad_hardware_file_names_the_field(cli, tmp_path):
    from hw_model.hardware import PRESET_DIR

    text = (
        (PRESET_DIR / "paper.toml")
        .read_text()
        .replace("memory_bandwidth_bytes_per_s = 960e9", "memory_bandwidth_bytes_per_s = -1")
    )
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    proc = cli("bench", "--quick", "--hw", str(bad), "--out", str(tmp_path))
    assert proc.returncode == 2
    assert "gpu.memory_bandwidth_bytes_per_s" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("value", "shown"),
    [("1000000000", "got 1,000,000,000"), ("65", "got 65"), ("0", "got 0"), ("2,65", "got 65"), ("2,x", "got 'x'")],
)
def test_each_ndp_unit_count_is_refused_outside_1_to_64_like_every_ndp_units_option(tmp_path, capsys, value, shown):
    from ndp_ep.cli import main

    assert main(["bench", "--quick", "--ndp-units", value, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ndp-ep bench: error: argument --ndp-units: expected an integer from 1 to 64, {shown}"]
    assert list(tmp_path.iterdir()) == []


def test_a_sessions_first_request_costs_what_a_lone_request_does_and_the_next_one_starts_warm():
    from hw_model.bench import Job, _trace_for, request_latencies_s, run_job
    from hw_model.models import get_model
    from hw_model.settings import DEFAULT_POLICY, SimulationSettings
    from hw_model.traces import skew_for

    config = BenchConfig(models=("olmoe-1b-7b",), prompt_tokens=32, generated_tokens=32, sweeps=False, gantt=False)
    model = get_model("olmoe-1b-7b")
    job = Job(model, SimulationSettings(ndp_units=4, policy=DEFAULT_POLICY), "typical", skew_for(model.name, "typical"))
    trace = _trace_for(job, config, {})
    alone = run_job(job, config, {}).record["latency_s"]
    first, second = request_latencies_s(job, config, [trace, trace])
    assert first == pytest.approx(alone, rel=1e-12)
    # the pool the first request filled is still there: OLMoE's 64 experts per layer all fit it, so the repeat
    # runs its experts from the GPU instead of copying or streaming them from the DIMMs again
    assert second < 0.9 * first


def test_request_latencies_need_a_request():
    from hw_model.bench import Job, request_latencies_s
    from hw_model.errors import WorkloadError
    from hw_model.models import get_model
    from hw_model.settings import SimulationSettings

    job = Job(get_model("olmoe-1b-7b"), SimulationSettings(ndp_units=4), "typical", 1.0)
    with pytest.raises(WorkloadError, match="at least one trace"):
        request_latencies_s(job, BenchConfig(sweeps=False, gantt=False), [])
