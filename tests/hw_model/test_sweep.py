"""Design-space sweeps: grid expansion, hardware axes, backends giving identical tables, Pareto fronts, errors."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

from hw_model.bench import BenchConfig, Job, run_job
from hw_model.errors import HwModelError
from hw_model.hardware import PRESET_DIR, list_presets, system_from_dict
from hw_model.models import get_model
from hw_model.settings import SimulationSettings
from hw_model.sweep import (
    SweepGridError,
    add_speedups,
    comparable_records,
    configurations,
    dump_toml,
    expand,
    grid_from_dict,
    load_grid,
    pareto_front,
    pareto_fronts,
    run_point,
    run_sweep,
    shippable_hw_model,
)
from hw_model.traces import RoutingTrace, skew_for

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY = {"prompt_tokens": 8, "generated_tokens": 4}


def _tiny_grid(**overrides):
    data = {"models": ["olmoe-1b-7b"], "ndp_units": [2, 4], "policies": ["monde", "tp+lb+prefetch"], **TINY}
    data.update(overrides)
    return grid_from_dict(data)


def test_expand_gives_every_combination_once_in_a_fixed_order():
    grid = grid_from_dict(
        {
            "models": ["olmoe-1b-7b", "mixtral-8x7b"],
            "ndp_units": [2, 6],
            "policies": ["monde", "tp"],
            "skew": ["high", 1.25],
            "seeds": [0, 7],
            **TINY,
        }
    )
    points = expand(grid)
    assert [p.index for p in points] == list(range(32))
    got = [(p.model, p.ndp_units, p.skew_level, p.seed, p.policy) for p in points]
    wanted = list(itertools.product(["olmoe-1b-7b", "mixtral-8x7b"], [2, 6], ["high", "1.25"], [0, 7], ["monde", "tp"]))
    assert got == wanted
    by_level = {(p.model, p.skew_level): p.skew for p in points}
    assert by_level[("mixtral-8x7b", "high")] == skew_for("mixtral-8x7b", "high")
    assert by_level[("olmoe-1b-7b", "1.25")] == 1.25


def test_a_trace_file_is_one_point_per_other_combination(tmp_path):
    model = get_model("olmoe-1b-7b")
    rng = np.random.default_rng(0)
    ids = np.stack(
        [
            np.stack([rng.choice(model.num_experts, model.top_k, replace=False) for _ in range(6)])
            for _ in range(model.moe_layers)
        ]
    )
    RoutingTrace(ids, model.num_experts, prompt_tokens=4).save(tmp_path / "t.npz")
    grid = grid_from_dict(
        {
            "models": [model.name],
            "traces": ["synthetic", "t.npz"],
            "skew": ["low", "high"],
            "seeds": [0, 1],
            "policies": ["tp"],
            **TINY,
        },
        base_dir=tmp_path,
    )
    points = expand(grid)
    assert [(p.trace.endswith("t.npz"), p.skew_level) for p in points] == [
        (False, "low"),
        (False, "low"),
        (False, "high"),
        (False, "high"),
        (True, "trace"),
    ]
    record = run_point(points[-1])
    assert record.get("error") is None and record["latency_s"] > 0


def test_dump_toml_round_trips_every_hardware_preset():
    for name in list_presets():
        data = tomllib.loads((PRESET_DIR / f"{name}.toml").read_text())
        assert tomllib.loads(dump_toml(data)) == data


def test_dump_toml_refuses_a_value_toml_has_no_type_for_with_the_sweeps_error():
    with pytest.raises(SweepGridError, match="cannot write as TOML"):
        dump_toml({"gpu": {"name": object()}})


def test_a_hardware_axis_point_equals_a_hand_edited_preset_file(tmp_path):
    grid = _tiny_grid(ndp_units=[4], policies=["monde"], hardware={"ndp_unit": {"ranks": [1]}})
    (point,) = expand(grid)
    assert system_from_dict(tomllib.loads(point.hw_toml)).ndp_unit.ranks == 1
    # the same system written by hand: the paper preset with its NDP rank count replaced
    text = (PRESET_DIR / "paper.toml").read_text()
    assert text.count("\nranks = 2\n") == 1
    (tmp_path / "edited.toml").write_text(text.replace("\nranks = 2\n", "\nranks = 1\n"))
    model = get_model("olmoe-1b-7b")
    config = BenchConfig(hw=str(tmp_path / "edited.toml"), ndp_units=(4,), models=(model.name,), **TINY)
    settings = SimulationSettings(hw=config.hw, ndp_units=4, policy="monde")
    expected = run_job(Job(model, settings, "typical", skew_for(model.name, "typical")), config).record
    record = run_point(point)
    assert record["hw.ndp_unit.ranks"] == 1
    assert record["latency_s"] == expected["latency_s"]
    assert record["decode_s"] == expected["decode_s"]


def test_serial_and_process_pool_give_identical_tables():
    grid = _tiny_grid(seeds=[0, 1])
    serial = run_sweep(grid, jobs=1)
    pooled = run_sweep(grid, jobs=2)
    assert (serial.backend, pooled.backend) == ("serial", "local")
    assert [r["point"] for r in pooled.records] == list(range(8))
    assert comparable_records(serial.records) == comparable_records(pooled.records)
    assert serial.fronts == pooled.fronts


def test_ray_and_local_pool_give_identical_tables():
    ray = pytest.importorskip("ray")
    grid = _tiny_grid(ndp_units=[2], seeds=[0, 3])
    local = run_sweep(grid, jobs=2)
    on_ray = run_sweep(grid, jobs=2, backend="ray")
    assert on_ray.backend == "ray"
    assert not ray.is_initialized()  # the sweep shut down the Ray instance it started
    assert comparable_records(local.records) == comparable_records(on_ray.records)
    assert len(on_ray.records) == 4 and all(r["latency_s"] > 0 for r in on_ray.records)


def test_a_cluster_is_shipped_hw_models_pure_python_sources_not_this_machines_compiled_modules(tmp_path):
    from importlib.machinery import EXTENSION_SUFFIXES

    source = Path(__file__).resolve().parents[2] / "hw_model"
    assert shippable_hw_model(source, tmp_path / "unused") == source  # the source tree: shipped as it is
    installed = tmp_path / "site" / "hw_model"  # an installed package with a compiled module
    (installed / "presets").mkdir(parents=True)
    (installed / "__pycache__").mkdir()
    for name, text in [("__init__.py", ""), ("simulator.py", "x = 1\n"), ("presets/paper.toml", "[gpu]\n")]:
        (installed / name).write_text(text)
    (installed / f"simulator{EXTENSION_SUFFIXES[0]}").write_bytes(b"\x7fELF")
    (installed / "__pycache__" / "simulator.cpython-311.pyc").write_bytes(b"")
    shipped = shippable_hw_model(installed, tmp_path / "staging")
    assert shipped == tmp_path / "staging" / "hw_model"
    files = sorted(str(p.relative_to(shipped)) for p in shipped.rglob("*") if p.is_file())
    assert files == ["__init__.py", "presets/paper.toml", "simulator.py"]
    assert (installed / f"simulator{EXTENSION_SUFFIXES[0]}").exists()  # the installed package is left as it is


def test_comparable_records_drop_only_wall_time_columns():
    records = [{"point": 0, "latency_s": 1.0, "sim_wall_s": 0.3, "decision_time_median_s": 1e-5, "decode_s": 0.5}]
    assert comparable_records(records) == [{"point": 0, "latency_s": 1.0, "decode_s": 0.5}]


def test_pareto_front_keeps_only_undominated_rows():
    rows = [
        {"x": 1, "latency_s": 5.0, "id": "a"},
        {"x": 1, "latency_s": 4.0, "id": "b"},
        {"x": 2, "latency_s": 4.0, "id": "c"},  # dominated by b (same latency, more resource)
        {"x": 2, "latency_s": 3.0, "id": "d"},
        {"x": 3, "latency_s": 3.5, "id": "e"},  # dominated by d
        {"x": 4, "latency_s": 1.0, "id": "f"},
        {"x": 4, "latency_s": 1.0, "id": "g"},  # a tie: the first one is kept
        {"x": None, "latency_s": 0.1, "id": "h"},  # no coordinate on this axis
    ]
    assert [r["id"] for r in pareto_front(rows, "x")] == ["b", "d", "f"]


def test_configurations_average_latency_over_seeds():
    base = {"model": "m", "trace": "synthetic", "skew_level": "typical", "hw": "paper", "residency_fraction": 1.0}
    records = [
        {**base, "point": 0, "ndp_units": 2, "policy": "tp", "seed": 0, "latency_s": 1.0},
        {**base, "point": 1, "ndp_units": 2, "policy": "tp", "seed": 1, "latency_s": 3.0},
        {**base, "point": 2, "ndp_units": 4, "policy": "tp", "seed": 0, "latency_s": 5.0},
        {**base, "point": 3, "ndp_units": 4, "policy": "tp", "seed": 1, "latency_s": None, "error": "x"},
    ]
    rows = configurations(records)
    assert [(r["ndp_units"], r["latency_s"], r["seeds"], r["points"]) for r in rows] == [
        (2, 2.0, 2, [0, 1]),
        (4, 5.0, 1, [2]),
    ]


def test_infeasible_configurations_are_left_out_of_the_rows_and_the_pareto_front():
    base = {"model": "m", "trace": "synthetic", "skew_level": "typical", "hw": "paper", "residency_fraction": 1.0}
    records = [  # 2 units: the fastest, but the experts do not fit (one seed says so: the whole row goes)
        {**base, "point": 0, "ndp_units": 2, "policy": "tp", "seed": 0, "latency_s": 0.5, "feasible": False},
        {**base, "point": 1, "ndp_units": 2, "policy": "tp", "seed": 1, "latency_s": 0.5, "feasible": True},
        {**base, "point": 2, "ndp_units": 4, "policy": "tp", "seed": 0, "latency_s": 2.0, "feasible": True},
        {**base, "point": 3, "ndp_units": 4, "policy": "tp", "seed": 1, "latency_s": 2.0, "feasible": True},
        {**base, "point": 4, "ndp_units": 6, "policy": "tp", "seed": 0, "latency_s": 1.0, "feasible": True},
        {**base, "point": 5, "ndp_units": 6, "policy": "tp", "seed": 1, "latency_s": 1.0, "feasible": True},
    ]
    assert [r["ndp_units"] for r in configurations(records)] == [4, 6]
    (front,) = pareto_fronts(records, ["ndp_units"])
    assert [(r["ndp_units"], r["latency_s"]) for r in front["front"]] == [(4, 2.0), (6, 1.0)]
    nothing_fits = [{**r, "feasible": False} for r in records]
    assert configurations(nothing_fits) == []
    assert [f["front"] for f in pareto_fronts(nothing_fits, ["ndp_units"])] == [[]]


def test_speedup_is_the_baseline_latency_at_the_same_coordinates_over_this_one():
    base = {"model": "m", "hw": "paper", "skew_level": "typical", "skew": 1.0, "trace": "synthetic", "seed": 0}
    records = [
        {**base, "point": 0, "ndp_units": 2, "residency_fraction": 1.0, "policy": "monde", "latency_s": 6.0},
        {**base, "point": 1, "ndp_units": 2, "residency_fraction": 1.0, "policy": "tp", "latency_s": 2.0},
        {**base, "point": 2, "ndp_units": 4, "residency_fraction": 1.0, "policy": "monde", "latency_s": 4.0},
        {**base, "point": 3, "ndp_units": 4, "residency_fraction": 1.0, "policy": "tp", "latency_s": 1.0},
        {**base, "point": 4, "ndp_units": 8, "residency_fraction": 1.0, "policy": "tp", "latency_s": 1.0},
    ]
    add_speedups(records, "monde")
    assert [r["speedup_vs_baseline"] for r in records] == [1.0, 3.0, 1.0, 4.0, None]


def test_a_point_the_simulator_rejects_is_recorded_with_its_error():
    result = run_sweep(_tiny_grid(ndp_units=[0, 2], policies=["monde"]))
    failed, ok = result.records
    assert failed["ndp_units"] == 0 and failed["latency_s"] is None and "NDP unit" in failed["error"]
    assert ok.get("error") is None and ok["latency_s"] > 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colour": "red"}, "unknown grid key 'colour'"),
        ({"models": ["gpt-5"]}, "unknown model"),
        ({"policies": ["fastest"]}, "unknown policy"),
        ({"skew": ["extreme"]}, "neither a level"),
        ({"ndp_units": [2, 2]}, "repeated values"),
        ({"seeds": []}, "at least one value"),
        ({"baseline": "tp"}, "baseline 'tp' is not one of"),
        ({"traces": ["missing.npz"]}, "no such trace file"),
        ({"hardware": {"gpu": {"colour": [1.0]}}}, "unknown field"),
        ({"hardware": {"gpu": {"memory_capacity_bytes": [-1.0]}}}, "must be a positive number"),
        ({"hardware": {"tpu": {"memory_capacity_bytes": [1.0]}}}, "no [tpu] table"),
        ({"prompt_tokens": 0}, "positive integer"),
        ({"ndp_units": [2, 1000000000]}, "ndp_units: expected integers from 0 to 64, got 1000000000"),
        ({"ndp_units": [65]}, "ndp_units: expected integers from 0 to 64, got 65"),
        ({"ndp_units": [-1]}, "ndp_units: expected integers from 0 to 64, got -1"),
        ({"prompt_tokens": 1000000000}, "prompt_tokens must be a positive integer of at most 65,536, got 1000000000"),
        ({"generated_tokens": 65537}, "generated_tokens must be a positive integer of at most 65,536, got 65537"),
        ({"seeds": [0, -1]}, "seeds: expected non-negative integers, got -1"),
    ],
)
def test_bad_grids_raise_a_typed_error_naming_the_problem(change, message):
    with pytest.raises(SweepGridError) as caught:
        _tiny_grid(**change)
    assert message in str(caught.value)
    assert isinstance(caught.value, HwModelError)


def test_the_largest_legal_grid_values_are_accepted():
    grid = _tiny_grid(ndp_units=[0, 64], prompt_tokens=65536, generated_tokens=65536, seeds=[0])
    assert grid.ndp_units == (0, 64) and grid.prompt_tokens == grid.generated_tokens == 65536


def test_the_documented_example_grid_loads():
    grid = load_grid(REPO_ROOT / "docs" / "sweep_example.toml")
    assert len(expand(grid)) > 1
    assert grid.varied_axes


def test_records_become_one_table_with_none_for_missing_counters():
    from hw_model.sweep import rectangular

    rows = rectangular([{"point": 0, "a": 1}, {"point": 1, "b": 2}])
    assert rows == [{"point": 0, "a": 1, "b": None}, {"point": 1, "a": None, "b": 2}]
    assert [list(r) for r in rows] == [["point", "a", "b"]] * 2


def test_measured_wall_time_is_the_last_column():
    from hw_model.sweep import rectangular

    rows = rectangular([{"point": 0, "sim_wall_s": 0.1}, {"point": 1, "sim_wall_s": 0.2, "prefetch_hits": 3}])
    assert [list(r) for r in rows] == [["point", "prefetch_hits", "sim_wall_s"]] * 2


def test_nested_hardware_fields_are_axes_too():
    grid = _tiny_grid(ndp_units=[4], policies=["tp"], hardware={"gpu": {"peak_flops_per_s": {"bf16": [50e12, 100e12]}}})
    points = expand(grid)
    assert [p.hardware for p in points] == [
        (("gpu.peak_flops_per_s.bf16", 50e12),),
        (("gpu.peak_flops_per_s.bf16", 100e12),),
    ]
    peaks = [system_from_dict(tomllib.loads(p.hw_toml)).gpu.peak_flops_per_s["bf16"] for p in points]
    assert peaks == [50e12, 100e12]
