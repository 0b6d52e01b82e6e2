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
