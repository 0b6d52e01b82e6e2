"""hw_model.energy: the DRAM current method against the Micron formula computed here by hand from the datasheet
numbers, the commands derived from streamed bytes, and the run-level pricing of work and idle time."""

from __future__ import annotations

import dataclasses

import pytest

from hw_model.dram import get_standard
from hw_model.energy import (
    WORK_FIELDS,
    CommandCounts,
    DramTiming,
    command_energy_j,
    dram_energy_j,
    run_energy,
    stream_counts,
)
from hw_model.energy_spec import NdpEnergySpec
from hw_model.errors import HardwareConfigError
from hw_model.hardware import list_presets, load_system

# Micron 8Gb DDR4-3200 x8 (DRAMPower's memspec), per device, written out here rather than read from the preset
VDD, VPP = 1.2, 2.5
IDD0, IDD2N, IDD2P, IDD3N, IDD4R, IDD4W, IDD5B = 57e-3, 37e-3, 25e-3, 56e-3, 168e-3, 155e-3, 66e-3
IPP0, IPP3N, IPP5B = 3e-3, 3e-3, 5e-3
TRAS, TRP, TBURST, TRFC, TREFI = 32e-9, 13.75e-9, 2.5e-9, 550e-9, 7800e-9  # DDR4-3200: 22 nCK tRP, BL8 = 4 nCK
DEVICES = 8


def _micron_row_cycle_j() -> float:
    """TN-40-07: one ACT-PRE pair, IDD0 over tRC less the standby the bank would draw anyway (VDD and VPP)."""
    trc = TRAS + TRP
    vdd_part = VDD * (IDD0 * trc - IDD3N * TRAS - IDD2N * TRP)
    vpp_part = VPP * (IPP0 * trc - IPP3N * TRAS - 0.0 * TRP)
    return DEVICES * (vdd_part + vpp_part)


def _paper_ndp():
    return load_system("paper").ndp_unit


def test_the_paper_preset_carries_the_datasheet_currents():
    spec = _paper_ndp().energy
    assert (spec.idd0_a, spec.idd2n_a, spec.idd3n_a, spec.idd4r_a, spec.idd5b_a) == (IDD0, IDD2N, IDD3N, IDD4R, IDD5B)
    assert spec.devices == DEVICES and spec.vdd_v == VDD and spec.vpp_v == VPP


def test_a_read_stream_costs_what_the_micron_formula_gives():
    spec = _paper_ndp().energy
    timing = DramTiming.of(get_standard("DDR4-3200"), spec)
    counts = CommandCounts(acts=128, pres=128, reads=16384, writes=100, refreshes=5, active_s=41e-6, power_down_s=2e-6)
    terms = command_energy_j(spec, timing, counts)
    expected_rows = 128 * _micron_row_cycle_j()
    expected_reads = 16384 * DEVICES * (VDD * (IDD4R - IDD3N) + VPP * (0.0 - IPP3N)) * TBURST
    expected_writes = 100 * DEVICES * (VDD * (IDD4W - IDD3N) + VPP * (0.0 - IPP3N)) * TBURST
    expected_refresh = 5 * DEVICES * (VDD * (IDD5B - IDD3N) + VPP * (IPP5B - IPP3N)) * TRFC
    expected_background = DEVICES * ((VDD * IDD3N + VPP * IPP3N) * 41e-6 + VDD * IDD2P * 2e-6)
    assert terms["act"] + terms["pre"] == pytest.approx(expected_rows, rel=1e-12)
    assert terms["read"] == pytest.approx(expected_reads, rel=1e-12)
    assert terms["write"] == pytest.approx(expected_writes, rel=1e-12)
    assert terms["refresh"] == pytest.approx(expected_refresh, rel=1e-12)
    assert terms["background"] == pytest.approx(expected_background, rel=1e-12)


def test_a_random_row_miss_stream_pays_a_row_cycle_per_burst():
    spec = _paper_ndp().energy
    timing = DramTiming.of(get_standard("DDR4-3200"), spec)
    sequential = command_energy_j(spec, timing, CommandCounts(acts=1, pres=1, reads=128))
    random = command_energy_j(spec, timing, CommandCounts(acts=128, pres=128, reads=128))
    extra = sum(random.values()) - sum(sequential.values())
    assert extra == pytest.approx(127 * _micron_row_cycle_j(), rel=1e-12)


def test_streamed_bytes_become_one_act_per_row_and_one_read_per_burst():
    unit = _paper_ndp()  # DDR4-3200, 2 ranks of 8 x8 devices with 1 KB pages
    elapsed = 1e-3
    counts, timing = stream_counts(unit, 3, 24 * 2**20, 0.0, elapsed)
    assert counts.acts == 24 * 2**20 / (8 * 1024) and counts.pres == counts.acts
    assert counts.reads == 24 * 2**20 / 64
    groups = 3 * 2
    assert counts.refreshes == pytest.approx(groups * elapsed / TREFI)
    streaming = 24 * 2**20 / unit.achievable_bandwidth_bytes_per_s * 2  # each DIMM's two ranks stream together
    assert counts.active_s == pytest.approx(streaming + counts.refreshes * TRFC)
    assert counts.active_s + counts.power_down_s == pytest.approx(groups * elapsed)
    assert counts.precharged_s == 0.0


def test_ddr5_streams_per_sub_channel():
    unit = load_system("paper-ddr5-4800").ndp_unit  # two 32-bit sub-channels of 4 devices per rank, BL16
    counts, _ = stream_counts(unit, 1, 2**20, 0.0, 1e-4)
    assert counts.reads == 2**20 / (4 * 16)  # 32 bits x BL16 per RD
    assert counts.acts == 2**20 / (4 * 1024)
    assert counts.refreshes == pytest.approx(2 * 2 * 1e-4 / 3906e-9)


def test_idle_ranks_power_down_unless_the_preset_says_standby():
    unit = _paper_ndp()
    standby = dataclasses.replace(unit, energy=dataclasses.replace(unit.energy, idle="standby"))
    down = dram_energy_j(unit, 1, 0.0, 0.0, 1e-3)["background"]
    up = dram_energy_j(standby, 1, 0.0, 0.0, 1e-3)["background"]
    groups, refresh_s = 2, 2 * 1e-3 / TREFI * TRFC
    active = DEVICES * (VDD * IDD3N + VPP * IPP3N) * refresh_s
    assert down == pytest.approx(active + DEVICES * VDD * IDD2P * (groups * 1e-3 - refresh_s))
    assert up == pytest.approx(active + DEVICES * VDD * IDD2N * (groups * 1e-3 - refresh_s))


def test_an_idle_run_costs_the_static_power_of_every_resource():
    system = load_system("paper", ndp_units=4)
    report = run_energy(
        system, [0.0] * len(WORK_FIELDS), pcie_bytes=0.0, elapsed_s=0.5, busy_s={}, dtype="bf16", uses_ndp=True
    )
    dram_idle_w = sum(dram_energy_j(system.ndp_unit, 4, 0.0, 0.0, 1.0).values())
    expected_w = 30 + 4 * 1.5 + 2 + 0.5 + dram_idle_w  # gpu, cores, pcie, DIMM-link static (the preset's figures)
    assert report.avg_power_w == pytest.approx(expected_w)
    assert report.idle_j["gpu"] == pytest.approx(30 * 0.5)


def test_work_is_priced_per_flop_and_per_byte():
    system = load_system("paper", ndp_units=2)
    idle = run_energy(system, [0.0] * 6, pcie_bytes=0.0, elapsed_s=1e-3, busy_s={}, dtype="bf16", uses_ndp=True)
    work = [1e12, 1e9, 2e11, 0.0, 0.0, 1e6]
    busy = run_energy(system, work, pcie_bytes=5e8, elapsed_s=1e-3, busy_s={}, dtype="bf16", uses_ndp=True)
    extra = {r: busy.by_resource_j[r] - idle.by_resource_j[r] for r in busy.by_resource_j}
    assert extra["gpu"] == pytest.approx(1e12 * 2.05e-12)
    assert extra["gpu_memory"] == pytest.approx(1e9 * 48e-12)
    assert extra["ndp_core"] == pytest.approx(2e11 * 1.0e-12)
    assert extra["pcie"] == pytest.approx(5e8 * 48e-12)
    assert extra["ndp_link"] == pytest.approx(1e6 * 16e-12)


def test_a_policy_without_ndp_work_pays_no_core_power():
    system = load_system("paper", ndp_units=4)
    report = run_energy(system, [0.0] * 6, pcie_bytes=0.0, elapsed_s=1.0, busy_s={}, dtype="bf16", uses_ndp=False)
    assert report.by_resource_j["ndp_core"] == 0.0 and report.by_resource_j["ndp_dram"] > 0


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_has_energy_for_every_resource(name):
    system = load_system(name)
    assert all(s.energy is not None for s in (system.gpu, system.ndp_unit, system.host_link, system.ndp_link))


def test_a_row_cycle_that_returns_energy_is_refused():
    base = _paper_ndp().energy
    with pytest.raises(HardwareConfigError, match="would return energy"):
        dataclasses.replace(_paper_ndp(), energy=dataclasses.replace(base, idd0_a=0.040))


def test_currents_out_of_jedec_order_are_refused():
    with pytest.raises(HardwareConfigError, match="idd3n_a must not exceed idd4r_a"):
        dataclasses.replace(_paper_ndp().energy, idd4r_a=0.01)
    with pytest.raises(HardwareConfigError, match="idle must be one of"):
        NdpEnergySpec(core_pj_per_flop={"bf16": 1.0}, core_static_w=1.0, idle="asleep")
    with pytest.raises(HardwareConfigError, match="unknown dtype"):
        NdpEnergySpec(core_pj_per_flop={"bf17": 1.0}, core_static_w=1.0)


def test_a_hardware_file_without_energy_tables_reports_no_energy(tmp_path):
    from hw_model.hardware import PRESET_DIR

    text = (PRESET_DIR / "paper.toml").read_text(encoding="utf-8")
    path = tmp_path / "no_energy.toml"
    path.write_text(text.split("# Energy:")[0], encoding="utf-8")
    system = load_system(path)
    assert run_energy(system, [0.0] * 6, pcie_bytes=0, elapsed_s=1, busy_s={}, dtype="bf16", uses_ndp=True) is None


def test_an_unknown_energy_field_is_named(tmp_path):
    from hw_model.hardware import PRESET_DIR

    text = (PRESET_DIR / "paper.toml").read_text(encoding="utf-8").replace("static_w = 30", "static_watts = 30")
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(HardwareConfigError, match="gpu.energy.static_watts: unknown field"):
        load_system(path)
