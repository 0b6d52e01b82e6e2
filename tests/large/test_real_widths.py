"""Converting a QMoE layer at a real model's widths does the work its output costs, not shards × parts × experts.

One layer at LFM2-8B-A1B's widths (hidden 2048, 32 experts top-4, expert FFN 1792, int4 blocks of 32, biases:
sample_models/build_real_widths.py, 0.23 GB) converted into 4 shards through ``ndp_ep.convert_model``, as
``ndp-ep convert`` does. Shards are slices of the packed rows and blocks, so the only dequantizing left is the
numerical proof's: the first ``top_k + 1`` experts (the block is over the check's budget at float32 size), each
matrix once. A conversion that dequantized experts to write their shards (each bias shard of each expert once
dequantized the whole expert: 160 experts' worth here) fails the byte count below.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import ndp_ep
from graph_passes import quant, weights
from sample_models.build_real_widths import RealWidthSpec, build_real_width_model

LFM2_LAYER = RealWidthSpec(layers=1, num_experts=32, top_k=4, hidden=2048, ffn=1792, precision="int4")
SHARDS = 4


@pytest.fixture(scope="module")
def lfm2_layer(tmp_path_factory) -> Path:
    return build_real_width_model(LFM2_LAYER, tmp_path_factory.mktemp("lfm2_layer"), seed=3)


def _expert_float32_bytes(spec: RealWidthSpec) -> int:
    """One expert's gate_up ``[2I, H]`` and down ``[H, I]`` matrices at float32 size."""
    return (2 * spec.ffn * spec.hidden + spec.hidden * spec.ffn) * 4


def test_int4_conversion_dequantizes_only_the_checked_sample(lfm2_layer, tmp_path, monkeypatch):
    dequantized = []
    original = quant.dequantize

    def counting(*args, **kwargs):
        out = original(*args, **kwargs)
        dequantized.append(out.nbytes)
        return out

    monkeypatch.setattr(quant, "dequantize", counting)
    result = ndp_ep.convert_model(lfm2_layer, tmp_path / "model.onnx", shards=SHARDS, external_data=True)
    (block,) = result.report.blocks
    assert block.checked_numerically and block.shards == SHARDS
    sampled = LFM2_LAYER.top_k + 1
    assert any(f"first {sampled} of {LFM2_LAYER.num_experts} experts" in note for note in result.report.notes)
    # the proof: gate_up (gate and up are its interleaved rows: one matrix) and down of each sampled expert the
    # router picks, once (the routing of the check's random logits picks some of the sampled experts, at least top-k)
    assert 2 * LFM2_LAYER.top_k <= len(dequantized) <= 2 * sampled
    assert set(dequantized) == {2 * LFM2_LAYER.ffn * LFM2_LAYER.hidden * 4, LFM2_LAYER.hidden * LFM2_LAYER.ffn * 4}
    assert sum(dequantized) <= sampled * _expert_float32_bytes(LFM2_LAYER)


def test_int4_shards_are_the_packed_source_rows_and_blocks(lfm2_layer, tmp_path):
    ndp_ep.convert_model(lfm2_layer, tmp_path / "model.onnx", shards=SHARDS, external_data=True)
    source = onnx.load(str(lfm2_layer), load_external_data=False)
    converted = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    src = weights.WeightStore(source, lfm2_layer.parent)
    out = weights.WeightStore(converted, tmp_path)
    width = LFM2_LAYER.ffn // SHARDS
    blocks = width // LFM2_LAYER.block
    prefix = "model.layers.0.moe"
    written = sum(out.nbytes(t.name) for t in converted.graph.initializer if ".experts." in t.name)
    read = sum(src.nbytes(t.name) for t in source.graph.initializer if ".experts." in t.name)
    assert written == read  # every packed byte, scale and bias exactly once: nothing dequantized or re-encoded
    for expert, shard in ((0, 0), (7, 3), (31, 1)):
        fc1 = src.expert(f"{prefix}.experts.gate_up_proj.qweight", expert)  # [2I, H/2]: gate rows even, up odd
        fc1_scales = src.expert(f"{prefix}.experts.gate_up_proj.scales", expert)
        fc2 = src.expert(f"{prefix}.experts.down_proj.qweight", expert)  # [H, I/2]
        fc2_scales = src.expert(f"{prefix}.experts.down_proj.scales", expert)
        rows = np.arange(shard * width, (shard + 1) * width)
        name = f"{prefix}.experts.{expert}.shard{shard}"
        np.testing.assert_array_equal(out.full(f"{name}.gate_up"), np.concatenate([fc1[2 * rows], fc1[2 * rows + 1]]))
        np.testing.assert_array_equal(
            out.full(f"{name}.gate_up_scales"), np.concatenate([fc1_scales[2 * rows], fc1_scales[2 * rows + 1]])
        )
        np.testing.assert_array_equal(out.full(f"{name}.down"), fc2[:, shard * width // 2 : (shard + 1) * width // 2])
        np.testing.assert_array_equal(
            out.full(f"{name}.down_scales"), fc2_scales[:, shard * blocks : (shard + 1) * blocks]
        )
