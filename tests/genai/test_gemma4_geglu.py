"""Gemma-4 MoE as ONNX Runtime GenAI's builder exports it (``sample_models/build_genai.py``: a dense MLP beside
top-2 GeGLU experts per layer, ``activation_type="geglu"``, expert width 88 so int4's QMoE ends each row in a
partial block of 32): stock ONNX Runtime cannot run it on CPU; converted, ndp-ep runs and generates it, and its
logits match Hugging Face torch's on the same tokens.

The committed fp32 fixture carries torch's logits (``hf_logits.npz``, written by the fixture builder), so the
comparison runs without torch; the last test rebuilds a fresh checkpoint and export and needs the ``export``
extra (torch, transformers >= 5.2x, onnxruntime-genai), skipping without it.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tests.genai.conftest import GENAI_DIR, manifest
from tests.genai.helpers import TOLERANCE, convert_json, generate_converted, run_converted

FP32, INT4 = GENAI_DIR / "gemma4_moe_fp32", GENAI_DIR / "gemma4_moe_int4"


def _relative_to_torch(got: np.ndarray, torch_logits: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - torch_logits)) / np.max(np.abs(torch_logits)))


def test_the_fixtures_are_geglu_moe_that_stock_onnxruntime_refuses_on_cpu():
    entries = manifest()
    assert {entries[f.name]["precision"] for f in (FP32, INT4)} == {"fp32", "int4"}
    assert not any(entries[f.name]["cpu_outputs"] for f in (FP32, INT4))
    options = ort.SessionOptions()
    options.log_severity_level = 4
    with pytest.raises(Exception, match="Unsupported MoE activation type: geglu"):
        ort.InferenceSession(str(INT4 / "model.onnx"), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("fixture", [FP32, INT4], ids=["fp32", "int4"])
def test_every_geglu_block_converts_proven_against_the_float64_reading(fixture, tmp_path, capsys):
    report = convert_json(fixture / "model.onnx", tmp_path / "model.onnx", capsys)
    assert report["skipped"] == [] and len(report["moe_blocks"]) == 2
    assert {b["activation"] for b in report["moe_blocks"]} == {"gelu_tanh_glu"}
    assert all(b["checked_numerically"] and b["checked_in_isolation"] for b in report["moe_blocks"])


def test_converted_gemma4_moe_matches_hugging_face_torch_logits(tmp_path, capsys):
    convert_json(FP32 / "model.onnx", tmp_path / "model.onnx", capsys)
    logits = run_converted(tmp_path / "model.onnx", FP32 / "inputs.npz")["logits"]
    torch_logits = np.load(FP32 / "hf_logits.npz")["logits"].astype(np.float64)
    assert _relative_to_torch(logits, torch_logits) <= TOLERANCE["float32"]


def test_a_converted_int4_gemma4_moe_generates_through_genai(tmp_path):
    pytest.importorskip("onnxruntime_genai")
    data = generate_converted(INT4, tmp_path / "converted", "--no-check", "--prompt-tokens", "6", "--new-tokens", "4")
    assert len(data["tokens"]) == 4 and data["decode_steps"] == 3


def test_a_fresh_gemma4_moe_export_matches_hugging_face_torch(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers", minversion="5.2")
    pytest.importorskip("onnxruntime_genai")
    from sample_models.build_genai import Fixture, export

    shape = dict(num_experts=6, top_k=2, layers=2, hidden=96, ffn=72, seed=31)
    fixture = Fixture("fresh_gemma4", "gemma4_moe", "fp32", **shape)
    folder = tmp_path / fixture.name
    error = export(fixture, folder)
    assert error is None, error
    convert_json(folder / "model.onnx", tmp_path / "model.onnx", capsys)
    logits = run_converted(tmp_path / "model.onnx", folder / "inputs.npz")["logits"]
    torch_logits = np.load(folder / "hf_logits.npz")["logits"].astype(np.float64)
    assert _relative_to_torch(logits, torch_logits) <= TOLERANCE["float32"]
