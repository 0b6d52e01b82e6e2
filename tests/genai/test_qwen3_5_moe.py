"""Qwen3.5-MoE as ONNX Runtime GenAI's builder exports it (``sample_models/build_genai.py``: three Gated DeltaNet
linear-attention layers to one full-attention layer, a QMoE/MoE op plus a sigmoid-gated shared expert per layer):
converted, it generates through GenAI on the provider the tokens stock GenAI generates. (Its logits against stock
ONNX Runtime are checked with every other fixture in test_genai_fixtures.py.)"""

from __future__ import annotations

from collections import Counter

import onnx
import pytest

from tests.genai.conftest import GENAI_DIR
from tests.genai.helpers import generate_converted

FIXTURE = GENAI_DIR / "qwen3_5_moe_int4"


def test_the_fixture_has_linear_and_full_attention_layers_and_shared_experts_beside_the_fused_op():
    model = onnx.load(str(FIXTURE / "model.onnx"), load_external_data=False)
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["QMoE"] == 4 and ops["LinearAttention"] == 3 and ops["GroupQueryAttention"] == 1
    assert ops["GatedAdd"] == 4  # each layer's shared expert, gated by a sigmoid, added to the experts' output
    assert sum("/shared_expert_gate/" in n.name for n in model.graph.node) >= 4


def test_a_converted_qwen3_5_moe_generates_the_tokens_of_stock_genai(tmp_path):
    pytest.importorskip("onnxruntime_genai")
    args = ("--reference", str(FIXTURE), "--prompt-tokens", "8", "--new-tokens", "6")
    data = generate_converted(FIXTURE, tmp_path / "converted", *args)
    assert data["reference_tokens_identical"] is True and len(data["tokens"]) == 6
