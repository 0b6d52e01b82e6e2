"""SimulationSettings: one frozen object per run, each setting checked once (SettingsError), defaults in one place."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from hw_model.errors import HardwareConfigError, HwModelError, SettingsError
from hw_model.hardware import load_system
from hw_model.policies import policy_names
from hw_model.settings import DEFAULT_POLICY, SimulationSettings
from hw_model.simulator import MoESimulator
from hw_model.tuning import SimulatorTuning
from hw_model.workload import ExpertShape, MoELayerShape

LAYERS = [MoELayerShape("moe.0", 8, 2, ExpertShape(hidden=64, ffn=128))]


def test_the_default_policy_is_a_registered_one():
    assert DEFAULT_POLICY in policy_names()
    assert SimulationSettings().policy == DEFAULT_POLICY


def test_settings_are_frozen_and_load_their_hardware_with_the_unit_count():
    settings = SimulationSettings(hw="edge", ndp_units=3)
    assert settings.system == load_system("edge", 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.policy = "monde"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("given", "setting"),
    [
        ({"policy": "fastest"}, "policy"),
        ({"ndp_units": 0}, "ndp_units"),
        ({"ndp_units": 65}, "ndp_units"),
        ({"ndp_units": True}, "ndp_units"),
        ({"dtype": "int4"}, "dtype"),
        ({"residency_fraction": 1.5}, "residency_fraction"),
        ({"residency_fraction": float("nan")}, "residency_fraction"),
        ({"drift_threshold": -0.1}, "drift_threshold"),
        ({"drift_smoothing": 0.0}, "drift_smoothing"),
        ({"prefetch_interval_tokens": 0}, "prefetch_interval_tokens"),
        ({"prefetch_decay": 2}, "prefetch_decay"),
        ({"hw": 3}, "hw"),
    ],
)
def test_each_bad_setting_is_one_settings_error_naming_it(given, setting):
    with pytest.raises(SettingsError) as refused:
        SimulationSettings(**given)
    assert refused.value.setting == setting and isinstance(refused.value, HwModelError)
    assert setting in str(refused.value)


def test_an_unknown_hardware_is_the_hardware_loaders_error():
    with pytest.raises(HardwareConfigError, match="unknown hardware 'nope'"):
        SimulationSettings(hw="nope")


def test_replace_checks_again_and_reuses_the_loaded_system_when_the_hardware_is_unchanged():
    base = SimulationSettings(ndp_units=2)
    assert base.replace(policy="monde").system is base.system
    assert base.replace(ndp_units=4).system.num_ndp_units == 4
    with pytest.raises(SettingsError, match="unknown policy"):
        base.replace(policy="fastest")


def test_settings_pickle_without_their_system_and_load_it_again():
    settings = SimulationSettings(ndp_units=2, policy="tp", residency_fraction=0.5)
    copy = pickle.loads(pickle.dumps(settings))
    assert copy == settings and copy.system == settings.system


def test_every_settings_field_has_help_text_for_its_option():
    for spec in SimulationSettings.option_fields():
        assert spec.metadata["help"], spec.name
    tuning = {f.name for f in dataclasses.fields(SimulatorTuning)}
    assert tuning <= {f.name for f in SimulationSettings.option_fields()}


def test_the_simulator_reads_its_knobs_from_the_settings():
    system = load_system("paper", 4)
    half = MoESimulator.from_settings(SimulationSettings(ndp_units=4, residency_fraction=0.5), LAYERS)
    full = MoESimulator(system, LAYERS, SimulationSettings(hw=system, residency_fraction=1.0))
    assert half.context.tuning.residency_fraction == 0.5
    assert half.residency_cap_bytes == pytest.approx(0.5 * half.gpu_pool_bytes)
    assert full.residency_cap_bytes == pytest.approx(full.gpu_pool_bytes - LAYERS[0].expert.weight_bytes())
    assert MoESimulator(system, LAYERS, "monde").settings == SimulationSettings(hw=system, policy="monde")
