"""Each entry builds one SimulationSettings and passes it down whole: the command line, the session, the reports."""

from __future__ import annotations

import pytest

import ndp_ep
from hw_model.errors import SettingsError
from hw_model.settings import SimulationSettings
from ndp_ep.cli import build_parser
from ndp_ep.cli_args import settings_from_args


def test_a_session_simulates_under_the_settings_given_whole(samples_dir):
    settings = SimulationSettings(ndp_units=2, policy="monde", residency_fraction=0.5, dtype="fp16")
    session = ndp_ep.InferenceSession(samples_dir / "moe_block.onnx", settings=settings)
    assert session.settings is settings and session.reporter.settings is settings
    assert session.simulator.settings is settings and session.simulator.context.tuning is settings
    assert (session.policy, session.system.num_ndp_units, session.dtype) == ("monde", 2, "fp16")
    with pytest.raises(ndp_ep.NdpEpError, match="give either settings= or hw=, not both"):
        ndp_ep.InferenceSession(samples_dir / "moe_block.onnx", settings=settings, hw="paper")


def test_the_command_line_builds_the_settings_from_the_options_the_fields_declare():
    args = build_parser(["run"]).parse_args(
        ["run", "m.onnx", "--hw", "edge", "--ndp-units", "3", "--policy", "tp", "--drift-threshold", "0",
         "--prefetch-interval-tokens", "8"]
    )  # fmt: skip
    settings = settings_from_args(args)
    assert settings == SimulationSettings(hw="edge", ndp_units=3, policy="tp", drift_threshold=0.0,
                                          prefetch_interval_tokens=8)  # fmt: skip
    assert settings_from_args(build_parser(["run"]).parse_args(["run", "m.onnx"])) == SimulationSettings()


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--ndp-units", "0", "argument --ndp-units: expected an integer from 1 to 64, got 0"),
        ("--policy", "fastest", "argument --policy: unknown policy 'fastest'"),
        ("--residency-fraction", "1.5", "argument --residency-fraction: residency_fraction must be in [0, 1]"),
    ],
)
def test_a_bad_option_is_refused_naming_the_option(option, value, words):
    args = build_parser(["run"]).parse_args(["run", "m.onnx", option, value])
    with pytest.raises(SettingsError) as refused:
        settings_from_args(args)
    assert str(refused.value).startswith(words)
