"""Models as ONNX Runtime GenAI's builder writes them (gpt-oss, LFM2-MoE at fp32/fp16/int4/int8) convert:
every MoE/QMoE op becomes a sharded op keeping the weights' precision, the folder stays a GenAI folder, and
the converted float32 models reproduce stock ONNX Runtime's logits."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from graph_passes.sharded_op import MODEL_META_REQUIRES, is_sharded_node, parse_node
from tests.genai.conftest import GENAI_DIR, manifest
from tests.genai.helpers import assert_logits_close, convert_json, fused_op_count, run_converted

FIXTURES = manifest()
ONNX_TYPE_OF = {"float32": 1, "float16": 10, "bfloat16": 16, "int8": 2, "int4": 2}  # quantized shards: uint8


def test_the_fixtures_cover_both_architectures_at_four_precisions():
    covered = {(entry["arch"], entry["precision"]) for entry in FIXTURES.values()}
    for arch in ("gpt_oss", "lfm2_moe"):
        assert {p for a, p in covered if a == arch} == {"fp32", "fp16", "int4", "int8"}
    assert "gpt_oss_fp32" in FIXTURES
    assert len({(e["num_experts"], e["top_k"], e["moe_layers"]) for e in FIXTURES.values()}) >= 5


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_fused_moe_op_is_rewritten_keeping_its_precision(name, tmp_path, capsys):
    entry = FIXTURES[name]
    source = GENAI_DIR / name / "model.onnx"
    assert fused_op_count(source) == entry["moe_layers"]
    report = convert_json(source, tmp_path / "model.onnx", capsys)
    assert report["skipped"] == []
    blocks = report["moe_blocks"]
    assert len(blocks) == entry["moe_layers"]
    for block in blocks:
        assert block["weight_dtype"] == entry["weight_dtype"]
        assert block["quant_block_size"] == entry["quant_block_size"]
        assert (block["num_experts"], block["top_k"], block["hidden"], block["ffn"]) == (
            entry["num_experts"],
            entry["top_k"],
            entry["hidden"],
            entry["ffn"],
        )
        assert block["checked_numerically"]
    converted = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    assert fused_op_count(tmp_path / "model.onnx") == 0
    sharded = [n for n in converted.graph.node if is_sharded_node(n)]
    assert len(sharded) == entry["moe_layers"]
    types = {t.name: t.data_type for t in converted.graph.initializer}
    for node in sharded:
        spec = parse_node(node)
        assert spec.weight_dtype == entry["weight_dtype"]
        first = spec.split_inputs(list(node.input[3:]))["first"]
        assert {types[n] for n in first} == {ONNX_TYPE_OF[entry["weight_dtype"]]}
    assert MODEL_META_REQUIRES in {p.key for p in converted.metadata_props}
    config = json.loads((tmp_path / "genai_config.json").read_text())
    assert config["model"]["decoder"]["filename"] == "model.onnx"
    assert (tmp_path / "tokenizer.json").is_file()


def test_a_converted_folder_points_genai_at_the_converted_file(tmp_path, capsys):
    convert_json(GENAI_DIR / "gpt_oss_fp32" / "model.onnx", tmp_path / "gpt_oss.ndp.onnx", capsys)
    config = json.loads((tmp_path / "genai_config.json").read_text())
    original = json.loads((GENAI_DIR / "gpt_oss_fp32" / "genai_config.json").read_text())
    assert config["model"]["decoder"]["filename"] == "gpt_oss.ndp.onnx"
    original["model"]["decoder"]["filename"] = "gpt_oss.ndp.onnx"
    assert config == original


def test_a_second_genai_model_is_not_converted_over_another_ones_folder(tmp_path, capsys):
    from ndp_ep.cli import main

    convert_json(GENAI_DIR / "gpt_oss_fp32" / "model.onnx", tmp_path / "gpt_oss.ndp.onnx", capsys)
    before = (tmp_path / "genai_config.json").read_bytes()
    code = main(["convert", str(GENAI_DIR / "lfm2_moe_fp32" / "model.onnx"), "-o", str(tmp_path / "lfm2.ndp.onnx")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "another model's GenAI config" in err
    assert (tmp_path / "genai_config.json").read_bytes() == before and not (tmp_path / "lfm2.ndp.onnx").exists()
    # its own config: converting the same model again replaces it, and its weights file (it failed as "two outputs
    # are the same file", the old weights file counted twice)
    convert_json(GENAI_DIR / "gpt_oss_fp32" / "model.onnx", tmp_path / "gpt_oss.ndp.onnx", capsys)
    assert len(list(tmp_path.glob("gpt_oss.ndp.onnx*data"))) == 1


def _with_outputs(precisions):
    return [n for n, e in sorted(FIXTURES.items()) if e["cpu_outputs"] and e["weight_dtype"] in precisions]


@pytest.mark.parametrize("name", _with_outputs({"float32"}))
def test_converted_float32_models_reproduce_stock_onnxruntime(name, tmp_path, capsys):
    convert_json(GENAI_DIR / name / "model.onnx", tmp_path / "model.onnx", capsys)
    got = run_converted(tmp_path / "model.onnx", GENAI_DIR / name / "inputs.npz")
    expected = dict(np.load(GENAI_DIR / name / "outputs.npz"))
    assert_logits_close(got, expected, "float32")


@pytest.mark.needs_native_ep
@pytest.mark.parametrize("name", _with_outputs({"float16", "int8", "int4"}))
def test_converted_low_precision_models_reproduce_stock_onnxruntime(name, tmp_path, capsys):
    convert_json(GENAI_DIR / name / "model.onnx", tmp_path / "model.onnx", capsys)
    got = run_converted(tmp_path / "model.onnx", GENAI_DIR / name / "inputs.npz")
    expected = dict(np.load(GENAI_DIR / name / "outputs.npz"))
    assert_logits_close(got, expected, FIXTURES[name]["weight_dtype"])


def test_inspect_lists_the_blocks_and_writes_nothing(tmp_path, capsys):
    from ndp_ep.cli import main

    folder = GENAI_DIR / "lfm2_moe_int4"
    before = sorted(p.name for p in folder.iterdir())
    assert main(["inspect", str(folder / "model.onnx"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [b["weight_dtype"] for b in report["moe_blocks"]] == ["int4"] * FIXTURES["lfm2_moe_int4"]["moe_layers"]
    assert sorted(p.name for p in folder.iterdir()) == before
    assert main(["inspect", str(folder / "model.onnx")]) == 0
    assert "rewrite model.layers.1.moe" in capsys.readouterr().out


def test_inspect_of_a_missing_file_is_one_line_and_exit_2(tmp_path, capsys):
    from ndp_ep.cli import main

    assert main(["inspect", str(tmp_path / "absent.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err


def test_run_without_inputs_feeds_a_decoder_an_empty_past(tmp_path, capsys):
    from ndp_ep.cli import main

    convert_json(GENAI_DIR / "lfm2_moe_fp32" / "model.onnx", tmp_path / "model.onnx", capsys)
    assert main(["run", str(tmp_path / "model.onnx"), "--json", "--outputs", str(tmp_path / "out.npz")]) == 0
    captured = capsys.readouterr()
    assert "random first-step decoder feeds (empty KV cache)" in captured.err
    assert "genai_config.json" in captured.err
    outputs = dict(np.load(tmp_path / "out.npz"))
    assert outputs["logits"].shape[:2] == (1, 8) and np.isfinite(outputs["logits"]).all()
    assert outputs["present.1.key"].shape[2] == 8  # empty past + 8 new tokens


def test_onnxruntime_genai_opens_the_converted_folder_and_finds_the_converted_model(tmp_path, capsys):
    og = pytest.importorskip("onnxruntime_genai")
    convert_json(GENAI_DIR / "gpt_oss_fp32" / "model.onnx", tmp_path / "gpt_oss.ndp.onnx", capsys)
    config = og.Config(str(tmp_path))
    # without the provider registered, loading stops exactly at the sharded op: the config led to our file
    with pytest.raises(Exception, match="ShardedMoEExperts"):
        og.Model(config)


def test_an_unreadable_genai_config_fails_the_conversion_before_writing(tmp_path, capsys):
    import shutil

    from ndp_ep.cli import main

    source = tmp_path / "in"
    shutil.copytree(GENAI_DIR / "gpt_oss_fp32", source)
    (source / "genai_config.json").write_text("{not json")
    (tmp_path / "out").mkdir()
    assert main(["convert", str(source / "model.onnx"), "-o", str(tmp_path / "out" / "model.onnx")]) == 2
    assert "is not a readable GenAI config" in capsys.readouterr().err
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("name", ["lfm2_moe_int4", "gpt_oss_int8", "gpt_oss_fp16"])
def test_the_report_costs_quantized_experts_as_stored_unless_a_dtype_is_given(name, tmp_path, capsys):
    from ndp_ep.cli import main
    from ndp_ep.session import InferenceSession

    path = tmp_path / "model.onnx"
    convert_json(GENAI_DIR / name / "model.onnx", path, capsys)
    model = onnx.load(str(path), load_external_data=False)
    node = next(n for n in model.graph.node if is_sharded_node(n))
    spec = parse_node(node)
    weights = (3 if spec.gated else 2) * spec.hidden * spec.ffn
    bf16 = 2.0 * weights
    if spec.weight_dtype in ("int4", "int8"):  # packed values plus one scale per block, as the model stores them
        types = {t.name: t.data_type for t in model.graph.initializer}
        scale_bytes = {1: 4, 10: 2}[types[next(i for i in node.input if i.endswith("_scales"))]]
        per_weight = {"int4": 0.5, "int8": 1.0}[spec.weight_dtype] + scale_bytes / spec.quant_block_size
        expected, says = weights * per_weight, f"{spec.weight_dtype} as stored (blocks of {spec.quant_block_size}"
    else:  # float experts: the bf16 deployment dtype
        expected, says = bf16, "bf16"
    assert InferenceSession(str(path)).reporter.layers[0].expert.weight_bytes() == pytest.approx(expected)
    assert InferenceSession(str(path), dtype="bf16").reporter.layers[0].expert.weight_bytes() == pytest.approx(bf16)
    assert main(["run", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["weights"].startswith(says)
    assert main(["run", str(path), "--json", "--dtype", "bf16"]) == 0
    assert json.loads(capsys.readouterr().out)["weights"] == "bf16"


def test_real_width_folders_leave_the_committed_fixtures_and_their_manifest_as_they_were():
    from dataclasses import fields

    from sample_models.build_genai import FIXTURES as BUILT
    from sample_models.build_genai import HELD_OUT, REAL_WIDTH_FIELDS, REAL_WIDTHS, Fixture, build_real_width

    defaults = {f.name: f.default for f in fields(Fixture) if f.name in REAL_WIDTH_FIELDS}
    assert sorted(defaults) == sorted(REAL_WIDTH_FIELDS)
    for fixture in BUILT + HELD_OUT:  # the tiny sizes every committed fixture was exported with
        assert {name: getattr(fixture, name) for name in REAL_WIDTH_FIELDS} == defaults, fixture.name
    for entry in FIXTURES.values():
        assert not set(entry) & set(REAL_WIDTH_FIELDS)
    assert not set(REAL_WIDTHS) & set(FIXTURES)
    assert all(f.hidden == 2048 and f.vocab == 65536 for f in REAL_WIDTHS.values())
    with pytest.raises(SystemExit, match="--out"):  # never written into sample_models/
        build_real_width("lfm2_int4", None, None)
