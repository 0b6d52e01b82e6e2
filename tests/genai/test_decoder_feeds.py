"""First-step feeds for KV-cache decoders, with and without ``genai_config.json``: stock ONNX Runtime accepts
them, caches are empty (sliding-window caches at their window), masks cover past + new tokens."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from graph_passes.feeds import DecoderConfig, is_kv_cache_decoder, random_feeds, read_genai_config
from tests.genai.conftest import GENAI_DIR, manifest

CPU_FIXTURES = sorted(n for n, e in manifest().items() if e["cpu_outputs"])


# the graph alone does not give Qwen3.5's KV head size: its GroupQueryAttention reads a gated, normed query, not a
# projection of the head width (ndp-ep reads genai_config.json, which a GenAI folder always has)
GRAPH_ONLY_UNKNOWN_HEAD_SIZE = {"qwen3_5_moe"}


@pytest.mark.parametrize("with_config", [True, False], ids=["genai_config", "graph_only"])
@pytest.mark.parametrize("name", CPU_FIXTURES)
def test_first_step_feeds_run_in_stock_onnxruntime(name, with_config):
    if not with_config and manifest()[name]["arch"] in GRAPH_ONLY_UNKNOWN_HEAD_SIZE:
        pytest.xfail("the KV head size is not read off this graph without genai_config.json")
    path = GENAI_DIR / name / "model.onnx"
    model = onnx.load(str(path), load_external_data=False)
    assert is_kv_cache_decoder(model)
    config = read_genai_config(path) if with_config else None
    decoder = read_genai_config(path)
    feeds = random_feeds(model, seed=1, seq_len=3, config=config)
    assert feeds["attention_mask"].shape == (1, 3) and feeds["attention_mask"].all()
    assert feeds["input_ids"].max() < 100  # the fixtures' vocabulary
    for value in model.graph.input:
        dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        if value.name.startswith("past_key_values."):
            expected_length = 8 if dims[2] == "past_sliding_length" else 0  # gpt-oss sliding window: 8
            assert feeds[value.name].shape == (1, decoder.num_key_value_heads, expected_length, decoder.head_size)
            assert not feeds[value.name].any()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], feeds)[0]
    assert logits.shape[:2] == (1, 3) and np.isfinite(logits).all()


def test_the_genai_config_gives_the_decoder_facts():
    config = read_genai_config(GENAI_DIR / "gpt_oss_fp32" / "model.onnx")
    assert config == DecoderConfig(
        head_size=16, num_key_value_heads=2, vocab_size=100, sliding_window=8, context_length=128
    )
    assert read_genai_config(GENAI_DIR.parent / "moe_block.onnx") is None


def test_a_decoder_config_refuses_non_positive_sizes():
    with pytest.raises(ValueError, match="head_size"):
        DecoderConfig(head_size=0)


def test_run_refuses_a_seq_len_beyond_the_genai_context_length_in_one_line(capsys):
    from ndp_ep.cli import main

    path = GENAI_DIR / "lfm2_moe_fp32" / "model.onnx"  # context_length 128
    capsys.readouterr()
    assert main(["run", str(path), "--seq-len", "129"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"ndp-ep run: error: --seq-len 129 exceeds the context length 128 of {path.parent / 'genai_config.json'} "
        "(model.context_length); pass --seq-len 128 or less"
    )
