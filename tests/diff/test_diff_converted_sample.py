"""The diff of a real ndp-ep conversion of sample_models/moe_block.onnx (made by graph_passes.convert)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from ndp_ep.cli import main
from ndp_ep.diff import diff_models

SAMPLE = Path(__file__).resolve().parents[2] / "sample_models" / "moe_block.onnx"
SHARDS = 2


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`ndp-ep convert sample_models/moe_block.onnx --shards 2` into a temporary directory; a conversion that
    fails is a test failure, never a skip."""
    assert SAMPLE.is_file(), f"{SAMPLE} is absent (built by python -m sample_models.build_samples)"
    target = tmp_path_factory.mktemp("converted") / "moe_block.ndp.onnx"
    code = main(["convert", str(SAMPLE), "-o", str(target), "--shards", str(SHARDS)])
    assert code == 0 and target.is_file(), f"ndp-ep convert could not convert {SAMPLE.name} (exit {code})"
    return target


def test_converted_sample_shows_each_block_with_its_shards(converted):
    result = diff_models(SAMPLE, converted)
    assert not result.equivalent
    model_b = onnx.load(str(converted), load_external_data=False)
    sharded = [n for n in model_b.graph.node if n.op_type == "ShardedMoEExperts" and n.domain == "ndp_ep"]
    assert len(result.moe_blocks) == len(sharded) >= 1
    for block, node in zip(result.moe_blocks, sharded, strict=True):
        props = {p.key: p.value for p in node.metadata_props}
        listed = json.loads(props["ndp_ep.replaced_nodes"])
        assert block.replaced_source == "metadata" and sorted(r.name for r in block.replaced_nodes) == sorted(listed)
        assert block.shards == SHARDS and block.num_experts and block.top_k
        splits = [i for i in block.initializers if i.status == "split"]
        expected_tail = f"{block.num_experts} experts × {SHARDS} shards of"
        assert len(splits) >= 2 and all(expected_tail in i.summary for i in splits)
        assert all(i.a_bytes == i.b_bytes for i in splits)
    blocks = {b.block for b in result.moe_blocks}
    # Nothing outside the blocks changed: every removed/added node is accounted for by a block.
    assert all(n.block in blocks for n in result.nodes if n.status in ("removed", "added"))
    assert result.node_counts["changed"] == 0
    assert [(o.domain, o.b) for o in result.opsets] == [("ndp_ep", 1)]


def test_converted_sample_cli_text_and_exit_code(converted, capsys):
    capsys.readouterr()
    assert main(["diff", str(SAMPLE), str(converted)]) == 1
    out = capsys.readouterr().out
    assert "MoE blocks rewritten by ndp-ep (1)" in out and "→ 1 ndp_ep::ShardedMoEExperts" in out
    assert f"× {SHARDS} shards of" in out


def test_text_fits_80_columns_and_keeps_every_word_whole(converted, capsys):
    capsys.readouterr()
    main(["diff", str(SAMPLE), str(converted)])
    out = capsys.readouterr().out
    # the two paths are printed whole, however long the checkout's path is: measured as one-letter names
    shown = out.replace(str(SAMPLE), "a").replace(str(converted), "b")
    assert max(len(line) for line in shown.splitlines()) <= 80
    model_b = onnx.load(str(converted), load_external_data=False)
    node = next(n for n in model_b.graph.node if n.op_type == "ShardedMoEExperts")
    placement = json.loads({p.key: p.value for p in node.metadata_props}["ndp_ep.placement"])
    flowing = " ".join(out.split())  # continuation lines joined back
    assert f"note {placement['note']}" in flowing  # the whole note, not cut mid-word
    assert "replaced nodes: recorded by ndp-ep at conversion" in flowing and "from: metadata" not in flowing
