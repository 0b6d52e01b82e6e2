"""Hardware presets: every number cites a source, and bad TOML files name the bad field."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hw_model.errors import HardwareConfigError
from hw_model.hardware import COMPUTE_OPTIONAL_FIELDS, DRAM_DERIVED_FIELDS, PRESET_DIR, list_presets, load_system

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _numbers_without_source(table: dict, where: str) -> list[str]:
    missing = []
    for key, value in table.items():
        if isinstance(value, dict):
            missing += _numbers_without_source(value, f"{where}{key}.")
        elif key.endswith("_source"):
            if not isinstance(value, str) or not value.strip():
                missing.append(f"{where}{key} (empty)")
        elif isinstance(value, (int, float, list)) and not isinstance(value, bool) and f"{key}_source" not in table:
            missing.append(f"{where}{key}")
    return missing


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_number_has_a_source(name):
    data = tomllib.loads((PRESET_DIR / f"{name}.toml").read_text(encoding="utf-8"))
    assert _numbers_without_source(data, "") == []


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_sets_the_shared_cost_form_for_gpu_and_ndp_unit(name):
    data = tomllib.loads((PRESET_DIR / f"{name}.toml").read_text(encoding="utf-8"))
    for section in ("gpu", "ndp_unit"):
        derived = DRAM_DERIVED_FIELDS if "dram" in data[section] else ()
        assert [f for f in COMPUTE_OPTIONAL_FIELDS if f not in data[section] and f not in derived] == []


def test_presets_load_and_ndp_override_applies():
    assert {"paper", "edge", "h200"} <= set(list_presets())
    system = load_system("paper", ndp_units=6)
    assert system.num_ndp_units == 6
    assert system.sources["gpu.memory_bandwidth_bytes_per_s"].startswith("vendor")


def test_h200_preset_is_built_from_ceilings_and_datasheet():
    gpu = load_system("h200").gpu
    assert gpu.memory_bandwidth_bytes_per_s == 4.8e12  # datasheet
    assert gpu.achievable_bandwidth_bytes_per_s == pytest.approx(4226.2e9, rel=1e-3)  # ceilings.json copy
    assert gpu.sync_overhead_s == pytest.approx((23.104 - 10.079) * 1e-6, rel=0.01)  # ceilings.json event - wall
    assert gpu.flops_per_s("fp32") == 67e12  # datasheet, no TF32


def test_host_link_pinned_and_pageable_transfers():
    link = load_system("h200").host_link
    assert link.transfer_time_s(0) == 0.0
    assert link.transfer_time_s(1 << 30) == pytest.approx(link.latency_s + (1 << 30) / link.bandwidth_bytes_per_s)
    assert link.transfer_time_s(1 << 30, pinned=False) > 4 * link.transfer_time_s(1 << 30)
    paper_link = load_system("paper").host_link  # no pageable figure: same as pinned
    assert paper_link.transfer_time_s(1 << 20, pinned=False) == paper_link.transfer_time_s(1 << 20)


def _preset_with(tmp_path: Path, old: str, new: str) -> Path:
    text = (PRESET_DIR / "h200.toml").read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ("gemm_tile_m = 64", "gemm_tile_m = 0", "gpu.gemm_tile_m"),
        ("gemm_tile_m = 64", "gemm_tile_m = 64.5", "gpu.gemm_tile_m"),
        ("achievable_flops_fraction = 0.8281", "achievable_flops_fraction = 1.5", "gpu.achievable_flops_fraction"),
        ("reduction_latency_s = 0.3e-6", "reduction_latency_s = -1.0", "gpu.reduction_latency_s"),
        ("kernel_overhead_s = 1.5e-6", 'kernel_overhead_s = "fast"', "gpu.kernel_overhead_s"),
        ("sync_overhead_s = 13.0e-6", "sync_overhead_ms = 13.0", "gpu.sync_overhead_ms"),
        ("latency_s = 12e-6", "latency_s = -3", "host_link.latency_s"),
        ("pageable_bandwidth_bytes_per_s = 10e9", "pageable_bandwidth_bytes_per_s = 0", "pageable_bandwidth"),
        ("fp32 = 67e12", "fp33 = 67e12", "gpu.peak_flops_per_s.fp33"),
    ],
)
def test_invalid_file_names_the_bad_field(tmp_path, old, new, named):
    with pytest.raises(HardwareConfigError, match=named.replace(".", r"\.")):
        load_system(_preset_with(tmp_path, old, new))


def test_missing_field_and_broken_toml_are_named(tmp_path):
    path = _preset_with(tmp_path, "memory_capacity_bytes = 141e9\n", "")
    with pytest.raises(HardwareConfigError, match=r"gpu\.memory_capacity_bytes: missing"):
        load_system(path)
    broken = tmp_path / "broken.toml"
    broken.write_text("[gpu\nname = 1", encoding="utf-8")
    with pytest.raises(HardwareConfigError, match="not valid TOML"):
        load_system(broken)
    with pytest.raises(HardwareConfigError, match="unknown hardware"):
        load_system(tmp_path / "absent.toml")


def test_user_file_may_omit_optional_form_fields(tmp_path):
    text = (PRESET_DIR / "paper.toml").read_text(encoding="utf-8")
    lines = [
        line
        for line in text.splitlines()
        if not any(line.startswith(f"{f} ") or line.startswith(f"{f}_source") for f in COMPUTE_OPTIONAL_FIELDS)
    ]
    path = tmp_path / "minimal.toml"
    path.write_text("\n".join(lines), encoding="utf-8")
    gpu = load_system(path).gpu
    assert gpu.gemm_tile_m == 1 and gpu.achievable_flops_fraction == 1.0 and gpu.reduction_latency_s == 0.0


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "num_ndp_units = 4",
            "num_ndp_units = 1000000000",
            "num_ndp_units must be an integer from 0 to 64, got 1000000000",
        ),
        ("num_ndp_units = 4", "num_ndp_units = 65", "num_ndp_units must be an integer from 0 to 64, got 65"),
        ("num_ndp_units = 4", "num_ndp_units = -1", "num_ndp_units must be an integer from 0 to 64, got -1"),
        ("supported_ndp_units = [2, 4, 6, 8]", "supported_ndp_units = [2, 65]", "supported_ndp_units: every count"),
        ("supported_ndp_units = [2, 4, 6, 8]", "supported_ndp_units = [0, 2]", "from 1 to 64, got 0"),
        ("supported_ndp_units = [2, 4, 6, 8]", "supported_ndp_units = 4", "must be a list of integers"),
    ],
)
def test_a_file_with_an_ndp_unit_count_out_of_range_names_the_field_and_range(tmp_path, old, new, message):
    with pytest.raises(HardwareConfigError, match=message):
        load_system(_preset_with(tmp_path, old, new))


@pytest.mark.parametrize("count", [65, 10**9, -1, True, 4.0])
def test_an_ndp_unit_override_out_of_range_is_refused_before_anything_is_built(count):
    with pytest.raises(HardwareConfigError, match="num_ndp_units must be an integer from 0 to 64"):
        load_system("paper", ndp_units=count)
    with pytest.raises(HardwareConfigError, match="num_ndp_units must be an integer from 0 to 64"):
        load_system("paper").with_ndp_units(count)


def test_zero_ndp_units_a_gpu_only_system_and_the_largest_count_stay_legal():
    assert load_system("paper", ndp_units=0).num_ndp_units == 0
    assert load_system("paper").with_ndp_units(64).num_ndp_units == 64


def test_an_edited_copy_of_a_preset_is_named_after_its_file_and_an_unchanged_copy_keeps_the_presets_name(tmp_path):
    text = (PRESET_DIR / "paper.toml").read_text(encoding="utf-8")
    assert 'name = "paper"' in text and "memory_bandwidth_bytes_per_s = 960e9" in text
    copies = {
        "same.toml": text,
        "units.toml": text.replace("\nnum_ndp_units = 4\n", "\nnum_ndp_units = 2\n", 1),  # a default, not the design
        "faster.toml": text.replace("memory_bandwidth_bytes_per_s = 960e9", "memory_bandwidth_bytes_per_s = 1.2e12"),
    }
    names = {}
    for file_name, content in copies.items():
        assert content != text or file_name == "same.toml"
        (tmp_path / file_name).write_text(content, encoding="utf-8")
        names[file_name] = load_system(tmp_path / file_name).name
    assert names == {"same.toml": "paper", "units.toml": "paper", "faster.toml": "paper (faster.toml)"}
    assert load_system(tmp_path / "faster.toml", ndp_units=2).name == "paper (faster.toml)"
    assert load_system(tmp_path / "faster.toml").gpu.memory_bandwidth_bytes_per_s == 1.2e12
