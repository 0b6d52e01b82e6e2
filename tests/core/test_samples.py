"""The bundled samples convert with the expected sharded ops and run with stock-ORT parity."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from ndp_ep.session import InferenceSession

EXPECTED = {
    # sample: [(block, experts, top_k)]
    "moe_block": [("moe", 8, 2)],
    "moe_decoder": [("model.layers.0.mlp", 8, 2), ("model.layers.1.mlp", 4, 1), ("model.layers.2.mlp", 8, 2)],
}


@pytest.mark.parametrize("sample", sorted(EXPECTED))
def test_sample_runs_like_stock_ort_with_one_sharded_op_per_block(sample, samples_dir):
    path = samples_dir / f"{sample}.onnx"
    feeds = dict(np.load(samples_dir / f"{sample}.inputs.npz"))
    session = InferenceSession(path, hw="paper", ndp_units=4)
    ours = session.run(None, feeds)
    stock = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(ours, stock, strict=True):
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b))
    ops = [n for n in session.converted_model.graph.node if n.op_type == "ShardedMoEExperts"]
    assert [(n.name.split("/")[0]) for n in ops] == [b for b, _, _ in EXPECTED[sample]]
    for node, (_, experts, top_k) in zip(ops, EXPECTED[sample], strict=True):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert (attrs["num_experts"], attrs["top_k"], attrs["shards"]) == (experts, top_k, 4)
        assert len(node.input) == 3 + 2 * experts * 4
        props = {p.key: p.value for p in node.metadata_props}
        assert json.loads(props["ndp_ep.placement"])["shard_to_ndp_unit"] == [0, 1, 2, 3]
        assert len(json.loads(props["ndp_ep.replaced_nodes"])) >= 13
    report = session.last_report
    assert [layer.name for layer in report.layers] == [b for b, _, _ in EXPECTED[sample]]
    assert report.simulated_latency_s > 0


def test_committed_samples_match_their_builder(samples_dir, tmp_path):
    from sample_models import build_samples

    assert onnx.load(samples_dir / "moe_block.onnx") == build_samples.build_moe_block()
    assert onnx.load(samples_dir / "moe_decoder.onnx") == build_samples.build_moe_decoder()


def test_blocks_claimed_twice_get_distinct_names_and_overlaps_are_skipped(samples_dir):
    import onnx

    from graph_passes.convert import convert
    from graph_passes.graph_index import GraphIndex
    from graph_passes.rules.gathered_experts import GatheredExpertsRule

    class RenamingRule:
        """Finds the same blocks as the general rule but names every one of them "moe"."""

        name = "renaming"

        def find(self, index: GraphIndex):
            import dataclasses

            found = GatheredExpertsRule().find(index)
            return [
                dataclasses.replace(c, readings=tuple(dataclasses.replace(r, name="moe") for r in c.readings))
                for c in found
            ]

    model = onnx.load(samples_dir / "moe_decoder.onnx")
    rewritten, report = convert(model, shards=2, rules=[RenamingRule(), GatheredExpertsRule()])
    assert [b.name for b in report.blocks] == ["moe", "moe_1", "moe_2"]
    assert [s.reason for s in report.skipped] == []  # the general rule's finds were the same outputs: ignored
    names = [t.name for t in rewritten.model.graph.initializer]
    assert len(names) == len(set(names))
