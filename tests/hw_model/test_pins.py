"""What-if placement pins (hw_model/pins.py): pinned experts run where pinned, the GPU pool is capped and loses
the GPU-pinned experts' bytes, and the summary's pin cost is the pinned latency less the policy's own."""

from __future__ import annotations

import numpy as np
import pytest

from hw_model.errors import SettingsError
from hw_model.pins import pins_from_dict
from hw_model.settings import SimulationSettings
from hw_model.simulator import USABLE_GPU_MEMORY_FRACTION, MoESimulator
from hw_model.workload import ExpertShape, MoELayerShape
from ndp_ep.cli import main

LAYERS = [MoELayerShape(f"l{i}", 8, 2, ExpertShape(256, 512)) for i in range(3)]


def _pins_file(tmp_path, text: str) -> str:
    path = tmp_path / "pins.toml"
    path.write_text(text)
    return str(path)


def _run(settings, steps=12, seed=0):
    rng = np.random.default_rng(seed)
    sim = MoESimulator.from_settings(settings, LAYERS)
    total = 0.0
    placements = []
    for step in range(steps):
        counts = np.zeros((3, 8), dtype=np.int64)
        for layer in range(3):
            counts[layer, rng.choice(8, size=2, replace=False)] = 1
        if step == 0:
            counts[:] += 4  # a prefill-like first step touching every expert
        result = sim.simulate_step("prefill" if step == 0 else "decode", counts)
        total += result.latency_s
        placements.append([dict(result[i].placement) for i in range(3)])
    return sim, total, placements


def test_ndp_pins_cost_what_the_pinned_run_adds(tmp_path):
    pins = _pins_file(tmp_path, "[layers.all]\nndp = [0, 1, 2, 3, 4, 5, 6, 7]\n")
    free_sim, free_total, _ = _run(SimulationSettings(policy="tp+lb"))
    pinned_sim, pinned_total, placements = _run(SimulationSettings(policy="tp+lb", placement=pins))
    assert all(where == "ndp" for step in placements for layer in step for where in layer.values())
    cost = pinned_sim.summary()["pin_cost_s"]
    assert cost == pytest.approx(pinned_total - free_total, rel=1e-9) and "pin_cost_s" not in free_sim.summary()


def test_gpu_pins_and_the_pool_cap(tmp_path):
    pins = _pins_file(tmp_path, "gpu_pool_cap_bytes = 5e6\n[layers.all]\ngpu = [2]\n[layers.1]\ngpu = [5]\n")
    sim, _, placements = _run(SimulationSettings(policy="tp+lb+prefetch", placement=pins))
    expert_bytes = 3 * 256 * 512 * 2
    usable = USABLE_GPU_MEMORY_FRACTION * sim.system.gpu.memory_capacity_bytes
    assert sim.gpu_pool_bytes == pytest.approx(min(usable, 5e6) - 4 * expert_bytes)  # 2 in 3 layers + 5 in one
    for step in placements:
        for layer, where in enumerate(step):
            pinned = {2, 5} if layer == 1 else {2}
            assert all(where[e] == "gpu" for e in pinned if e in where)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"layers": {"all": {"gpu": [1], "ndp": [1]}}}, "pinned to both"),
        ({"layers": {"x": {"gpu": [1]}}}, "a layer is 'all' or an index"),
        ({"layers": {"0": {"gpu": [-1]}}}, "list of expert ids"),
        ({"gpu_pool": 1}, "unknown field 'gpu_pool'"),
        ({"layers": {"9": {"ndp": [0]}}}, "the model has 3 MoE layers"),
        ({"layers": {"0": {"ndp": [8]}}}, "layer 0 has 8 experts, expert 8 pinned"),
    ],
)
def test_bad_pins_are_refused_naming_the_field(data, says):
    with pytest.raises(SettingsError, match=says):
        pins_from_dict(data, "p.toml").check([8, 8, 8])


def test_run_placement_option_reports_the_pin_cost(samples_dir, tmp_path, capsys):
    pins = _pins_file(tmp_path, "[layers.all]\ngpu = [1]\n")
    assert main(["run", str(samples_dir / "moe_decoder.onnx"), "--placement", pins]) == 0
    assert "placement pins: " in capsys.readouterr().out
    assert main(["run", str(samples_dir / "moe_decoder.onnx"), "--placement", str(tmp_path / "no.toml")]) == 2
    err = capsys.readouterr().err
    assert "argument --placement: no such file" in err and len(err.strip().splitlines()) == 1
