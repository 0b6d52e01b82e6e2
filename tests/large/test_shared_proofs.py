"""The numeric proof runs once per block signature: blocks with the signature of a block already checked are covered by
that check once their shards, as written, prove to be exact byte views of their own weights; a covered block whose
shards are not converts again with every block checked on its own (fail closed)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import graph_passes.weights as weights_module
import ndp_ep.convert as ndp_convert
from graph_passes import verify
from graph_passes.convert import convert
from graph_passes.shard_audit import ShardAudit, SourceRange

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from sample_models.build_real_widths import RealWidthSpec, build_real_width_model  # noqa: E402

LAYERS = 4
DIFFERENT = 2  # the layer whose top-k differs from the others'


@pytest.fixture
def four_layers(tmp_path, monkeypatch) -> Path:
    """Four fused int4 MoE layers, all alike but layer 2 (top-1 instead of top-2); every expert tensor stays in
    external data, as a real model's do (the tiny fixture's biases and scales would otherwise be read inline)."""
    monkeypatch.setattr(weights_module, "INLINE_MAX_BYTES", 0)
    path = build_real_width_model(RealWidthSpec(LAYERS, 8, 2, 256, 128, "int4"), tmp_path / "model")
    model = onnx.load(str(path), load_external_data=False)
    (node,) = [n for n in model.graph.node if n.op_type == "QMoE" and f"layers.{DIFFERENT}/" in n.name]
    (k,) = [a for a in node.attribute if a.name == "k"]
    k.i = 1
    onnx.save(model, str(path))
    return path


@pytest.fixture
def proofs(monkeypatch) -> list[str]:
    """The isolated regions ONNX Runtime runs to check blocks (one per numeric proof), by graph name."""
    runs: list[str] = []
    capture = verify._capture

    def counted(probe, *args, **kwargs):
        runs.append(probe.graph.name)
        return capture(probe, *args, **kwargs)

    monkeypatch.setattr(verify, "_capture", counted)
    return runs


def _with_budget(monkeypatch, budget: int | None) -> None:
    """Check blocks on their first experts (``budget`` bytes, below a whole block) or whole (None)."""
    if budget is None:
        return
    monkeypatch.setattr(ndp_convert, "convert", lambda *a, **k: convert(*a, max_check_weight_bytes=budget, **k))


def _data(path: Path) -> bytes:
    return path.with_name(path.name + ".data").read_bytes()


@pytest.mark.parametrize("budget", [None, 2 << 20], ids=["whole", "first-experts"])
def test_the_proof_runs_once_per_signature_and_covers_the_other_blocks(four_layers, proofs, monkeypatch, budget):
    _with_budget(monkeypatch, budget)
    every = ndp_convert.convert_model(four_layers, four_layers.with_name("every.onnx"), prove_every_block=True)
    assert len(proofs) == LAYERS and all(not b.proven_by for b in every.report.blocks)
    del proofs[:]
    shared = ndp_convert.convert_model(four_layers, four_layers.with_name("shared.onnx"))
    assert sorted(proofs) == [f"model.layers.{i}.moe/isolated" for i in (0, DIFFERENT)]
    covered = {b.name: b.proven_by for b in shared.report.blocks}
    assert covered == {
        "model.layers.0.moe": "",
        "model.layers.1.moe": "model.layers.0.moe",
        f"model.layers.{DIFFERENT}.moe": "",
        "model.layers.3.moe": "model.layers.0.moe",
    }
    assert all(b.checked_numerically for b in shared.report.blocks)
    assert _data(four_layers.with_name("shared.onnx")) == _data(four_layers.with_name("every.onnx"))


def test_a_covered_block_whose_shards_are_not_views_of_its_weights_converts_again_proving_every_block(
    four_layers, proofs, monkeypatch
):
    expert = weights_module.WeightStore.expert

    def copied_for_layer_1(store, name, index):  # a rewrite that copies layer 1's bytes instead of viewing them
        found = expert(store, name, index)
        return np.array(found) if name.startswith("model.layers.1.") else found

    monkeypatch.setattr(weights_module.WeightStore, "expert", copied_for_layer_1)
    result = ndp_convert.convert_model(four_layers, four_layers.with_name("out.onnx"))
    assert len(proofs) == 2 + LAYERS  # shared (refused at commit), then every block on its own
    assert all(not b.proven_by and b.checked_numerically for b in result.report.blocks)
    notes = result.report.notes
    assert any("model.layers.1.moe: its shards do not tile its weights" in note for note in notes), notes


def test_the_audit_refuses_shards_read_from_another_blocks_weights(tmp_path):
    data = tmp_path / "w.data"
    np.arange(64, dtype=np.uint8).tofile(data)
    mapped = np.memmap(data, dtype=np.uint8, mode="r")
    own, other = SourceRange(str(data), 0, 32, 2), SourceRange(str(data), 32, 32, 2)
    audit = ShardAudit("block", {"w": own}, tensors=2)
    audit.record("w.e0", 0, mapped[0:16])
    audit.record("w.e1", 1, mapped[48:64])  # expert 1's shard, but from the other tensor's bytes
    assert "outside its expert's windows" in audit.holds()
    audit = ShardAudit("block", {"w": own, "v": other}, tensors=2)
    audit.record("w.e0", 0, mapped[0:16].reshape(4, 4)[:, :2])  # half of expert 0: the rest never written
    audit.record("w.e1", 1, mapped[16:32])
    assert "do not tile" in audit.holds()
    audit = ShardAudit("block", {"w": own}, tensors=2)
    audit.record("w.e0", 0, (mapped[0:16].reshape(4, 4)[:, :2], mapped[0:16].reshape(4, 4)[:, 2:]))
    audit.record("w.e1", 1, mapped[16:32])
    assert audit.holds() == ""


def test_the_audit_joins_column_blocks_and_refuses_a_byte_written_twice(tmp_path):
    data = tmp_path / "w.data"
    np.arange(32, dtype=np.uint8).tofile(data)
    matrix = np.memmap(data, dtype=np.uint8, mode="r").reshape(2, 4, 4)  # 2 experts of [4 rows, 4 columns]
    source = {"w": SourceRange(str(data), 0, 32, 2)}
    audit = ShardAudit("block", source, tensors=4)
    for expert in range(2):
        audit.record(f"w.e{expert}.s0", expert, matrix[expert][:, :2])  # column blocks: strided views
        audit.record(f"w.e{expert}.s1", expert, matrix[expert][:, 2:])
    assert audit.holds() == ""
    audit = ShardAudit("block", source, tensors=4)
    for expert in range(2):
        audit.record(f"w.e{expert}.s0", expert, matrix[expert][:, :3])  # column 2 in both shards
        audit.record(f"w.e{expert}.s1", expert, matrix[expert][:, 2:])
    assert "do not tile" in audit.holds()
