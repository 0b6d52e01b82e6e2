"""``ndp-ep generate``: greedy GenAI generation on the provider gives GenAI's own tokens, plus per-step reports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[2] / "sample_models" / "genai" / "gpt_oss_fp32"
INSIDE = "must be a path inside the model folder (relative, no '..')"


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


def _step_shapes_of(fixture: str):
    import onnx

    from ndp_ep.genai import step_shapes

    folder = FIXTURE.parent / fixture
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    return step_shapes(model, json.loads((folder / "genai_config.json").read_text()))


def test_step_shapes_grow_the_past_a_token_a_step_with_the_configs_head_size_and_window():
    # gpt_oss_fp32's genai_config: head_size 16, 2 KV heads, layer 0 a sliding window of 8 (cache slack 0)
    shapes = _step_shapes_of("gpt_oss_fp32")
    assert shapes(16, 0) == {
        "input_ids": (1, 16),
        "attention_mask": (1, 16),
        "past_key_values.0.key": (1, 2, 8, 16),
        "past_key_values.1.key": (1, 2, 0, 16),
        "past_key_values.0.value": (1, 2, 8, 16),
        "past_key_values.1.value": (1, 2, 0, 16),
    }
    for step in (1, 5):  # decode step n: one token after the prompt and the n - 1 tokens generated before it
        assert shapes(1, 16 + step - 1) == {
            "input_ids": (1, 1),
            "attention_mask": (1, 16 + step),
            "past_key_values.0.key": (1, 2, 8, 16),
            "past_key_values.1.key": (1, 2, 15 + step, 16),
            "past_key_values.0.value": (1, 2, 8, 16),
            "past_key_values.1.value": (1, 2, 15 + step, 16),
        }


def test_step_shapes_keep_a_conv_state_at_its_declared_size():
    shapes = _step_shapes_of("lfm2_moe_fp32")
    assert shapes(1, 6) == {
        "input_ids": (1, 1),
        "attention_mask": (1, 7),
        "past_key_values.1.key": (1, 2, 6, 16),
        "past_key_values.1.value": (1, 2, 6, 16),
        "past.0.conv": (1, 64, 2),
        "past.2.conv": (1, 64, 2),
    }


# -- bad input: one line naming the file and the field, exit 2 (in-process through ndp_ep.cli.main) -------------


def _generate(*args: object, capsys) -> tuple[int, str, str]:
    from ndp_ep.cli import main

    capsys.readouterr()
    code = main(["generate", *(str(a) for a in args)])
    done = capsys.readouterr()
    return code, done.out, done.err


def _error_line(result: tuple[int, str, str]) -> str:
    code, _out, err = result
    assert code == 2, result
    (line,) = err.strip().splitlines()
    assert line.startswith("ndp-ep generate: error: ") and "Traceback" not in err
    return line


def _fixture_copy(tmp_path: Path, edit=None, name: str = "model") -> Path:
    """A copy of the gpt_oss_fp32 GenAI folder, its genai_config.json changed by ``edit(config)``."""
    if not FIXTURE.is_dir():
        pytest.skip(f"{FIXTURE} is built by sample_models/build_genai.py")
    folder = tmp_path / name
    shutil.copytree(FIXTURE, folder)
    if edit is not None:
        config = json.loads((folder / "genai_config.json").read_text())
        edit(config)
        (folder / "genai_config.json").write_text(json.dumps(config))
    return folder


def _set(path: str, value):
    def edit(config: dict) -> None:
        *parents, key = path.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        node[key] = value

    return edit


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("model.vocab_size", 0, "must be a positive integer, got 0"),
        ("model.vocab_size", "abc", "must be a positive integer, got 'abc'"),
        ("model.context_length", True, "must be a positive integer, got true"),
        ("model.decoder.head_size", "16", "must be a positive integer, got '16'"),
        ("model.decoder.sliding_window.window_size", -1, "must be a positive integer, got -1"),
        ("model.decoder.sliding_window.cache_slack", "0", "must be an integer >= 0, got '0'"),
        ("model.decoder.inputs.past_key_names", 3, "must be a string, got 3"),
        ("model.decoder.filename", "../outside/model.onnx", f"{INSIDE}, got '../outside/model.onnx'"),
        ("model.vocab_size", "7" * 300, f"must be a positive integer, got '{'7' * 196}..."),  # a blob is cut
        ("model.decoder.filename", "<outside>", INSIDE),  # an absolute path to a real model outside the folder
    ],
)
def test_a_bad_genai_config_value_is_one_line_naming_the_file_and_the_field(tmp_path, capsys, field, value, says):
    pytest.importorskip("onnxruntime_genai")
    if value == "<outside>":
        value = str(tmp_path / "outside" / "model.onnx")
        says = f"{says}, got {value!r}"
    folder = _fixture_copy(tmp_path, _set(field, value))
    shutil.copytree(FIXTURE, tmp_path / "outside")  # what a traversing filename would reach
    before = sorted(tmp_path.rglob("*"))
    line = _error_line(_generate(folder, "--prompt-tokens", "4", "--new-tokens", "2", capsys=capsys))
    assert line.endswith(f"{folder / 'genai_config.json'}: {field} {says}")
    assert sorted(tmp_path.rglob("*")) == before


def test_a_missing_decoder_section_is_named_as_the_missing_field(tmp_path, capsys):
    pytest.importorskip("onnxruntime_genai")
    folder = _fixture_copy(tmp_path, lambda config: config["model"].pop("decoder"))
    line = _error_line(_generate(folder, "--prompt-tokens", "4", "--new-tokens", "2", capsys=capsys))
    assert line.endswith(f"{folder / 'genai_config.json'}: model.decoder is missing")


def test_a_decoder_that_is_not_onnx_is_refused_by_the_checked_loader_in_one_line(tmp_path, capsys):
    pytest.importorskip("onnxruntime_genai")
    folder = _fixture_copy(tmp_path)
    (folder / "model.onnx").write_text("not a model\n")
    line = _error_line(_generate(folder, "--prompt-tokens", "4", "--new-tokens", "2", capsys=capsys))
    assert line.endswith(f"{folder / 'model.onnx'} is not an ONNX model (DecodeError)")


def test_bad_input_from_the_api_is_a_typed_error(tmp_path):
    pytest.importorskip("onnxruntime_genai")
    from ndp_ep.cli import build_parser
    from ndp_ep.commands import generate
    from ndp_ep.errors import ModelLoadError

    folder = _fixture_copy(tmp_path, _set("model.vocab_size", 0))
    argv = ["generate", str(folder), "--prompt-tokens", "4", "--new-tokens", "2"]
    with pytest.raises(ModelLoadError, match=r"model\.vocab_size must be a positive integer"):
        generate.run(build_parser(argv).parse_args(argv))


# -- the folder's layout, the names shown, the context length -----------------------------------------------------


def test_a_decoder_in_a_subfolder_is_converted_in_place_and_generates(tmp_path, capsys):
    pytest.importorskip("onnxruntime_genai")
    folder = _fixture_copy(tmp_path, _set("model.decoder.filename", "sub/model.onnx"))
    (folder / "sub").mkdir()
    for name in ("model.onnx", "model.onnx.data"):
        (folder / name).rename(folder / "sub" / name)
    code, out, err = _generate(folder, "--prompt-tokens", "4", "--new-tokens", "2", "--json", capsys=capsys)
    assert code == 0, err
    assert json.loads(out)["reference_tokens_identical"] is True


def test_generation_runs_twice_in_one_process(capsys):
    pytest.importorskip("onnxruntime_genai")
    if not FIXTURE.is_dir():
        pytest.skip(f"{FIXTURE} is built by sample_models/build_genai.py")
    for _ in range(2):  # GenAI keeps the provider library registered for the process
        code, _out, err = _generate(FIXTURE, "--prompt-tokens", "4", "--new-tokens", "2", "--no-check", capsys=capsys)
        assert code == 0, err


def test_json_names_the_users_folder_and_says_the_decoder_was_converted_in_memory(capsys):
    pytest.importorskip("onnxruntime_genai")
    if not FIXTURE.is_dir():
        pytest.skip(f"{FIXTURE} is built by sample_models/build_genai.py")
    code, out, err = _generate(FIXTURE, "--prompt-tokens", "4", "--new-tokens", "2", "--json", capsys=capsys)
    assert code == 0, err
    data = json.loads(out)
    assert (data["model_dir"], data["converted_in_memory"]) == (str(FIXTURE), True)


def test_a_genai_failure_names_the_users_folder_never_the_temporary_copy(tmp_path, capsys):
    pytest.importorskip("onnxruntime_genai")
    folder = _fixture_copy(tmp_path, _set("model.decoder.unknown_key", 1))  # GenAI's own parser refuses it
    line = _error_line(_generate(folder, "--prompt-tokens", "4", "--new-tokens", "2", capsys=capsys))
    # the reference (the folder itself, unconverted) runs first, so GenAI's refusal comes from it
    assert line.startswith(f"ndp-ep generate: error: onnxruntime-genai ({folder}): ")
    assert "ndp-ep-generate-" not in line and str(folder / "genai_config.json") in line


def test_the_default_sizes_beyond_the_context_length_are_refused_saying_what_fits(capsys):
    pytest.importorskip("onnxruntime_genai")
    if not FIXTURE.is_dir():
        pytest.skip(f"{FIXTURE} is built by sample_models/build_genai.py")
    line = _error_line(_generate(FIXTURE, capsys=capsys))
    assert line.endswith(
        f"--prompt-tokens 512 + --new-tokens 512 = 1,024 tokens exceed the context length 128 of "
        f"{FIXTURE / 'genai_config.json'} (model.context_length); pass sizes that add up to at most 128: "
        f"--prompt-tokens 64 --new-tokens 64 (the defaults, 512 each, are the paper's workload: they need a "
        f"context of 1,024)"
    )


def test_the_context_error_names_the_largest_new_tokens_for_this_prompt_and_prompt_for_these_new_tokens(capsys):
    pytest.importorskip("onnxruntime_genai")
    if not FIXTURE.is_dir():
        pytest.skip(f"{FIXTURE} is built by sample_models/build_genai.py")
    line = _error_line(_generate(FIXTURE, "--prompt-tokens", "100", "--new-tokens", "50", capsys=capsys))
    assert line.endswith("--new-tokens 28 to keep this prompt, or --prompt-tokens 78 to keep these new tokens")


def test_the_sizes_the_context_error_suggests_fill_the_context_and_run(capsys):
    import re

    pytest.importorskip("onnxruntime_genai")
    if not FIXTURE.is_dir():
        pytest.skip(f"{FIXTURE} is built by sample_models/build_genai.py")
    suggested = re.search(
        r"at most 128: (--prompt-tokens \d+ --new-tokens \d+)", _error_line(_generate(FIXTURE, capsys=capsys))
    )
    assert suggested, "no suggested sizes"
    code, out, err = _generate(FIXTURE, *suggested.group(1).split(), "--json", capsys=capsys)
    assert code == 0, err
    data = json.loads(out)
    assert len(data["prompt"]) + len(data["tokens"]) == 128 and data["reference_tokens_identical"] is True


def _genai_folder_on_the_provider(tmp_path, capsys) -> Path:
    """The fixture converted, its genai_config set as a model builder writes it for a GPU (the provider becomes the
    config's only one, so this runs on a CPU) and with room for every run of a generation in the reports."""
    from ndp_ep.cli import main

    converted = tmp_path / "converted"
    converted.mkdir()
    assert main(["convert", str(FIXTURE / "model.onnx"), "-o", str(converted / "model.onnx"), "--json"]) == 0
    capsys.readouterr()
    settings = json.loads((converted / "genai_config.json").read_text())
    settings["model"]["decoder"]["session_options"]["provider_options"] = [{"cuda": {"enable_cuda_graph": "0"}}]
    settings["model"]["context_length"] = 1000
    (converted / "genai_config.json").write_text(json.dumps(settings))
    return converted


def _greedy(og, model, prompt: list[int], new_tokens: int) -> None:
    import numpy as np

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + new_tokens, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray(prompt, dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()


def test_generation_reports_follow_genais_own_loop_step_by_step(tmp_path, capsys):
    og = pytest.importorskip("onnxruntime_genai")
    import ndp_ep

    converted = _genai_folder_on_the_provider(tmp_path, capsys)
    prompt = [5, 17, 3, 9, 30, 2]
    reports = ndp_ep.GenerationReports(converted, hw="paper", ndp_units=4, prompt_tokens=len(prompt))
    config = og.Config(str(converted))
    reports.add_provider(config)
    model = og.Model(config)
    _greedy(og, model, prompt, 3)
    runs = reports.reports  # the prefill, then one decode step per token after the first
    assert [(r.phase, r.tokens) for r in runs] == [("prefill", 6), ("decode", 1), ("decode", 1)]
    assert reports.reporter.report_ring == 1001
    assert all(r.non_expert_gpu_s > 0 for r in runs)  # each step costed at its shapes
    with pytest.raises(ndp_ep.NdpEpError, match="is not converted: run ndp-ep convert on it first"):
        ndp_ep.GenerationReports(FIXTURE)


def test_a_new_generation_is_costed_from_an_empty_kv_cache_and_a_prompt_not_declared_is_not_costed(tmp_path, capsys):
    og = pytest.importorskip("onnxruntime_genai")
    import ndp_ep
    from ndp_ep.reporter import UNTAGGED_NOTE

    converted = _genai_folder_on_the_provider(tmp_path, capsys)
    reports = ndp_ep.GenerationReports(converted, hw="paper", ndp_units=4, prompt_tokens=4)
    config = og.Config(str(converted))
    reports.add_provider(config)
    model = og.Model(config)
    _greedy(og, model, [5, 17, 3, 9], 4)
    reports.new_generation()  # before the runs of the first generation are read: they keep their own costs
    _greedy(og, model, [8, 1, 12, 6], 4)
    first, second = reports.reports[:4], reports.reports[4:]
    assert [r.tokens for r in first] == [r.tokens for r in second] == [4, 1, 1, 1]
    costs = [r.non_expert_gpu_s for r in first]
    assert costs == [r.non_expert_gpu_s for r in second]  # the same shapes, step by step
    assert len(set(costs[1:])) == 3  # a decode step costs more as the KV cache grows: each at its own past
    reports.new_generation(prompt_tokens=3)
    _greedy(og, model, [2, 2, 2, 2, 2, 2], 2)  # a prompt of 6 where 3 were declared (as a batch of 2 would be)
    mismatched = reports.reports[8]
    assert mismatched.tokens == 6 and mismatched.non_expert_gpu_s == 0 and UNTAGGED_NOTE in mismatched.notes
    with pytest.raises(ndp_ep.NdpEpError, match="prompt_tokens"):
        reports.new_generation(prompt_tokens=0)
