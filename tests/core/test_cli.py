"""The CLI contract: JSON schemas, exit codes, option validation, messages and conventions of every command.

Everything runs in-process through ``ndp_ep.cli.main`` (fast); one subprocess smoke test per command checks
what a user's shell sees (``diff``'s is in tests/diff/test_diff_cli.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ndp_ep.cli import main

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_models"


def call(*args: str, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    done = capsys.readouterr()
    return code, done.out, done.err


def assert_one_line_error(result: tuple[int, str, str], *fragments: str) -> str:
    code, _out, err = result
    assert code == 2, result
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def converted_decoder(tmp_path_factory) -> Path:
    """The sample decoder converted for the paper preset (4 NDP units, so 4 shards)."""
    out = tmp_path_factory.mktemp("converted") / "dec.ndp.onnx"
    assert main(["convert", str(SAMPLES / "moe_decoder.onnx"), "-o", str(out)]) == 0
    return out


def plain_model(path: Path) -> Path:
    """A one-MatMul model: nothing for ndp-ep to convert."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    weight = onnx.numpy_helper.from_array(np.eye(4, dtype=np.float32) * 2, "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "plain", [x], [y], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


# -- one subprocess smoke test per command -------------------------------------------------------------------


def test_convert_run_and_demo_work_as_processes(cli, tmp_path):
    out = tmp_path / "block.ndp.onnx"
    converted = cli("convert", str(SAMPLES / "moe_block.onnx"), "-o", str(out), "--json", cwd=tmp_path)
    assert converted.returncode == 0, converted.stderr
    assert json.loads(converted.stdout)["moe_blocks"][0]["num_experts"] == 8
    ran = cli("run", str(out), "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["simulated_latency_s"] > 0
    demo = cli("demo", "--decode-steps", "1", cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    assert "(ours)" in demo.stdout and "(strongest baseline)" in demo.stdout
    bad = cli("run", str(out), "--seq-len", "2e9", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--seq-len" in bad.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["block.ndp.onnx"]


# -- convert ---------------------------------------------------------------------------------------------------


def test_convert_json_lists_each_block_and_writes_the_model(tmp_path, capsys):
    out = tmp_path / "dec.onnx"
    code, stdout, _ = call("convert", SAMPLES / "moe_decoder.onnx", "-o", out, "--shards", "2", "--json", capsys=capsys)
    assert code == 0
    payload = json.loads(stdout)
    assert [(b["num_experts"], b["top_k"], b["hidden"], b["ffn"], b["shards"]) for b in payload["moe_blocks"]] == [
        (8, 2, 64, 128, 2),
        (4, 1, 64, 128, 2),
        (8, 2, 64, 128, 2),
    ]
    assert payload["skipped"] == []
    assert sum(n.op_type == "ShardedMoEExperts" for n in onnx.load(out).graph.node) == 3
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary files left behind"


def test_convert_text_uses_singular_and_plural_correctly(tmp_path, capsys):
    code, out, _ = call("convert", SAMPLES / "moe_decoder.onnx", "-o", tmp_path / "d.onnx", capsys=capsys)
    assert code == 0
    assert "converted 3 MoE blocks into sharded expert ops (placed for paper with 4 NDP units):" in out
    assert "  model.layers.1.mlp: 4 experts, top-1," in out
    assert not re.search(r"\b1 (experts|shards|nodes|blocks)\b", out) and "(s)" not in out


def test_model_without_moe_says_nothing_to_do_and_runs(tmp_path, capsys):
    plain = plain_model(tmp_path / "plain.onnx")
    out = tmp_path / "plain.ndp.onnx"
    code, stdout, _ = call("convert", plain, "-o", out, capsys=capsys)
    assert code == 0
    assert f"nothing to do: no MoE block found in {plain}" in stdout and "--strict" in stdout
    assert onnx.load(out).graph.node[0].op_type == "MatMul"
    code, stdout, _ = call("convert", plain, "-o", out, "--json", capsys=capsys)
    assert json.loads(stdout)["moe_blocks"] == []
    code, stdout, _ = call("run", out, "--json", capsys=capsys)
    assert code == 0 and json.loads(stdout)["layers"] == []


def test_strict_makes_nothing_to_convert_an_error_and_writes_nothing(tmp_path, capsys, converted_decoder):
    plain = plain_model(tmp_path / "plain.onnx")
    target = tmp_path / "strict.onnx"
    assert_one_line_error(call("convert", plain, "-o", target, "--strict", capsys=capsys), "strict", "no MoE block")
    assert_one_line_error(
        call("convert", converted_decoder, "-o", target, "--strict", capsys=capsys), "already converted", "3 "
    )
    assert not target.exists()


def test_already_converted_model_is_said_in_words(tmp_path, capsys, converted_decoder):
    code, out, _ = call("convert", converted_decoder, "-o", tmp_path / "again.onnx", capsys=capsys)
    assert code == 0
    assert "nothing to do" in out and "already converted (3 ndp_ep::ShardedMoEExperts nodes)" in out
    assert "3 converted expert op(s)" in out and "batched_mm" not in out  # no advice to re-export
    code, out, _ = call("convert", converted_decoder, "-o", tmp_path / "again.onnx", "--json", capsys=capsys)
    assert code == 0 and json.loads(out)["already_converted"] == 3


def test_strict_conversion_fails_when_a_block_is_skipped(tmp_path, capsys):
    from sample_models.build_samples import build_moe_block

    model = build_moe_block()
    for node in model.graph.node:  # the combine no longer weights the experts by the router: not an MoE
        if node.op_type == "Mul" and any("Unsqueeze" in i for i in node.input) and "Squeeze" in node.input[0]:
            node.input[1] = node.input[0]
    path = tmp_path / "odd.onnx"
    onnx.save(model, path)
    code, out, _ = call("convert", path, "-o", tmp_path / "lenient.onnx", "--json", capsys=capsys)
    assert code == 0
    payload = json.loads(out)
    assert payload["moe_blocks"] == [] and payload["skipped"], payload
    assert_one_line_error(call("convert", path, "-o", tmp_path / "strict.onnx", "--strict", capsys=capsys), "strict")
    assert not (tmp_path / "strict.onnx").exists()


def test_shard_count_that_does_not_divide_the_ffn_falls_back_to_its_largest_divisor(tmp_path, capsys):
    out = tmp_path / "block.onnx"
    code, stdout, _ = call("convert", SAMPLES / "moe_block.onnx", "-o", out, "--shards", "3", "--json", capsys=capsys)
    assert code == 0
    payload = json.loads(stdout)
    assert payload["shards"] == 3 and [b["shards"] for b in payload["moe_blocks"]] == [2]
    assert any("using 2 shards" in note for note in payload["notes"])
    node = next(n for n in onnx.load(out).graph.node if n.op_type == "ShardedMoEExperts")
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}["shards"] == 2


OUTPUT_OPTIONS = [
    ("convert", "-o/--output", [SAMPLES / "moe_block.onnx", "-o"]),
    ("run", "--outputs", [SAMPLES / "moe_block.onnx", "--outputs"]),
    ("diff", "--html", [SAMPLES / "moe_block.onnx", SAMPLES / "moe_block.onnx", "--html"]),
    ("diff", "--json-out", [SAMPLES / "moe_block.onnx", SAMPLES / "moe_block.onnx", "--json-out"]),
]


@pytest.mark.parametrize(("command", "option", "args"), OUTPUT_OPTIONS, ids=[f"{c} {o}" for c, o, _ in OUTPUT_OPTIONS])
def test_output_paths_that_cannot_be_written_name_the_users_path(tmp_path, capsys, command, option, args):
    line = assert_one_line_error(call(command, *args, tmp_path, capsys=capsys), f"argument {option}")
    assert f"{tmp_path}: it is a directory" in line and ".tmp" not in line
    missing = tmp_path / "no" / "such.out"
    line = assert_one_line_error(call(command, *args, missing, capsys=capsys), f"cannot write {missing}")
    assert_one_line_error(call(command, *args, "", capsys=capsys), "empty")
    assert list(tmp_path.iterdir()) == []


def test_demo_out_must_be_a_directory(tmp_path, capsys):
    afile = tmp_path / "f"
    afile.write_text("x")
    assert_one_line_error(call("demo", "--out", afile, capsys=capsys), f"{afile} is a file, not a directory")


# -- run -------------------------------------------------------------------------------------------------------


def test_run_json_reports_latency_per_layer_and_outputs_match_stock(tmp_path, capsys, converted_decoder):
    outputs = tmp_path / "out.npz"
    inputs = SAMPLES / "moe_decoder.inputs.npz"
    code, stdout, _ = call("run", converted_decoder, "--inputs", inputs, "--outputs", outputs, "--json", capsys=capsys)
    assert code == 0
    payload = json.loads(stdout)
    assert payload["simulated_latency_s"] > 0
    assert [layer["layer"] for layer in payload["layers"]] == [f"model.layers.{i}.mlp" for i in range(3)]
    assert all(layer["latency_s"] > 0 for layer in payload["layers"])
    feeds = dict(np.load(inputs))
    stock = ort.InferenceSession(str(SAMPLES / "moe_decoder.onnx"), providers=["CPUExecutionProvider"])
    expected = stock.run(None, feeds)[0]
    got = np.load(outputs)["logits"]
    assert np.max(np.abs(got - expected)) <= 1e-5 * np.max(np.abs(expected))


def test_run_without_inputs_uses_random_feeds_from_the_signature(capsys):
    code, stdout, _ = call("run", SAMPLES / "moe_block.onnx", "--json", "--seq-len", "5", capsys=capsys)
    assert code == 0
    payload = json.loads(stdout)
    assert payload["outputs"]["output"]["shape"] == [1, 5, 64]
    assert payload["tokens"] == 5


def test_run_warns_when_the_models_shards_differ_from_the_ndp_units(capsys, converted_decoder):
    code, _, err = call("run", converted_decoder, "--ndp-units", "2", capsys=capsys)
    assert code == 0
    (line,) = [line for line in err.strip().splitlines() if "random feeds" not in line]
    assert line.startswith("ndp-ep run: warning:")
    assert "split into 4 shards" in line and "2 NDP units" in line and "convert with --shards 2" in line
    code, _, err = call("run", converted_decoder, "--ndp-units", "3", capsys=capsys)  # ffn 128: 3 cannot divide it
    assert code == 0 and "over the hardware's 3 units" in err and "--shards" not in err
    code, _, err = call("run", converted_decoder, "--hw", "paper", capsys=capsys)
    assert code == 0 and "warning" not in err


def test_the_shard_advice_is_given_only_where_a_conversion_could_follow_it(capsys):
    # int8 experts, FFN 64 in quantization blocks of 32: a conversion for 4 NDP units makes 2 shards at most
    int8 = SAMPLES / "genai" / "gpt_oss_int8" / "model.onnx"
    code, _, err = call("run", int8, "--ndp-units", "4", capsys=capsys)
    assert code == 0
    (warning,) = [line for line in err.splitlines() if "warning" in line]
    assert "split into 2 shards" in warning and "--shards" not in warning  # converting again would change nothing


def test_run_on_a_gpu_only_hardware_file_simulates_the_gpu_policy_without_a_shard_warning(tmp_path, capsys):
    text = (REPO / "hw_model" / "presets" / "paper.toml").read_text(encoding="utf-8")
    assert "\nnum_ndp_units = 4\n" in text
    gpu_only = tmp_path / "gpu_only.toml"
    gpu_only.write_text(text.replace("\nnum_ndp_units = 4\n", "\nnum_ndp_units = 0\n", 1), encoding="utf-8")
    code, stdout, err = call(
        "run", SAMPLES / "moe_decoder.onnx", "--hw", gpu_only, "--policy", "gpu-offload", "--json", capsys=capsys
    )
    assert code == 0 and "warning" not in err and "Traceback" not in err
    assert json.loads(stdout)["ndp_units"] == 0


def test_run_policy_is_used_and_reported(capsys):
    code, stdout, _ = call("run", SAMPLES / "moe_block.onnx", "--policy", "monde", "--json", capsys=capsys)
    assert code == 0 and json.loads(stdout)["policy"] == "monde"


# -- errors: one line, exit 2, the user's words ---------------------------------------------------------------


@pytest.mark.parametrize("command", ["convert", "run"])
def test_missing_model_is_a_one_line_error(tmp_path, capsys, command):
    extra = ["-o", str(tmp_path / "o.onnx")] if command == "convert" else []
    assert_one_line_error(call(command, tmp_path / "absent.onnx", *extra, capsys=capsys), "absent.onnx")
    assert not (tmp_path / "o.onnx").exists()


def test_non_onnx_file_is_a_one_line_error(tmp_path, capsys):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\x01 definitely not protobuf \xff" * 10)
    assert_one_line_error(call("convert", junk, "-o", tmp_path / "o.onnx", capsys=capsys), "not an ONNX model")
    assert_one_line_error(call("run", junk, capsys=capsys), "not an ONNX model")
    assert not (tmp_path / "o.onnx").exists()


def test_feeds_that_do_not_match_the_inputs_are_one_line_errors(tmp_path, capsys):
    model = SAMPLES / "moe_block.onnx"
    cases = {
        "wrong_name": ({"tokens": np.zeros((1, 4, 64), np.float32)}, "unknown input 'tokens'"),
        "wrong_dtype": ({"hidden_states": np.zeros((1, 4, 64), np.int64)}, "must be float32"),
        "wrong_rank": ({"hidden_states": np.zeros((4, 64), np.float32)}, "rank 3"),
        "wrong_width": ({"hidden_states": np.zeros((1, 4, 63), np.float32)}, "dimension 2 must be 64"),
    }
    for name, (arrays, fragment) in cases.items():
        np.savez(tmp_path / f"{name}.npz", **arrays)
        assert_one_line_error(call("run", model, "--inputs", tmp_path / f"{name}.npz", capsys=capsys), fragment)
    not_npz = tmp_path / "feeds.npz"
    not_npz.write_text("hello")
    assert_one_line_error(call("run", model, "--inputs", not_npz, capsys=capsys), "feeds.npz")
    out = tmp_path / "never.npz"
    wrong = tmp_path / "wrong_name.npz"
    assert_one_line_error(call("run", model, "--inputs", wrong, "--outputs", out, capsys=capsys), "unknown input")
    assert not out.exists()


@pytest.mark.parametrize(
    "ids",
    [np.full((1, 3), 10**6, np.int64), np.zeros((1, 0), np.int64)],
    ids=["token-ids-beyond-the-vocabulary", "empty-sequence"],
)
def test_a_run_failing_inside_onnx_runtime_is_one_line_on_stderr(tmp_path, capfd, ids):
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, input_ids=ids)
    capfd.readouterr()
    code = main(["run", str(SAMPLES / "moe_decoder.onnx"), "--inputs", str(feeds)])
    err = capfd.readouterr().err  # ONNX Runtime's own log would be written to the process's stderr
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("ndp-ep run: error: the model failed while running"), err


def test_a_run_needing_more_memory_than_is_available_is_refused_before_it_starts(tmp_path, capfd, monkeypatch):
    import ndp_io

    # 4,096 tokens: each layer's attention scores are [1, 4096, 4096] float32 (64 MiB); the causal mask's Add reads
    # them and the [4096, 4096] float32 mask and writes as many scores (192 MiB at once); the experts run in the
    # provider, grouped by expert, and do not count
    monkeypatch.setattr(ndp_io, "available_memory_bytes", lambda: 150 << 20)
    np.savez(tmp_path / "feeds.npz", input_ids=np.zeros((1, 4096), np.int64))
    out = tmp_path / "out.npz"
    capfd.readouterr()
    code = main(
        ["run", str(SAMPLES / "moe_decoder.onnx"), "--inputs", str(tmp_path / "feeds.npz"), "--outputs", str(out)]
    )
    err = capfd.readouterr().err
    assert code == 2 and err.count("\n") == 1 and not out.exists(), err
    assert err.startswith("ndp-ep run: error: the run needs at least 192.0 MiB (the inputs and outputs of ")
    assert err.endswith("and 150.0 MiB of memory is available\n")


@pytest.mark.parametrize("model", ["moe_decoder.onnx", "hf/gpt_oss_block_dynamo.onnx"])
def test_inspect_counts_the_nodes_replaced_that_convert_prints_and_removes(tmp_path, capsys, model):
    source = SAMPLES / model
    out = tmp_path / "converted.onnx"
    code, converted, _ = call("convert", source, "-o", out, "--json", capsys=capsys)
    assert code == 0
    code, inspected, _ = call("inspect", source, "--json", capsys=capsys)
    assert code == 0
    counts = {b["name"]: b["replaced_nodes"] for b in json.loads(inspected)["moe_blocks"]}
    assert counts == {b["name"]: b["replaced_nodes"] for b in json.loads(converted)["moe_blocks"]}
    names = [{n.name for n in onnx.load(path, load_external_data=False).graph.node} for path in (source, out)]
    assert sum(counts.values()) == len(names[0] - names[1])  # every node the conversion removed, counted once
    code, text, _ = call("inspect", source, capsys=capsys)
    assert [int(n) for n in re.findall(r"(\d+) nodes replaced", text)] == list(counts.values())


def test_unknown_hardware_and_invalid_hardware_file_name_the_problem(tmp_path, capsys):
    model = SAMPLES / "moe_block.onnx"
    assert_one_line_error(call("run", model, "--hw", "rtx9090", capsys=capsys), "unknown hardware 'rtx9090'")
    bad = tmp_path / "bad.toml"
    bad.write_text(
        (REPO / "hw_model" / "presets" / "paper.toml")
        .read_text()
        .replace("memory_bandwidth_bytes_per_s = 960e9", "memory_bandwidth_bytes_per_s = -1.0")
    )
    assert_one_line_error(
        call("convert", model, "-o", tmp_path / "o.onnx", "--hw", bad, capsys=capsys),
        "gpu.memory_bandwidth_bytes_per_s",
    )
    assert not (tmp_path / "o.onnx").exists()


BAD_VALUES = {
    "--ndp-units": ("1e8", "10000", "0", "-1", "2.5"),
    "--shards": ("0", "100000"),
    "--seq-len": ("0", "-1", "1e5", "2000000000"),
    "--seed": ("-1",),
    "--prompt-tokens": ("0", "65537", "1e3"),
    "--new-tokens": ("0", "65537", "1e3"),
}
OPTIONS_OF = {
    "convert": ("--ndp-units", "--shards"),
    "inspect": ("--shards",),
    "run": ("--ndp-units", "--seq-len", "--seed"),
    "demo": ("--ndp-units",),
    "generate": ("--ndp-units", "--shards", "--seed", "--prompt-tokens", "--new-tokens"),
}
BAD_OPTION_CASES = [(c, o, v) for c, options in OPTIONS_OF.items() for o in options for v in BAD_VALUES[o]]


@pytest.mark.parametrize(("command", "option", "value"), BAD_OPTION_CASES)
def test_out_of_range_options_are_refused_alike_in_every_command(tmp_path, capsys, command, option, value):
    positional = {
        "convert": [SAMPLES / "moe_block.onnx", "-o", tmp_path / "o.onnx"],
        "inspect": [SAMPLES / "moe_block.onnx"],
        "run": [SAMPLES / "moe_block.onnx"],
        "generate": [tmp_path / "genai_folder"],
    }
    line = assert_one_line_error(call(command, *positional.get(command, []), f"{option}={value}", capsys=capsys))
    assert line.startswith(f"ndp-ep {command}: error: argument {option}") and "expected an integer" in line
    assert list(tmp_path.iterdir()) == []


def test_graph_pass_errors_are_translated_in_one_place():
    from graph_passes.errors import GraphPassError, InvalidModelError, UnsupportedModelError
    from graph_passes.sharded_op import ShardedOpError
    from ndp_ep.errors import ConversionError, ModelLoadError, graph_pass_errors, translate_graph_pass_error

    expected = {
        InvalidModelError: ModelLoadError,
        ShardedOpError: ModelLoadError,
        UnsupportedModelError: ConversionError,
        GraphPassError: ConversionError,
    }
    for source, target in expected.items():
        translated = translate_graph_pass_error(source("why"))
        assert type(translated) is target and str(translated) == "why"
        with pytest.raises(target, match="why"), graph_pass_errors():
            raise source("why")
    assert translate_graph_pass_error(KeyError("x")) is None
    with pytest.raises(KeyError), graph_pass_errors():
        raise KeyError("x")


# -- conventions: --version, --help, the working directory ------------------------------------------------------


def test_version_is_the_projects_version_and_names_the_simulator_core(capsys):
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    code, out, _ = call("--version", capsys=capsys)
    assert code == 0 and out.splitlines()[0] == f"ndp-ep {declared}"
    assert out.splitlines()[1:] == ["simulator core: pure Python"]  # the suite imports the source tree


def test_help_lists_defaults_presets_and_policy_choices(capsys):
    presets = sorted(p.stem for p in (REPO / "hw_model" / "presets").glob("*.toml"))
    assert presets, "no hardware presets found"
    from hw_model.policies import POLICIES

    code, out, _ = call("run", "--help", capsys=capsys)
    text = " ".join(out.split())
    assert code == 0
    assert "(default: 8)" in text and "(default: 0)" in text and "(default: paper)" in text
    assert "(default: tp+lb+prefetch)" in text
    assert all(name in text for name in presets) and all(name in text for name in POLICIES)
    for command in ("convert", "demo", "diff", "generate"):
        code, out, _ = call(command, "--help", capsys=capsys)
        assert code == 0 and all(name in " ".join(out.split()) for name in presets if command != "diff")
    code, out, _ = call("convert", "--help", capsys=capsys)
    assert "OUT.onnx.data" in out and "OUT.data" not in out.replace("OUT.onnx.data", "")


def test_commands_write_nothing_to_the_working_directory_unasked(tmp_path, capsys, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    elsewhere = tmp_path / "out.onnx"
    assert call("convert", SAMPLES / "moe_block.onnx", "-o", elsewhere, capsys=capsys)[0] == 0
    assert call("run", elsewhere, capsys=capsys)[0] == 0
    assert call("demo", "--decode-steps", "1", capsys=capsys)[0] == 0
    assert call("diff", SAMPLES / "moe_block.onnx", elsewhere, capsys=capsys)[0] == 1
    assert list(cwd.iterdir()) == []
