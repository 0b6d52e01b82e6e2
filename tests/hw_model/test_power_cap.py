"""The average-power cap (``power_cap_w``, hw_model/power_cap.py): runs at two caps place experts differently and
each stays within its cap in the simulator's own energy accounting; a cap below the system's floor takes the
lowest-power placement and says so."""

from __future__ import annotations

import pytest

from hw_model.errors import SettingsError
from hw_model.models import get_model
from hw_model.settings import SimulationSettings
from hw_model.simulator import MoESimulator
from hw_model.traces import TraceKnobs, synthetic_trace

OLMOE = get_model("olmoe-1b-7b")
TRACE = synthetic_trace(OLMOE.moe_layers, OLMOE.num_experts, OLMOE.top_k, 64, 24, TraceKnobs(skew=0.8, seed=0))


def _run(cap: float, policy: str = "tp+lb+prefetch") -> tuple[MoESimulator, int]:
    """An edge-preset request (64 prompt + 24 generated tokens); returns the simulator and its GPU placements."""
    settings = SimulationSettings(hw="edge", ndp_units=4, policy=policy, power_cap_w=cap)
    sim = MoESimulator.from_settings(settings, OLMOE.moe_layer_shapes())
    steps = [sim.simulate_step("prefill", TRACE.prefill_step_counts(OLMOE.moe_layers))]
    for token in range(64, 88):
        steps.append(sim.simulate_step("decode", TRACE.tokens_counts(token, token + 1, OLMOE.moe_layers)[0]))
    on_gpu = sum(1 for step in steps for result in step for where in result.placement.values() if where == "gpu")
    return sim, on_gpu


def test_two_caps_change_placement_and_each_run_stays_within_its_cap():
    free, free_gpu = _run(0.0)
    uncapped_w = free.energy().avg_power_w
    caps = (uncapped_w - 1.5, uncapped_w - 3.0)  # both binding: the packer's placements draw more
    runs = [_run(cap) for cap in caps]
    for cap, (sim, _) in zip(caps, runs, strict=True):
        assert sim.energy().avg_power_w <= cap
        assert sim.summary()["over_power_cap_invocations"] == 0
        assert sim.summary()["power_capped_invocations"] > 0
    gpu_counts = [free_gpu, *(n for _, n in runs)]
    assert gpu_counts[0] > gpu_counts[1] > gpu_counts[2]  # a tighter cap leaves fewer experts on the GPU


def test_tp_lb_without_prefetch_respects_the_cap_too():
    free, _ = _run(0.0, "tp+lb")
    cap = free.energy().avg_power_w - 1.0
    sim, _ = _run(cap, "tp+lb")
    assert sim.energy().avg_power_w <= cap


def test_a_cap_below_the_floor_takes_the_lowest_power_placement_and_counts_it():
    sim, on_gpu = _run(5.0)  # below the edge preset's static power alone
    summary = sim.summary()
    assert summary["over_power_cap_invocations"] > 0
    floor, _ = _run(5.0)
    assert floor.energy().avg_power_w == pytest.approx(sim.energy().avg_power_w)  # deterministic
    free, free_gpu = _run(0.0)
    assert on_gpu < free_gpu and sim.energy().avg_power_w < free.energy().avg_power_w


def test_a_negative_cap_is_refused():
    with pytest.raises(SettingsError, match="power_cap_w must be non-negative"):
        SimulationSettings(power_cap_w=-1.0)
