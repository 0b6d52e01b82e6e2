"""The region drawings: full node names (wrapped, with a tooltip), the weights a node reads, edge tensor names."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from ndp_ep.diff import diff_models
from ndp_ep.diff.result import DrawEdge, DrawNode, RegionSide
from ndp_ep.diff.svg import draw_region_side, wrap_label

SVG = "{http://www.w3.org/2000/svg}"


@pytest.mark.parametrize(
    "label",
    ["/model/layers.0/mlp/experts/ShardedMoEExperts", "short", "x" * 75, "model.layers.12.mlp/ShardedMoEExperts", ""],
)
def test_wrapped_label_gives_the_whole_name_back_in_short_lines(label):
    lines = wrap_label(label, 30)
    assert "".join(lines) == label and all(len(line) <= 30 for line in lines)


def test_label_breaks_after_separators_when_it_can():
    assert wrap_label("/model/layers.0/mlp/experts/ShardedMoEExperts", 20) == [
        "/model/layers.0/mlp/",
        "experts/",
        "ShardedMoEExperts",
    ]


def _texts(group: ET.Element, css_class: str) -> list[str]:
    return [t.text or "" for t in group.iter(f"{SVG}text") if t.get("class") == css_class]


def test_drawing_shows_full_names_weights_and_edge_tensors():
    long_name = "/model/layers.0/mlp/experts/a_very_long_node_name_that_used_to_be_cut/ShardedMoEExperts"
    weights = ("gate_up: 4 experts × 2 shards of [8, 4]",)
    side = RegionSide(
        nodes=(
            DrawNode("b0", "router/TopK", "TopK", "context"),
            DrawNode("b1", long_name, "ndp_ep::ShardedMoEExperts", "added", weights),
        ),
        edges=(DrawEdge("b0", "b1", "expert_ids"), DrawEdge("b0", "b1", "routing_weights")),
        omitted_nodes=0,
    )
    root = ET.fromstring(draw_region_side(side, "after"))
    groups = {g.find(f"{SVG}title").text.split(" (")[0]: g for g in root.iter(f"{SVG}g") if "node" in g.get("class")}
    sharded = groups[long_name]
    assert "".join(_texts(sharded, "label")) == long_name
    assert _texts(sharded, "weights") == ["gate_up: 4 experts × 2 shards of [8, 4]"]
    assert "gate_up: 4 experts × 2 shards of [8, 4]" in sharded.find(f"{SVG}title").text
    edge_titles = sorted(g.find(f"{SVG}title").text for g in root.iter(f"{SVG}g") if g.get("class") == "edge-label")
    assert edge_titles == ["expert_ids", "routing_weights"]
    rect = sharded.find(f"{SVG}rect")
    lines = len(_texts(sharded, "label")) + len(_texts(sharded, "weights")) + 1
    assert float(rect.get("height")) >= lines * 10  # the box grows with its text


def test_rewrite_drawing_shows_the_shard_weights_and_tensor_names(sample_pairs, tmp_path):
    (region,) = diff_models(*sample_pairs["ndp_ep_rewrite"]).regions
    sharded = next(n for n in region.after.nodes if n.op == "ndp_ep::ShardedMoEExperts")
    assert sharded.weights == (
        "gate_up: 4 experts × 2 shards of [8, 4]",
        "down: 4 experts × 2 shards of [2, 8]",
    )
    tensors = {e.tensor for e in region.after.edges}
    assert {"expert_ids", "routing_weights", "moe_out"} <= tensors
    before = {n.label: n for n in region.before.nodes}
    assert before["moe0.experts/Einsum_gate_up"].weights == ("moe0.experts.gate_up_proj [4, 8, 8]",)
    svg = draw_region_side(region.after, "after")
    assert "gate_up: 4 experts × 2 shards of [8, 4]" in svg and ">expert_ids<" in svg


def test_region_side_refuses_edges_to_nodes_not_drawn():
    with pytest.raises(ValueError, match="not drawn"):
        RegionSide(nodes=(DrawNode("a0", "n", "Relu", "added"),), edges=(DrawEdge("a0", "a9", "t"),), omitted_nodes=0)
