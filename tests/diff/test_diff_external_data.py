"""Models with external data: contents are compared by streaming hashes, and only the tensors that need it."""

from __future__ import annotations

import numpy as np
import onnx
from diff_sample_pairs import write_pair

from ndp_ep.diff import diff_models
from ndp_ep.diff.loading import load_snapshot


def test_external_pair_matches_embedded_pair_classification(tmp_path):
    for kind in ("identical", "renamed", "one_node_changed", "ndp_ep_rewrite"):
        embedded = diff_models(*write_pair(tmp_path / "embedded", kind))
        external = diff_models(*write_pair(tmp_path / "external", kind, external=True))
        assert dict(external.node_counts) == dict(embedded.node_counts), kind
        assert dict(external.initializer_counts) == dict(embedded.initializer_counts), kind
        assert [i.summary for i in external.initializers] == [i.summary for i in embedded.initializers], kind


def test_loading_does_not_read_weight_bytes(tmp_path):
    a, _ = write_pair(tmp_path, "identical", external=True)
    snapshot = load_snapshot(a)
    assert snapshot.embedded_raw == {} and snapshot.embedded_typed == {}
    assert {r.external is not None for r in snapshot.initializers.values()} == {True}
    assert snapshot.initializer_bytes == (8 * 16 + 16 + 16 * 8) * 4


def test_changed_bytes_in_external_file_are_detected(tmp_path):
    a, b = write_pair(tmp_path, "identical", external=True)
    snapshot = load_snapshot(b)
    location = snapshot.initializers["fc2.weight"].external
    data = bytearray((tmp_path / "identical_b.weights.bin").read_bytes())
    data[location.offset_bytes + 5] ^= 0x40
    (tmp_path / "identical_b.weights.bin").write_bytes(bytes(data))
    result = diff_models(a, b)
    assert [(i.status, i.summary) for i in result.initializers] == [("values_changed", "fc2.weight values changed")]
    assert not result.equivalent


def test_only_needed_tensors_are_hashed(tmp_path):
    """Split expert weights are compared by shape arithmetic: their bytes are never read."""
    a, b = write_pair(tmp_path, "ndp_ep_rewrite", external=True)
    result = diff_models(a, b)
    same_name_same_shape = {"moe0.gate.weight": 8 * 4 * 4, "top_k": 8}
    assert result.hashed_bytes == 2 * sum(same_name_same_shape.values())
    assert result.initializer_counts["split"] == 2


def test_same_external_range_is_equal_without_reading(tmp_path):
    a, _ = write_pair(tmp_path, "identical", external=True)
    model = onnx.load(str(a), load_external_data=False)
    model.graph.node[0].name = "renamed_but_same_weights"
    b = tmp_path / "same_weights.onnx"
    onnx.save(model, str(b))  # B points at A's weight file, same offsets
    result = diff_models(a, b)
    assert result.hashed_bytes == 0 and result.equivalent
    assert np.array_equal([n.status for n in result.nodes], ["renamed"])
