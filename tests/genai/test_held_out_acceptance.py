"""Issue 10's acceptance on GenAI-builder models of configurations no other test sees (other expert counts,
top-k, layer counts, hidden sizes; fp32, fp16, int4, int8), exported on the fly by
``sample_models/build_genai.py --held-out``: every MoE/QMoE op is rewritten with the right ``weight_dtype``,
and the converted models reproduce stock ONNX Runtime's logits (float32 now; the others once the native
provider runs them)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.genai.helpers import assert_logits_close, convert_json, fused_op_count, run_converted

pytest.importorskip("onnxruntime_genai")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    from sample_models.build_genai import HELD_OUT, build

    root = tmp_path_factory.mktemp("held_out")
    manifest = build(HELD_OUT, root, None)
    assert sorted(manifest) == sorted(f.name for f in HELD_OUT), "a held-out export failed"
    return root, manifest


def test_held_out_configurations_differ_from_the_committed_fixtures(held_out):
    from sample_models.build_genai import FIXTURES

    _, manifest = held_out
    committed = {(f.num_experts, f.top_k, f.layers, f.hidden, f.ffn) for f in FIXTURES}
    for entry in manifest.values():
        assert (entry["num_experts"], entry["top_k"], entry["layers"], entry["hidden"], entry["ffn"]) not in committed
    assert {e["weight_dtype"] for e in manifest.values()} == {"float32", "float16", "int8", "int4"}


def test_every_held_out_moe_op_is_rewritten_with_its_weight_dtype(held_out, tmp_path, capsys):
    root, manifest = held_out
    for name, entry in sorted(manifest.items()):
        output = tmp_path / name / "model.onnx"
        output.parent.mkdir()
        report = convert_json(root / name / "model.onnx", output, capsys)
        assert report["skipped"] == [], name
        assert [b["weight_dtype"] for b in report["moe_blocks"]] == [entry["weight_dtype"]] * entry["moe_layers"]
        assert fused_op_count(output) == 0
        assert json.loads((output.parent / "genai_config.json").read_text())["model"]["decoder"]["filename"]


def _compare(root, name, entry, tmp_path, capsys):
    output = tmp_path / "model.onnx"
    convert_json(root / name / "model.onnx", output, capsys)
    got = run_converted(output, root / name / "inputs.npz")
    assert_logits_close(got, dict(np.load(root / name / "outputs.npz")), entry["weight_dtype"])


def test_held_out_float32_models_match_stock_onnxruntime(held_out, tmp_path, capsys):
    root, manifest = held_out
    names = [n for n, e in sorted(manifest.items()) if e["weight_dtype"] == "float32" and e["cpu_outputs"]]
    assert names
    for name in names:
        (tmp_path / name).mkdir()
        _compare(root, name, manifest[name], tmp_path / name, capsys)


@pytest.mark.needs_native_ep
def test_held_out_low_precision_models_match_stock_onnxruntime(held_out, tmp_path, capsys):
    root, manifest = held_out
    names = [n for n, e in sorted(manifest.items()) if e["weight_dtype"] != "float32" and e["cpu_outputs"]]
    assert names
    for name in names:
        (tmp_path / name).mkdir()
        _compare(root, name, manifest[name], tmp_path / name, capsys)
