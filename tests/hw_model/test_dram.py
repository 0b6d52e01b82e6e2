"""The JEDEC-derived DRAM model: hand-computed figures, and its error on the Ramulator2 rows shipped in
hw_model/calibration/ndp_dram (none of which any constant was chosen on: the model has no fitted constant)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from hw_model.dram import DDR_STANDARDS, get_standard
from hw_model.errors import CalibrationDataError, HardwareConfigError
from hw_model.hardware import load_system, system_from_dict
from hw_model.validate import csv_layout, load_dram_predictions, validate_dram
from ndp_ep.cli import main

DATA = Path(__file__).resolve().parents[2] / "hw_model" / "calibration" / "ndp_dram"
SWEEP = DATA / "size_sweep_raw.csv"
CONTENTION = DATA / "contention.csv"


def test_ddr4_3200_figures_by_hand():
    ddr4 = get_standard("ddr4-3200")
    assert ddr4.rank_peak_bytes_per_s == pytest.approx(3200e6 * 8)
    assert ddr4.streaming_efficiency() == pytest.approx(1 - (550 + 13.75) / 7800)
    assert ddr4.first_access_s == pytest.approx((13.75 + 13.75 + 2.5) * 1e-9)
    # row-sequential: back-to-back reads in one bank group every tCCD_L = 5 ns, a burst takes 2.5 ns
    assert ddr4.streaming_efficiency("row-sequential") == pytest.approx(0.5 * (1 - 563.75 / 7800))


def test_ddr5_figures_by_hand():
    ddr5 = get_standard("DDR5-4800")
    tck = 2000 / 4800
    assert ddr5.rank_peak_bytes_per_s == pytest.approx(38.4e9)
    assert ddr5.first_access_s == pytest.approx((34 + 34 + 8) * tck * 1e-9)
    assert ddr5.streaming_efficiency() == pytest.approx(1 - (295 + 34 * tck) / 3906)
    assert {"DDR4-3200", "DDR5-4800", "DDR5-5600", "DDR5-6400"} <= set(DDR_STANDARDS)
    with pytest.raises(HardwareConfigError, match="unknown DRAM standard"):
        get_standard("DDR6-9000")


def test_presets_derive_the_ndp_dram_side_and_refuse_a_contradicting_bandwidth():
    unit = load_system("paper").ndp_unit
    assert unit.memory_bandwidth_bytes_per_s == pytest.approx(2 * 25.6e9)
    assert unit.kernel_overhead_s == pytest.approx(1e-6 + 30e-9)
    assert unit.host_read_bandwidth_bytes_per_s == pytest.approx(25.6e9 * (1 - 563.75 / 7800))
    assert load_system("paper-ddr5-5600").ndp_unit.memory_bandwidth_bytes_per_s == pytest.approx(2 * 44.8e9)
    data = {
        "gpu": {
            "name": "g",
            "peak_flops_per_s": {"bf16": 1e12},
            "memory_bandwidth_bytes_per_s": 1e11,
            "memory_capacity_bytes": 1e9,
            "kernel_overhead_s": 1e-6,
        },
        "host_link": {"bandwidth_bytes_per_s": 1e10, "latency_s": 1e-6},
        "ndp_link": {"bandwidth_bytes_per_s": 1e10, "latency_s": 1e-6},
        "ndp_unit": {
            "name": "n",
            "dram": "DDR4-3200",
            "peak_flops_per_s": {"bf16": 1e11},
            "memory_capacity_bytes": 1e9,
            "memory_bandwidth_bytes_per_s": 9e9,
        },
    }
    with pytest.raises(HardwareConfigError, match="derived from ndp_unit.dram"):
        system_from_dict(data)


def test_same_rank_contention_splits_one_rank_by_the_request_ratio():
    ddr4 = get_standard("DDR4-3200")
    full = 25.6e9 * (1 - 563.75 / 7800)
    rows = {(p.label.split(": ")[0], p.label.split(": ")[1]): p for p in load_dram_predictions(CONTENTION)}
    one_to_three = [
        p for (label, stream), p in rows.items() if label.startswith("ddr4-3200 MOP4CLXOR both same rank 1:3 per-rank")
    ]
    predicted = sorted(p.predicted for p in one_to_three)
    assert predicted == pytest.approx([full / 4, 3 * full / 4])
    assert ddr4.rank_peak_bytes_per_s * ddr4.streaming_efficiency() == pytest.approx(full)


@pytest.mark.parametrize("standard", ["ddr4-3200", "ddr4-3200-8Gb", "ddr5-4800"])
def test_interleaved_rows_meet_the_goal_on_every_speed_grade(standard):
    # goal of issue 12: median <= 5 %, max <= 15 % on the bank-group-interleaved rows
    predictions = [
        p
        for p in load_dram_predictions(SWEEP) + load_dram_predictions(CONTENTION)
        if "/row-sequential" not in p.kind and p.label.split(" ")[0] == standard
    ]
    assert predictions
    errors = [abs(p.rel_err) for p in predictions]
    assert statistics.median(errors) <= 0.05
    assert max(errors) <= 0.15


def test_validate_recognises_the_dram_csvs_by_columns(capsys):
    assert csv_layout(SWEEP) == "dram_sweep" and csv_layout(CONTENTION) == "dram_contention"
    assert main(["validate", "--data", str(SWEEP), "--data", str(CONTENTION), "--json"]) == 0
    kinds = json.loads(capsys.readouterr().out)["kinds"]
    assert {"rank_ndp", "dimm_ndp_2rank", "channel_host_2rank", "contention"} <= set(kinds)
    assert kinds["rank_ndp"]["rows"] == 45
    report = validate_dram([SWEEP])
    assert report.kinds["rank_ndp"].median_rel_err <= 0.05


def test_validate_without_data_uses_the_shipped_calibration(capsys):
    assert main(["validate", "--json"]) == 0
    kinds = json.loads(capsys.readouterr().out)["kinds"]
    assert "shard_graph" in kinds and "contention" in kinds


def test_a_csv_of_unknown_layout_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    assert main(["validate", "--data", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "matches no known layout" in err and "\n" not in err
    with pytest.raises(CalibrationDataError):
        csv_layout(bad)
