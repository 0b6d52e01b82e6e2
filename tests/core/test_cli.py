"""The CLI contract: convert/run/demo JSON schemas, exit codes and bad-input behaviour (subprocess)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper


def test_convert_json_lists_each_block_and_writes_the_model(cli, samples_dir, tmp_path):
    out = tmp_path / "dec.onnx"
    done = cli("convert", str(samples_dir / "moe_decoder.onnx"), "-o", str(out), "--shards", "2", "--json")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert [(b["num_experts"], b["top_k"], b["hidden"], b["ffn"], b["shards"]) for b in payload["moe_blocks"]] == [
        (8, 2, 64, 128, 2),
        (4, 1, 64, 128, 2),
        (8, 2, 64, 128, 2),
    ]
    assert payload["skipped"] == []
    model = onnx.load(out)
    assert sum(n.op_type == "ShardedMoEExperts" for n in model.graph.node) == 3
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary files left behind"


def test_run_json_reports_latency_per_layer_and_outputs_match_stock(cli, samples_dir, tmp_path):
    converted = tmp_path / "dec.onnx"
    assert cli("convert", str(samples_dir / "moe_decoder.onnx"), "-o", str(converted)).returncode == 0
    outputs = tmp_path / "out.npz"
    inputs = samples_dir / "moe_decoder.inputs.npz"
    done = cli("run", str(converted), "--inputs", str(inputs), "--outputs", str(outputs), "--json")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["simulated_latency_s"] > 0
    assert [layer["layer"] for layer in payload["layers"]] == [f"model.layers.{i}.mlp" for i in range(3)]
    assert all(layer["latency_s"] > 0 for layer in payload["layers"])
    feeds = dict(np.load(inputs))
    stock = ort.InferenceSession(str(samples_dir / "moe_decoder.onnx"), providers=["CPUExecutionProvider"])
    expected = stock.run(None, feeds)[0]
    got = np.load(outputs)["logits"]
    assert np.max(np.abs(got - expected)) <= 1e-5 * np.max(np.abs(expected))


def test_run_without_inputs_uses_random_feeds_from_the_signature(cli, samples_dir):
    done = cli("run", str(samples_dir / "moe_block.onnx"), "--json", "--seq-len", "5")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["outputs"]["output"]["shape"] == [1, 5, 64]
    assert payload["tokens"] == 5


def test_demo_checks_parity_and_prints_the_report(cli):
    done = cli("demo", "--decode-steps", "2")
    assert done.returncode == 0, done.stderr
    assert "OK" in done.stdout and "simulated latency" in done.stdout


def _assert_one_line_error(done, fragment: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert fragment in lines[0]


@pytest.mark.parametrize("command", ["convert", "run"])
def test_missing_model_is_a_one_line_error(cli, tmp_path, command):
    extra = ["-o", str(tmp_path / "o.onnx")] if command == "convert" else []
    _assert_one_line_error(cli(command, str(tmp_path / "absent.onnx"), *extra), "absent.onnx")
    assert not (tmp_path / "o.onnx").exists()


def test_non_onnx_file_is_a_one_line_error(cli, tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\x01 definitely not protobuf \xff" * 10)
    _assert_one_line_error(cli("convert", str(junk), "-o", str(tmp_path / "o.onnx")), "not an ONNX model")
    _assert_one_line_error(cli("run", str(junk)), "not an ONNX model")
    assert not (tmp_path / "o.onnx").exists()


def test_feeds_that_do_not_match_the_inputs_are_one_line_errors(cli, samples_dir, tmp_path):
    model = str(samples_dir / "moe_block.onnx")
    wrong_name = tmp_path / "wrong_name.npz"
    np.savez(wrong_name, tokens=np.zeros((1, 4, 64), np.float32))
    _assert_one_line_error(cli("run", model, "--inputs", str(wrong_name)), "unknown input 'tokens'")
    wrong_dtype = tmp_path / "wrong_dtype.npz"
    np.savez(wrong_dtype, hidden_states=np.zeros((1, 4, 64), np.int64))
    _assert_one_line_error(cli("run", model, "--inputs", str(wrong_dtype)), "must be float32")
    wrong_rank = tmp_path / "wrong_rank.npz"
    np.savez(wrong_rank, hidden_states=np.zeros((4, 64), np.float32))
    _assert_one_line_error(cli("run", model, "--inputs", str(wrong_rank)), "rank 3")
    wrong_width = tmp_path / "wrong_width.npz"
    np.savez(wrong_width, hidden_states=np.zeros((1, 4, 63), np.float32))
    _assert_one_line_error(cli("run", model, "--inputs", str(wrong_width)), "dimension 2 must be 64")
    not_npz = tmp_path / "feeds.npz"
    not_npz.write_text("hello")
    _assert_one_line_error(cli("run", model, "--inputs", str(not_npz)), "feeds.npz")
    out = tmp_path / "never.npz"
    _assert_one_line_error(cli("run", model, "--inputs", str(wrong_name), "--outputs", str(out)), "unknown input")
    assert not out.exists()


def test_unknown_hardware_and_invalid_hardware_file_name_the_problem(cli, samples_dir, tmp_path):
    model = str(samples_dir / "moe_block.onnx")
    _assert_one_line_error(cli("run", model, "--hw", "rtx9090"), "unknown hardware 'rtx9090'")
    bad = tmp_path / "bad.toml"
    bad.write_text(
        (samples_dir.parent / "hw_model" / "presets" / "paper.toml")
        .read_text()
        .replace("memory_bandwidth_bytes_per_s = 960e9", "memory_bandwidth_bytes_per_s = -1.0")
    )
    _assert_one_line_error(
        cli("convert", model, "-o", str(tmp_path / "o.onnx"), "--hw", str(bad)), "gpu.memory_bandwidth_bytes_per_s"
    )
    assert not (tmp_path / "o.onnx").exists()


def test_model_without_moe_converts_to_an_equivalent_model_and_runs(cli, tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    weight = onnx.numpy_helper.from_array(np.eye(4, dtype=np.float32) * 2, "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "plain", [x], [y], [weight])
    plain = tmp_path / "plain.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), plain)
    out = tmp_path / "plain.ndp.onnx"
    done = cli("convert", str(plain), "-o", str(out), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["moe_blocks"] == []
    assert onnx.load(out).graph.node[0].op_type == "MatMul"
    ran = cli("run", str(out), "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["layers"] == []


def test_strict_conversion_fails_when_a_block_is_skipped(cli, tmp_path):
    from sample_models.build_samples import build_moe_block

    model = build_moe_block()
    for node in model.graph.node:  # the combine no longer weights the experts by the router: not an MoE
        if node.op_type == "Mul" and any("Unsqueeze" in i for i in node.input) and "Squeeze" in node.input[0]:
            node.input[1] = node.input[0]
    path = tmp_path / "odd.onnx"
    onnx.save(model, path)
    lenient = cli("convert", str(path), "-o", str(tmp_path / "lenient.onnx"), "--json")
    assert lenient.returncode == 0, lenient.stderr
    payload = json.loads(lenient.stdout)
    assert payload["moe_blocks"] == [] and payload["skipped"], payload
    _assert_one_line_error(cli("convert", str(path), "-o", str(tmp_path / "strict.onnx"), "--strict"), "strict")
    assert not (tmp_path / "strict.onnx").exists()


def test_shard_count_that_does_not_divide_the_ffn_falls_back_to_its_largest_divisor(cli, samples_dir, tmp_path):
    out = tmp_path / "block.onnx"
    done = cli("convert", str(samples_dir / "moe_block.onnx"), "-o", str(out), "--shards", "3", "--json")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["shards"] == 3 and [b["shards"] for b in payload["moe_blocks"]] == [2]
    assert any("using 2 shards" in note for note in payload["notes"])
    node = next(n for n in onnx.load(out).graph.node if n.op_type == "ShardedMoEExperts")
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}["shards"] == 2
