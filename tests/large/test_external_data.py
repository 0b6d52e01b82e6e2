"""Models whose weights live in ONNX external data: conversion reads them by file offset and writes external data.

The big-model figures (memory and time against a plain copy) come from benchmarks/bench_large_model.py;
these tests prove the same code paths correct on a model of a few MB.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from graph_passes.convert import convert
from graph_passes.errors import GraphPassError
from graph_passes.model_io import save_rewritten
from graph_passes.rewrite import materialize, materialize_with_store
from ndp_ep import InferenceSession
from sample_models.build_samples import MoEBlockSpec, build_moe_decoder

SPECS = (MoEBlockSpec(num_experts=8, hidden=64, ffn=256), MoEBlockSpec(num_experts=4, top_k=1, hidden=64, ffn=128))


@pytest.fixture(scope="module")
def external_model(tmp_path_factory) -> Path:
    """A two-layer MoE decoder with every initializer in ``weights.bin`` (about 1.5 MB)."""
    directory = tmp_path_factory.mktemp("external")
    path = directory / "decoder.onnx"
    onnx.save(
        build_moe_decoder(SPECS, seed=3),
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    return path


def _external_entries(model: onnx.ModelProto) -> dict[str, tuple[str, int, int]]:
    entries = {}
    for tensor in model.graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            info = {e.key: e.value for e in tensor.external_data}
            entries[tensor.name] = (info["location"], int(info.get("offset", 0)), int(info["length"]))
    return entries


def _nbytes(tensor: TensorProto) -> int:
    itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def test_source_weights_really_are_external(external_model):
    model = onnx.load(str(external_model), load_external_data=False)
    assert len(_external_entries(model)) == len(model.graph.initializer)
    assert external_model.stat().st_size < 64 * 1024


def test_cli_converts_external_model_to_external_data_with_consistent_offsets(external_model, tmp_path, cli):
    out = tmp_path / "converted.onnx"
    done = cli("convert", str(external_model), "-o", str(out), "--external-data", "--json", "--shards", "2")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [b["name"] for b in report["moe_blocks"]] == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert all(b["checked_numerically"] for b in report["moe_blocks"])
    assert sorted(Path(f).name for f in report["files"]) == ["converted.onnx", "converted.onnx.data"]

    converted = onnx.load(str(out), load_external_data=False)
    entries = _external_entries(converted)
    shard_names = [t.name for t in converted.graph.initializer if ".shard" in t.name]
    assert len(shard_names) == 2 * (8 + 4) * 2  # gate_up + down, per expert, per shard
    assert set(shard_names) <= set(entries)
    data_size = (tmp_path / "converted.onnx.data").stat().st_size
    spans = sorted((offset, length) for location, offset, length in entries.values())
    assert {location for location, _, _ in entries.values()} == {"converted.onnx.data"}
    for (offset, length), following in zip(spans, spans[1:] + [(data_size, 0)], strict=True):
        assert offset + length <= following[0]  # in the file, no overlaps
    by_name = {t.name: t for t in converted.graph.initializer}
    for name, (_, _, length) in entries.items():
        assert length == _nbytes(by_name[name])

    # the bytes at each offset are the shards an in-memory conversion of the same model produces
    in_memory = materialize(convert(onnx.load(str(external_model)), shards=2)[0])
    expected = {t.name: onnx.numpy_helper.to_array(t) for t in in_memory.graph.initializer}
    for name in shard_names[::7]:
        _, offset, length = entries[name]
        got = np.fromfile(tmp_path / "converted.onnx.data", dtype=np.float32, count=length // 4, offset=offset)
        np.testing.assert_array_equal(got.reshape(tuple(by_name[name].dims)), expected[name])


def test_converted_external_model_matches_stock_onnxruntime(external_model, tmp_path, cli):
    out = tmp_path / "converted.onnx"
    assert cli("convert", str(external_model), "-o", str(out), "--external-data").returncode == 0
    ids = np.random.default_rng(5).integers(0, 128, size=(2, 9), dtype=np.int64)
    # stock ORT cannot read axes/shape constants from external data (size_threshold=0 put them there),
    # so the reference runs the same model with its data loaded into memory
    embedded = onnx.load(str(external_model)).SerializeToString()
    stock = ort.InferenceSession(embedded, providers=["CPUExecutionProvider"])
    (want,) = stock.run(None, {"input_ids": ids})
    (got,) = InferenceSession(str(out)).run(None, {"input_ids": ids})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _truncated_copy(external_model: Path, directory: Path) -> Path:
    """The model next to a copy of its data file cut just before the last expert weights end."""
    model = onnx.load(str(external_model), load_external_data=False)
    last = max(_external_entries(model).items(), key=lambda item: item[1][1] + item[1][2])
    data = (external_model.parent / "weights.bin").read_bytes()
    (directory / "weights.bin").write_bytes(data[: last[1][1] + last[1][2] // 2])
    path = directory / "decoder.onnx"
    path.write_bytes(external_model.read_bytes())
    return path


def test_truncated_external_data_fails_in_one_line_and_writes_nothing(external_model, tmp_path, cli):
    source_dir, out_dir = tmp_path / "src", tmp_path / "out"
    source_dir.mkdir()
    out_dir.mkdir()
    source = _truncated_copy(external_model, source_dir)
    done = cli("convert", str(source), "-o", str(out_dir / "converted.onnx"), "--external-data")
    assert done.returncode == 2
    assert "truncated" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert list(out_dir.iterdir()) == []


def test_failure_while_streaming_weights_leaves_no_files(external_model, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    rewritten, _ = convert(external_model, shards=2)
    broken = next(t for t in rewritten.lazy.values() if t.name.endswith("shard1.down"))

    def fail() -> np.ndarray:
        raise GraphPassError("simulated failure half-way through the weights")

    broken.produce = fail
    with pytest.raises(GraphPassError, match="half-way"):
        save_rewritten(rewritten, out_dir / "converted.onnx", external=True)
    assert list(out_dir.iterdir()) == []


def test_external_input_gives_external_output_by_default(external_model, tmp_path, cli):
    out = tmp_path / "converted.onnx"
    done = cli("convert", str(external_model), "-o", str(out), "--json")
    assert done.returncode == 0, done.stderr
    assert sorted(Path(f).name for f in json.loads(done.stdout)["files"]) == ["converted.onnx", "converted.onnx.data"]


def test_embedded_output_reads_back_as_the_materialised_model(external_model, tmp_path):
    rewritten, _ = convert(external_model, shards=2)
    (path,) = save_rewritten(rewritten, tmp_path / "embedded.onnx", external=False)
    saved = onnx.load(str(path))
    expected = materialize_with_store(rewritten)
    assert not any(t.data_location == TensorProto.EXTERNAL for t in saved.graph.initializer)
    saved_arrays = {t.name: onnx.numpy_helper.to_array(t) for t in saved.graph.initializer}
    assert set(saved_arrays) == {t.name for t in expected.graph.initializer}
    for tensor in expected.graph.initializer:
        np.testing.assert_array_equal(saved_arrays[tensor.name], onnx.numpy_helper.to_array(tensor))
    saved.graph.ClearField("initializer")
    expected.graph.ClearField("initializer")
    assert saved == expected


def _saved_data(rewritten, directory: Path) -> tuple[onnx.ModelProto, bytes]:
    directory.mkdir()
    path, data = save_rewritten(rewritten, directory / "converted.onnx", external=True)
    return onnx.load(str(path), load_external_data=False), data.read_bytes()


def test_shards_are_slices_of_the_source_file_with_or_without_kernel_copies(external_model, tmp_path, monkeypatch):
    rewritten, _ = convert(external_model, shards=2)
    model, fast = _saved_data(rewritten, tmp_path / "kernel_copy")

    def refuse(*args, **kwargs):
        raise OSError(18, "Invalid cross-device link")  # EXDEV: what an old kernel says across file systems

    monkeypatch.setattr("os.copy_file_range", refuse)
    _, slow = _saved_data(convert(external_model, shards=2)[0], tmp_path / "read_write")
    assert fast == slow
    # expert 3, shard 1 of layer 0 against the source stacks read here: gate_up [E, 2I, H], down [E, H, I]
    source = onnx.load(str(external_model))
    stacks = {t.name: onnx.numpy_helper.to_array(t) for t in source.graph.initializer}
    gate_up = stacks["model.layers.0.mlp.experts.gate_up_proj"][3]
    down = stacks["model.layers.0.mlp.experts.down_proj"][3]
    ffn, width = SPECS[0].ffn, SPECS[0].ffn // 2
    entries = _external_entries(model)
    dims = {t.name: tuple(t.dims) for t in model.graph.initializer}

    def shard(kind: str) -> np.ndarray:
        name = f"model.layers.0.mlp.experts.3.shard1.{kind}"
        _, offset, length = entries[name]
        return np.frombuffer(fast, np.float32, length // 4, offset).reshape(dims[name])

    rows = slice(width, 2 * width)
    np.testing.assert_array_equal(shard("gate_up"), np.concatenate([gate_up[:ffn][rows], gate_up[ffn:][rows]]))
    np.testing.assert_array_equal(shard("down"), down[:, rows])
