"""Provider outputs equal stock ONNX Runtime on the original model across MoE shapes and shard counts."""

from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort
import pytest

from ndp_ep.session import InferenceSession
from sample_models.build_samples import MoEBlockSpec, build_moe_block

PARITY_RTOL = 1e-5  # max |provider - stock| / max |stock|
SWEEP = list(itertools.product((2, 4, 8), (1, 2), (1, 2, 4), (1, 7, 32)))


def relative_error(ours: np.ndarray, stock: np.ndarray) -> float:
    return float(np.max(np.abs(ours - stock)) / max(float(np.max(np.abs(stock))), 1e-30))


@pytest.mark.parametrize("experts,top_k,shards,tokens", SWEEP)
def test_provider_matches_stock_ort_and_shards_every_expert(experts, top_k, shards, tokens):
    spec = MoEBlockSpec(num_experts=experts, top_k=top_k, hidden=32, ffn=64, normalize=top_k > 1)
    model = build_moe_block(spec, seed=experts * 100 + top_k * 10 + shards)
    rng = np.random.default_rng(tokens)
    feeds = {"hidden_states": rng.standard_normal((1, tokens, spec.hidden)).astype(np.float32)}

    session = InferenceSession(model, hw="paper", shards=shards)
    ours = session.run(None, feeds)[0]
    stock = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]

    assert relative_error(ours, stock) <= PARITY_RTOL
    converted = session.converted_model
    sharded = [n for n in converted.graph.node if n.domain == "ndp_ep" and n.op_type == "ShardedMoEExperts"]
    assert len(sharded) == 1
    names = {t.name for t in converted.graph.initializer}
    gate_up = [n for n in names if n.endswith(".gate_up")]
    down = [n for n in names if n.endswith(".down")]
    assert len(gate_up) == len(down) == experts * shards
    assert f"moe.experts.{experts - 1}.shard{shards - 1}.gate_up" in names
    dims = {t.name: tuple(t.dims) for t in converted.graph.initializer}
    # the sample stacks are [E, 2I, H] and [E, H, I] ([out, in]): shards keep that layout (no transpose)
    assert dims["moe.experts.0.shard0.gate_up"] == (2 * spec.ffn // shards, spec.hidden)
    assert dims["moe.experts.0.shard0.down"] == (spec.hidden, spec.ffn // shards)
    assert "moe.experts.gate_up_proj" not in names  # the stacked weights are gone
    report = session.last_report
    assert report.tokens == tokens
    assert sum(report.layers[0].expert_tokens) == tokens * top_k
