"""The DRAM energy model against DRAMPower's own figures (hw_model/calibration/dram_energy, shipped with the package,
so never skipped): the current method with DRAMPower's command counts, and with the commands derived from bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hw_model.validate import validate_dram
from ndp_ep.cli import main

STREAMS = Path(__file__).resolve().parents[2] / "hw_model" / "calibration" / "dram_energy" / "streams.csv"


def test_the_current_method_reproduces_drampower_on_every_stream():
    report = validate_dram([STREAMS])
    rows = [p for p in report.predictions if p.kind == "dram_energy"]
    assert len(rows) == 14  # 7 streams x (DDR4 datasheet memspec, DDR5 constructed memspec)
    assert max(abs(p.rel_err) for p in rows) < 1e-6


def test_commands_derived_from_bytes_stay_within_two_percent_of_drampower():
    report = validate_dram([STREAMS])
    rows = [p for p in report.predictions if p.kind == "dram_energy/from bytes"]
    assert {p.label.split()[1][:1] for p in rows} == {"a", "c", "d", "f", "g"}
    assert max(abs(p.rel_err) for p in rows) < 0.02


def test_validate_reads_the_energy_rows_by_default(capsys):
    assert main(["validate", "--json"]) == 0
    kinds = json.loads(capsys.readouterr().out)["kinds"]
    assert kinds["dram_energy"]["rows"] == 14 and kinds["dram_energy"]["max_rel_err"] < 1e-6


def test_a_stream_naming_a_missing_memspec_is_one_line(tmp_path, capsys):
    bad = tmp_path / "streams.csv"
    text = STREAMS.read_text(encoding="utf-8").replace("MICRON_8Gb_DDR4-3200_8bit_G.json", "absent.json")
    bad.write_text(text, encoding="utf-8")
    assert main(["validate", "--data", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "absent.json" in err and err.count("\n") == 1


@pytest.mark.parametrize("column", ["n_rd", "E_total_pJ"])
def test_a_non_numeric_column_is_named(tmp_path, capsys, column):
    import csv

    rows = list(csv.DictReader(STREAMS.open(encoding="utf-8")))
    rows[0][column] = "many"
    bad_dir = tmp_path / "cal"
    (bad_dir / "memspecs").mkdir(parents=True)
    for spec in (STREAMS.parent / "memspecs").glob("*.json"):
        (bad_dir / "memspecs" / spec.name).write_text(spec.read_text(encoding="utf-8"), encoding="utf-8")
    bad = bad_dir / "streams.csv"
    with bad.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert main(["validate", "--data", str(bad)]) == 2
    assert f"column '{column}' must be a number" in capsys.readouterr().err
