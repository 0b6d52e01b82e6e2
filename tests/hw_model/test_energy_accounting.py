"""Energy as the simulator and bench report it: the work each invocation did (FLOPs and bytes, computed here from
the expert shapes), its pricing, and the bench records' energy fields."""

from __future__ import annotations

import numpy as np
import pytest

from hw_model.bench import BenchConfig, quick_config, run_bench
from hw_model.bench_energy_tables import format_energy_table
from hw_model.energy import WORK_FIELDS
from hw_model.models import get_model
from hw_model.settings import SimulationSettings
from hw_model.simulator import MoESimulator

OLMOE = get_model("olmoe-1b-7b")  # 64 experts, top-8, hidden 2048, FFN 1024, gated (3 matrices), bf16


def _sim(policy: str, units: int = 4) -> MoESimulator:
    return MoESimulator.from_settings(SimulationSettings(ndp_units=units, policy=policy), OLMOE.moe_layer_shapes())


def _counts(experts: dict[int, int]) -> np.ndarray:
    counts = np.zeros(OLMOE.num_experts, dtype=int)
    for e, t in experts.items():
        counts[e] = t
    return counts


def test_sliced_experts_put_their_flops_and_weight_bytes_on_the_ndp_units():
    sim = _sim("tp")  # every expert sliced over the NDP units
    result = sim.simulate_layer(0, _counts({3: 2, 9: 1, 40: 1}), "prefill")
    work = dict(zip(WORK_FIELDS, result.work, strict=True))
    hidden, ffn = 2048, 1024
    assert work["ndp_flops"] == pytest.approx(2 * (2 + 1 + 1) * 3 * hidden * ffn)
    weights = 3 * 3 * hidden * ffn * 2  # three experts, bf16
    assert weights <= work["ndp_dram_bytes"] <= weights * 1.05  # weights, plus the shards' few activation rows
    assert work["copy_dram_bytes"] == 0
    rows = 1  # 4 assignments of top-8 routing: one token row; the GPU only combines the top-8 outputs
    assert work["gpu_flops"] == pytest.approx(2 * rows * 8 * hidden)


def test_experts_copied_to_the_gpu_read_their_weights_from_the_dimms_and_write_gpu_memory():
    sim = _sim("gpu-offload")
    result = sim.simulate_layer(0, _counts({5: 1}), "decode")
    work = dict(zip(WORK_FIELDS, result.work, strict=True))
    weights = 3 * 2048 * 1024 * 2
    assert result.placement[5] == "gpu" and result.bytes_over_host_link >= weights  # the first call copies it
    assert work["copy_dram_bytes"] == pytest.approx(weights)
    assert work["gpu_memory_bytes"] >= 2 * weights  # written by the copy, read by the kernels
    assert work["ndp_flops"] == 0
    assert work["gpu_flops"] >= 2 * 3 * 2048 * 1024


def test_a_runs_energy_is_its_work_priced_plus_static_power_over_its_time():
    sim = _sim("tp+lb+prefetch")
    rng = np.random.default_rng(0)
    for _ in range(6):
        experts = rng.choice(OLMOE.num_experts, size=8, replace=False)
        for layer in range(OLMOE.moe_layers):
            sim.simulate_layer(layer, _counts(dict.fromkeys(experts.tolist(), 1)), "decode")
    report = sim.energy()
    latency = sim.summary()["expert_latency_decode_s"]
    assert report.elapsed_s == pytest.approx(latency)
    assert report.total_j > 0 and report.avg_power_w > 0
    static_w = 30 + 4 * 1.5 + 2 + 0.5  # paper preset: GPU, 4 NDP cores, PCIe, DIMM-link (DRAM background apart)
    assert report.avg_power_w > static_w
    assert sum(report.static_j[r] for r in ("gpu", "ndp_core", "pcie", "ndp_link")) == pytest.approx(static_w * latency)
    # GPU idle time at static power: what the busy time leaves
    assert report.idle_j["gpu"] == pytest.approx(30 * (latency - sim.summary()["busy_s"]["gpu"]))
    # twice the time, idle: only static energy grows
    longer = sim.energy(2 * latency)
    assert longer.total_j - report.total_j == pytest.approx(
        sum(longer.static_j.values()) - sum(report.static_j.values())
    )


def test_bench_records_carry_energy_joules_per_token_and_power():
    records, _ = run_bench(quick_config(BenchConfig(models=("olmoe-1b-7b",), ndp_units=(4,), gantt=False)))
    for r in records:
        assert r["energy_j"] == pytest.approx(r["prefill_j"] + r["decode_j"])
        assert r["joules_per_token"] == pytest.approx(r["decode_j"] / 8)  # quick: 8 generated tokens
        assert r["avg_power_w"] == pytest.approx(r["energy_j"] / r["latency_s"])
        assert r["edp_j_s"] == pytest.approx(r["energy_j"] * r["latency_s"])
        assert sum(r["energy_by_resource_j"].values()) == pytest.approx(r["energy_j"])
    table = format_energy_table(records)
    assert "decode J/token" in table and "tp+lb+prefetch" in table
