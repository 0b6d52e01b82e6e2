"""`ndp-ep validate`: the cost model against the H200 measurements shipped in hw_model/calibration, CSV
handling, and the targets on rows held out from those the assumed fixed costs were chosen on."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from hw_model.errors import CalibrationDataError
from hw_model.hardware import load_system
from hw_model.validate import KERNEL_COLUMNS, find_inconsistent, load_measurements, validate
from ndp_ep.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]
CALIBRATION = REPO_ROOT / "hw_model" / "calibration" / "h200"  # shipped with the package: never skipped
KERNEL_CSV = CALIBRATION / "expert_ffn.csv"
TRANSFER_CSV = CALIBRATION / "transfers.csv"

MEDIAN_TARGET = 0.10
MAX_TARGET = 0.35


@pytest.fixture(scope="module")
def h200():
    return load_system("h200")


@pytest.fixture(scope="module")
def shared_report(h200):
    return validate(h200, load_measurements(KERNEL_CSV))


def test_targets_hold_on_rows_the_fixed_costs_were_not_chosen_on(shared_report):
    # kernel_overhead_s (1.5 us) and reduction_latency_s (0.3 us) were chosen to reproduce the 12-19 us floor of
    # small shards; hold out the rows where that fixed part is under a quarter of the prediction (by hand:
    # 4 kernels x 1.5 us + 0.3 us x log2 of the three products' reduction lengths)
    held_out = [
        abs(p.rel_err)
        for p in shared_report.predictions
        if p.row.kind == "shard_graph"
        and not p.inconsistent
        and 4 * 1.5e-6 + 0.3e-6 * (2 * math.log2(p.row.hidden) + math.log2(p.row.ffn // p.row.shards))
        < 0.25 * p.predicted_s
    ]
    assert len(held_out) >= 10
    assert statistics.median(held_out) <= MEDIAN_TARGET
    assert max(held_out) <= MAX_TARGET


def test_shard_graph_rows_meet_the_targets(shared_report):
    stats = shared_report.kinds["shard_graph"]
    assert stats.median_rel_err <= MEDIAN_TARGET
    assert stats.max_rel_err <= MAX_TARGET


def test_targets_are_not_met_by_excluding_rows(shared_report, h200):
    stats = shared_report.kinds["shard_graph"]
    total = sum(1 for p in shared_report.predictions if p.row.kind == "shard_graph")
    assert stats.rows == total - stats.excluded_rows
    assert stats.excluded_rows <= 0.01 * total  # the consistency filter drops at most 1% of the rows
    everything = validate(h200, load_measurements(KERNEL_CSV), exclude_inconsistent=False).kinds["shard_graph"]
    assert everything.rows == total and everything.median_rel_err <= MEDIAN_TARGET


def test_bf16_and_fp32_graph_rows_each_stay_within_the_max_target(shared_report):
    for dtype in ("bf16", "fp32"):
        errors = [
            abs(p.rel_err)
            for p in shared_report.predictions
            if p.row.kind == "shard_graph" and p.row.dtype == dtype and not p.inconsistent
        ]
        assert errors and max(errors) <= MAX_TARGET, dtype


def test_every_kind_is_predicted(shared_report):
    assert set(shared_report.kinds) >= {"shard_graph", "shard_eager", "moe_layer_e8_k2", "moe_layer_e64_k8"}
    for stats in shared_report.kinds.values():
        assert stats.rows > 0 and stats.max_rel_err < 1.0


def test_pinned_transfers_follow_latency_plus_bandwidth(h200):
    report = validate(h200, load_measurements(TRANSFER_CSV))
    for kind in ("transfer_h2d_pinned", "transfer_d2h_pinned"):
        assert report.kinds[kind].median_rel_err <= MEDIAN_TARGET


def test_cli_json_and_plot(tmp_path, capsys):
    plot = tmp_path / "scatter.png"
    code = main(["validate", "--hw", "h200", "--data", str(KERNEL_CSV), "--transfers", str(TRANSFER_CSV),
                 "--plot", str(plot), "--json"])  # fmt: skip
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    graph = document["kinds"]["shard_graph"]
    assert set(graph) >= {"rows", "median_rel_err", "max_rel_err"}
    assert graph["median_rel_err"] <= MEDIAN_TARGET and graph["max_rel_err"] <= MAX_TARGET
    assert "transfer_h2d_pinned" in document["kinds"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["scatter.png"]  # no temporary file left behind


def test_cli_text_report_is_reproducible(capsys):
    assert main(["validate", "--data", str(KERNEL_CSV)]) == 0
    first = capsys.readouterr().out
    assert main(["validate", "--data", str(KERNEL_CSV)]) == 0
    assert capsys.readouterr().out == first
    assert first.splitlines()[2].startswith("shard_graph")


def _write_csv(path: Path, rows: list[dict[str, object]], columns=KERNEL_COLUMNS) -> Path:
    lines = [",".join(columns)] + [",".join(str(row[c]) for c in columns) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _kernel_row(time_us: float, d=1536, f=6144, tokens=3, shards=3, kind="shard_graph", dtype="bf16", spread=0.01):
    return {
        "kind": kind, "dtype": dtype, "d": d, "f": f, "tokens": tokens, "shards": shards,
        "median_us": time_us, "p10_us": time_us * (1 - spread), "p90_us": time_us * (1 + spread),
        "flops": 6 * d * f * tokens // shards, "bytes": 6 * d * f // shards,
    }  # fmt: skip


def test_any_csv_with_the_same_columns_is_accepted_and_predicted_by_hand(tmp_path, h200):
    # d=1536, f=6144, 1 token, 3 shards on the h200 preset, by hand (shard width 2048, bf16, 4.8 TB/s x 0.8805):
    # gate, up: 1.5 us + 0.3 us x log2(1536) + (1536 x 2048 + 1536 + 2048) x 2 B / bandwidth
    # silu_mul: 1.5 us + (3 x 2048) x 2 B / bandwidth;  down: 1.5 us + 0.3 us x 11 + (2048 x 1536 + 2048 + 1536) x 2 B
    bandwidth = 4.8e12 * 0.8805
    weight_s = (1536 * 2048 + 1536 + 2048) * 2 / bandwidth
    expected = (
        2 * (1.5e-6 + 0.3e-6 * math.log2(1536) + weight_s)
        + (1.5e-6 + 3 * 2048 * 2 / bandwidth)
        + (1.5e-6 + 0.3e-6 * 11 + weight_s)
    )
    rows = [_kernel_row(expected * 1e6, 1536, 6144, 1, 3), _kernel_row(2 * expected * 1e6, 2880, 2880, 17, 1)]
    report = validate(h200, load_measurements(_write_csv(tmp_path / "other.csv", rows)))
    assert report.kinds["shard_graph"].rows == 2
    first = next(p for p in report.predictions if p.row.hidden == 1536)
    assert first.rel_err == pytest.approx(0.0, abs=2e-3)  # compute terms are < 0.1 % of this memory-bound shard


def test_a_row_contradicted_by_a_faster_run_with_more_work_is_flagged(tmp_path):
    rows = [
        _kernel_row(40.0, tokens=1),
        _kernel_row(30.0, tokens=32),  # 32x the tokens, measured faster
        _kernel_row(35.0, tokens=64),
        _kernel_row(41.0, tokens=1, shards=1, f=4096),  # another shape: its own group
    ]
    measured = load_measurements(_write_csv(tmp_path / "odd.csv", rows))
    assert find_inconsistent(measured) == {0}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("a,b,c\n1,2,3\n", "neither the kernel columns"),
        (",".join(KERNEL_COLUMNS) + "\n", "no data rows"),
        (",".join(KERNEL_COLUMNS) + "\nshard_magic,bf16,1,1,1,1,1,1,1,1,1\n", "unknown kind 'shard_magic'"),
        (",".join(KERNEL_COLUMNS) + "\nshard_graph,bf15,1,1,1,1,1,1,1,1,1\n", "unknown dtype 'bf15'"),
        (",".join(KERNEL_COLUMNS) + "\nshard_graph,bf16,x,1,1,1,1,1,1,1,1\n", "column 'd' must be an integer"),
        (",".join(KERNEL_COLUMNS) + "\nshard_graph,bf16,8,8,1,1,5,6,7,1,1\n", "p10_us <= median_us <= p90_us"),
        (",".join(KERNEL_COLUMNS) + "\nmoe_layer_e2_k4,bf16,8,8,1,1,5,4,7,1,1\n", "0 < K <= E"),
        ("direction,memory,bytes,median_us,p10_us,p90_us\nsideways,pinned,4096,1,1,1\n", "direction must be"),
    ],
)
def test_bad_csv_raises_a_typed_error_naming_the_problem(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(CalibrationDataError, match=message):
        load_measurements(path)


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n", encoding="utf-8")
    for argv in (
        ["validate", "--data", str(bad)],
        ["validate", "--data", str(tmp_path / "absent.csv")],
        ["validate", "--hw", "no-such-card", "--data", str(bad)],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("ndp-ep validate: error:") and err.count("\n") == 1
    assert main(["validate", "--data", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"ndp-ep validate: error: {tmp_path}: a directory, not a CSV file\n"


def test_cli_plot_into_missing_directory_is_exit_2(tmp_path, h200, capsys):
    good = _write_csv(tmp_path / "good.csv", [_kernel_row(20.0)])
    assert main(["validate", "--data", str(good), "--plot", str(tmp_path / "nope" / "x.png")]) == 2
    assert "does not exist" in capsys.readouterr().err
