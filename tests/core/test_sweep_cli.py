"""``ndp-ep sweep GRID.toml``: files written, JSON on stdout, one-line errors."""

from __future__ import annotations

import builtins
import json

import pytest

from ndp_ep.cli import main

GRID = """
models = ["olmoe-1b-7b"]
ndp_units = [2, 4]
policies = ["monde", "tp+lb+prefetch"]
prompt_tokens = 8
generated_tokens = 4
[hardware.gpu]
memory_capacity_bytes = [4e9, 16e9]
"""


def test_sweep_json_output_matches_the_files_written(tmp_path, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    out = tmp_path / "out"
    assert main(["sweep", str(grid), "--out", str(out), "--jobs", "1", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["points"] == 8 and payload["failed"] == 0
    on_disk = json.loads((out / "sweep.json").read_text())
    assert on_disk == payload["records"]
    assert [r["point"] for r in on_disk] == list(range(8))
    assert {f["axis"] for f in payload["pareto"]} == {"ndp_units", "hw.gpu.memory_capacity_bytes", "energy_j"}
    assert json.loads((out / "pareto.json").read_text()) == payload["pareto"]
    # monde rows are their own baseline
    assert all(r["speedup_vs_baseline"] == 1.0 for r in on_disk if r["policy"] == "monde")


def test_a_point_whose_experts_do_not_fit_is_not_on_the_pareto_front(tmp_path, capsys):
    grid = tmp_path / "grid.toml"  # mixtral's experts need more than two 32 GB DIMMs hold, not more than four
    grid.write_text(
        'models = ["mixtral-8x7b"]\nndp_units = [2, 4]\npolicies = ["tp+lb+prefetch"]\n'
        "prompt_tokens = 8\ngenerated_tokens = 4\n"
    )
    out = tmp_path / "out"
    assert main(["sweep", str(grid), "--out", str(out), "--jobs", "1", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [(r["ndp_units"], r["feasible"]) for r in payload["records"]] == [(2, False), (4, True)]
    assert (payload["failed"], payload["infeasible"]) == (0, 1)
    front, energy = payload["pareto"]  # latency vs NDP units, then vs energy
    assert (front["axis"], energy["axis"]) == ("ndp_units", "energy_j")
    assert [r["ndp_units"] for r in front["front"]] == [4] == [r["ndp_units"] for r in energy["front"]]
    assert json.loads((out / "pareto.json").read_text()) == payload["pareto"]
    assert main(["sweep", str(grid), "--out", str(out), "--jobs", "1"]) == 0
    text = capsys.readouterr().out
    assert "  ndp_units=4: " in text and "  ndp_units=2: " not in text
    assert "2 points (0 failed, 1 whose experts do not fit: left out of the Pareto fronts)" in text


def test_without_out_nothing_is_written_and_the_json_goes_to_stdout(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grid.toml").write_text('models = ["olmoe-1b-7b"]\nprompt_tokens = 8\ngenerated_tokens = 4\n')
    assert main(["sweep", "grid.toml", "--jobs", "1", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["points"] == 1 and payload["files"] == []
    assert main(["sweep", "grid.toml", "--jobs", "1"]) == 0
    assert "1 point (0 failed, 0 whose experts do not fit" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["grid.toml"]


def test_an_output_that_would_overwrite_an_input_is_refused_before_running(tmp_path, capsys):
    from hw_model.hardware import PRESET_DIR

    out = tmp_path / "od"
    out.mkdir()
    grid = out / "sweep.json"  # the grid itself, named as the table the sweep writes
    grid.write_text('models = ["olmoe-1b-7b"]\nprompt_tokens = 8\ngenerated_tokens = 4\n')
    hardware = out / "pareto.json"  # a hardware file of the grid, named as the fronts the sweep writes
    hardware.write_text((PRESET_DIR / "paper.toml").read_text())
    other = tmp_path / "grid.toml"
    other.write_text('models = ["olmoe-1b-7b"]\nhw = ["od/pareto.json"]\nprompt_tokens = 8\ngenerated_tokens = 4\n')
    before = {p: p.read_bytes() for p in (grid, hardware, other)}
    for grid_file, overwritten in ((grid, grid), (other, hardware)):
        assert main(["sweep", str(grid_file), "--out", str(out), "--jobs", "1"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            f"ndp-ep sweep: error: output {overwritten} would overwrite the input {overwritten}; write it elsewhere"
        ]
    assert {p: p.read_bytes() for p in before} == before
    assert sorted(p.name for p in out.iterdir()) == ["pareto.json", "sweep.json"]


def test_sweep_parquet_holds_the_same_table(tmp_path, capsys):
    pq = pytest.importorskip("pyarrow.parquet")
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    assert main(["sweep", str(grid), "--out", str(tmp_path), "--jobs", "1"]) == 0
    text = capsys.readouterr().out
    assert "8 points (0 failed, 0 whose experts do not fit" in text and "Pareto front of olmoe-1b-7b" in text
    assert "  gpu.memory_capacity_bytes=4G: " in text and "  gpu.memory_capacity_bytes=16G: " in text
    table = pq.read_table(tmp_path / "sweep.parquet").to_pylist()
    assert table == json.loads((tmp_path / "sweep.json").read_text())


def test_bad_grid_is_one_line_and_exit_2(tmp_path, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text('models = ["olmoe-1b-7b"]\npolicies = ["warp-drive"]\n')
    assert main(["sweep", str(grid), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ndp-ep sweep: error:") and "warp-drive" in err[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("ndp_units = [1000000000]", "ndp_units: expected integers from 0 to 64, got 1000000000"),
        ("prompt_tokens = 1000000000", "prompt_tokens must be a positive integer of at most 65,536"),
        ("seeds = [-1]", "seeds: expected non-negative integers, got -1"),
    ],
)
def test_grid_values_that_would_exhaust_memory_or_crash_numpy_are_one_line_and_exit_2(tmp_path, capsys, line, named):
    grid = tmp_path / "grid.toml"
    grid.write_text(f'models = ["olmoe-1b-7b"]\n{line}\n')
    assert main(["sweep", str(grid), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ndp-ep sweep: error: ") and named in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.toml"]


def test_ray_requested_but_not_installed_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    assert main(["sweep", str(grid), "--out", str(tmp_path / "o"), "--ray"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("ndp-ep sweep: error:") and "ray" in err[-1]


def test_out_that_is_a_file_is_refused_before_running(tmp_path, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    (tmp_path / "taken").write_text("")
    assert main(["sweep", str(grid), "--out", str(tmp_path / "taken")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_an_unreachable_ray_address_is_one_line_and_exit_2(tmp_path, capsys):
    pytest.importorskip("ray")
    import socket

    with socket.socket() as probe:  # a port nobody listens on: bind, read the port, close
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    assert main(["sweep", str(grid), "--out", str(tmp_path / "o"), "--ray", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("ndp-ep sweep: error: cannot reach a Ray cluster at 127.0.0.1:")
