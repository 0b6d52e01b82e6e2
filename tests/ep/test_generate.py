"""``ndp-ep generate``: greedy GenAI generation on the provider gives GenAI's own tokens, plus per-step reports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[2] / "sample_models" / "genai" / "gpt_oss_fp32"


def test_generate_rejects_a_folder_without_a_genai_config_in_one_line(cli, tmp_path):
    result = cli("generate", str(tmp_path), "--prompt-tokens", "4", "--new-tokens", "2")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "genai" in result.stderr.lower()


def test_generate_on_the_converted_folder_repeats_genai_tokens_and_reports_every_step(cli, tmp_path):
    pytest.importorskip("onnxruntime_genai")
    if not FIXTURE.is_dir():
        pytest.skip(f"{FIXTURE} is built by sample_models/build_genai.py")
    converted = tmp_path / "converted"
    converted.mkdir()
    for item in FIXTURE.iterdir():
        if item.is_file() and not item.name.startswith("model.onnx"):
            shutil.copy2(item, converted / item.name)
    conversion = cli("convert", str(FIXTURE / "model.onnx"), "-o", str(converted / "model.onnx"))
    assert conversion.returncode == 0, conversion.stderr
    result = cli(
        "generate", str(converted), "--reference", str(FIXTURE), "--prompt-tokens", "16", "--new-tokens", "6", "--json"
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["reference_tokens_identical"] is True
    assert len(data["tokens"]) == 6 and len(data["prompt"]) == 16
    assert data["prefill"]["tokens"] == 16 and data["prefill"]["phase"] == "prefill"
    assert data["decode_steps"] == 5 and all(s > 0 for s in data["decode_s_per_token"])
    assert "warning" not in result.stderr
    other = cli(
        "generate", str(converted), "--no-check", "--prompt-tokens", "4", "--new-tokens", "2", "--ndp-units", "2"
    )
    assert other.returncode == 0, other.stderr
    (line,) = other.stderr.strip().splitlines()  # as ndp-ep run says it
    assert line.startswith("ndp-ep generate: warning: the model's experts are split into 4 shards but the hardware")


def _step_shapes_of(fixture: str, prompt_tokens: int):
    import onnx

    from ndp_ep.commands.generate import _step_shapes

    folder = FIXTURE.parent / fixture
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    return _step_shapes(model, prompt_tokens, json.loads((folder / "genai_config.json").read_text()))


def test_step_shapes_grow_the_past_a_token_a_step_with_the_configs_head_size_and_window():
    # gpt_oss_fp32's genai_config: head_size 16, 2 KV heads, layer 0 a sliding window of 8 (cache slack 0)
    shapes = _step_shapes_of("gpt_oss_fp32", prompt_tokens=16)
    assert shapes(0) == {
        "input_ids": (1, 16),
        "attention_mask": (1, 16),
        "past_key_values.0.key": (1, 2, 8, 16),
        "past_key_values.1.key": (1, 2, 0, 16),
        "past_key_values.0.value": (1, 2, 8, 16),
        "past_key_values.1.value": (1, 2, 0, 16),
    }
    for step in (1, 5):  # decode step n: one token after the prompt and the n - 1 tokens generated before it
        assert shapes(step) == {
            "input_ids": (1, 1),
            "attention_mask": (1, 16 + step),
            "past_key_values.0.key": (1, 2, 8, 16),
            "past_key_values.1.key": (1, 2, 15 + step, 16),
            "past_key_values.0.value": (1, 2, 8, 16),
            "past_key_values.1.value": (1, 2, 15 + step, 16),
        }


def test_step_shapes_keep_a_conv_state_at_its_declared_size():
    shapes = _step_shapes_of("lfm2_moe_fp32", prompt_tokens=4)
    assert shapes(3) == {
        "input_ids": (1, 1),
        "attention_mask": (1, 7),
        "past_key_values.1.key": (1, 2, 6, 16),
        "past_key_values.1.value": (1, 2, 6, 16),
        "past.0.conv": (1, 64, 2),
        "past.2.conv": (1, 64, 2),
    }
