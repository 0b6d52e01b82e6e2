"""The routing-trace file format (hw_model/routing_trace.py, routing_trace_io.py, docs/trace_format.md): round trips
byte for byte, and every kind of file that is not ours is refused with one typed line."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest

from hw_model.errors import TraceFormatError
from hw_model.routing_trace import FORMAT_NAME, FORMAT_VERSION, TraceHeader, TraceLayer, from_token_ids
from hw_model.routing_trace_io import encode_trace, export_jsonl, load_captured, save_trace

LAYERS = (
    TraceLayer("moe0", num_experts=8, top_k=2, hidden=16, ffn=32),
    TraceLayer(
        "moe1", num_experts=6, top_k=2, hidden=16, ffn=24, weight_dtype="int4", block_size=16, scale_dtype="float16"
    ),
)


def _header(prompt: int = 5, new: int = 4) -> TraceHeader:
    return TraceHeader(
        layers=LAYERS,
        prompt_tokens=prompt,
        new_tokens=new,
        settings={"hw": "paper", "ndp_units": 4, "policy": "tp+lb+prefetch"},
        versions={"ndp_ep": "0.1.0", "onnxruntime": "1.23.2"},
        source="test",
    )


def _ids(seed: int = 0, prompt: int = 5, new: int = 4) -> np.ndarray:
    rng = np.random.default_rng(seed)
    tokens = prompt + new
    ids = np.empty((2, tokens, 2), dtype=np.int64)
    for layer, experts in enumerate((8, 6)):
        for token in range(tokens):
            ids[layer, token] = rng.choice(experts, size=2, replace=False)
    return ids


def _trace(seed: int = 0):
    ids = _ids(seed)
    weights = np.random.default_rng(seed + 1).random(ids.shape).astype(np.float32)
    return from_token_ids(_header(), ids, weights), ids, weights


def test_save_load_save_is_byte_identical(tmp_path):
    trace, _, _ = _trace()
    first = save_trace(trace, tmp_path / "a.npz")
    loaded = load_captured(first)
    second = save_trace(loaded, tmp_path / "b.npz")
    assert first.read_bytes() == second.read_bytes()
    assert loaded.header == trace.header
    for name, array in trace.steps.arrays().items():
        np.testing.assert_array_equal(loaded.steps.arrays()[name], array)


def test_steps_hold_prefill_then_one_decode_step_per_token():
    trace, ids, weights = _trace()
    assert trace.num_steps == 1 + 4
    phase, layers, tokens, dense = trace.step(0)
    assert (phase, layers, tokens) == ("prefill", [0, 1], [5, 5])
    for layer in range(2):
        expected = np.zeros(8, dtype=np.int64)
        for token in range(5):
            for expert in ids[layer, token]:
                expected[expert] += 1
        np.testing.assert_array_equal(dense[layer], expected)
    phase, _, tokens, dense = trace.step(3)  # token 5 + 2 = 7
    assert phase == "decode" and tokens == [1, 1]
    assert sorted(np.flatnonzero(dense[1]).tolist()) == sorted(ids[1, 7].tolist())
    cell = 3 * 2 + 1
    lo, hi = trace.steps.slot_offsets[cell], trace.steps.slot_offsets[cell + 1]
    np.testing.assert_array_equal(trace.steps.expert_ids[lo:hi], ids[1, 7])
    np.testing.assert_array_equal(trace.steps.routing_weights[lo:hi], weights[1, 7])


def test_layer_counts_sum_every_selection():
    trace, ids, _ = _trace(3)
    totals = trace.layer_counts()
    for layer, experts in enumerate((8, 6)):
        expected = [int((ids[layer] == e).sum()) for e in range(8)]
        assert totals[layer].tolist() == expected[:experts] + [0] * (8 - experts)


def test_jsonl_export_has_the_header_then_one_line_per_cell(tmp_path):
    trace, ids, _ = _trace()
    path = export_jsonl(trace, tmp_path / "t.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["header"]["format"] == FORMAT_NAME
    assert len(lines) == 1 + 5 * 2
    last = lines[-1]
    assert (last["step"], last["layer"], last["phase"], last["tokens"]) == (4, 1, "decode", 1)
    assert last["expert_ids"] == ids[1, 8].tolist()
    assert sorted(last["experts"]) == sorted(ids[1, 8].tolist()) and last["counts"] == [1, 1]


def _rezip(data: bytes, change) -> bytes:
    """The archive ``data`` with its members passed through ``change(name, bytes) -> bytes | None``."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            new = change(info.filename, src.read(info))
            if new is not None:
                dst.writestr(info.filename, new)
    return out.getvalue()


def _refused(tmp_path, data: bytes, **kwargs) -> str:
    path = tmp_path / "bad.npz"
    path.write_bytes(data)
    with pytest.raises(TraceFormatError) as info:
        load_captured(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path))
    return message


def test_truncated_file_is_refused(tmp_path):
    data = encode_trace(_trace()[0])
    for cut in (len(data) // 2, len(data) - 10, 30):
        assert "truncated or corrupt" in _refused(tmp_path, data[:cut])


def test_foreign_files_are_refused(tmp_path):
    assert "not a zip archive" in _refused(tmp_path, b'{"format": "ndp-ep-trace/1"}')
    assert "empty file" in _refused(tmp_path, b"")
    old = io.BytesIO()
    np.savez(old, expert_ids=np.zeros((1, 2, 1), np.int32), num_experts=np.int64(2), prompt_tokens=np.int64(1))
    assert "no header.json" in _refused(tmp_path, old.getvalue())
    data = encode_trace(_trace()[0])
    grown = io.BytesIO(data)
    with zipfile.ZipFile(grown, "a") as archive:
        archive.writestr("model.onnx", b"x")
    assert "unknown member 'model.onnx'" in _refused(tmp_path, grown.getvalue())
    foreign = _rezip(data, lambda n, b: json.dumps({"format": "other"}).encode() if n == "header.json" else b)
    assert "not an ndp-ep routing trace" in _refused(tmp_path, foreign)


def test_other_version_is_refused(tmp_path):
    def bump(name, data):
        if name != "header.json":
            return data
        doc = json.loads(data)
        doc["version"] = FORMAT_VERSION + 1
        return json.dumps(doc).encode()

    assert f"version {FORMAT_VERSION + 1} is not supported" in _refused(
        tmp_path, _rezip(encode_trace(_trace()[0]), bump)
    )


def test_fields_of_wrong_type_or_size_are_refused(tmp_path):
    data = encode_trace(_trace()[0])

    def header_field(key, value):
        def change(name, raw):
            if name != "header.json":
                return raw
            doc = json.loads(raw)
            doc[key] = value
            return json.dumps(doc).encode()

        return change

    assert "prompt_tokens must be an integer" in _refused(tmp_path, _rezip(data, header_field("prompt_tokens", "5")))
    assert "layers must be a list" in _refused(tmp_path, _rezip(data, header_field("layers", {})))

    def array(target, value):
        def change(name, raw):
            if name != f"{target}.npy":
                return raw
            out = io.BytesIO()
            np.save(out, value)
            return out.getvalue()

        return change

    assert "'counts' must be int32" in _refused(tmp_path, _rezip(data, array("counts", np.ones(3, np.float64))))
    assert "'gap_s' must have one value per step" in _refused(tmp_path, _rezip(data, array("gap_s", np.zeros(2))))
    trace = _trace()[0]
    bigger = trace.steps.counts.copy()
    bigger[0] += 1
    assert "do not add up" in _refused(tmp_path, _rezip(data, array("counts", bigger)))
    assert "lacks the array 'phase'" in _refused(tmp_path, _rezip(data, lambda n, b: None if n == "phase.npy" else b))


def test_deep_json_header_is_refused_before_parsing(tmp_path):
    deep = ("[" * 100_000 + "]" * 100_000).encode()
    data = _rezip(encode_trace(_trace()[0]), lambda n, b: deep if n == "header.json" else b)
    assert "nests 100000 deep" in _refused(tmp_path, data)


def test_archive_inflating_past_the_limit_is_refused_before_decompressing(tmp_path, monkeypatch):
    data = _rezip(encode_trace(_trace()[0]), lambda n, b: b + b"\0" * 100_000 if n == "counts.npy" else b)
    assert len(data) < 20_000  # zeros deflate ~1000:1
    opened = []
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, *a, **k: opened.append(a) or pytest.fail("opened"))
    message = _refused(tmp_path, data, max_bytes=50_000)
    assert "over the limit of 50,000" in message and not opened


def test_layer_fields_are_checked():
    with pytest.raises(TraceFormatError, match="top_k 3 exceeds"):
        TraceLayer("x", num_experts=2, top_k=3, hidden=4, ffn=4)
    with pytest.raises(TraceFormatError, match="block_size"):
        TraceLayer(
            "x", num_experts=2, top_k=1, hidden=4, ffn=4, weight_dtype="int8", block_size=0, scale_dtype="float16"
        )


def test_mutated_files_load_or_are_refused_with_one_typed_line(tmp_path):
    import random

    data = encode_trace(_trace()[0])
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    rng = random.Random(0)
    path = tmp_path / "m.npz"
    outcomes = {"loaded": 0, "refused": 0}
    for trial in range(400):
        if trial % 2:  # bytes of the archive itself
            blob = bytearray(data)
            for _ in range(rng.randint(1, 8)):
                blob[rng.randrange(len(blob))] = rng.randrange(256)
        else:  # bytes of one member, re-zipped (the CRCs match: the reader's own checks must catch it)
            name = rng.choice(sorted(members))
            member = bytearray(members[name])
            for _ in range(rng.randint(1, 6)):
                member[rng.randrange(len(member))] = rng.randrange(256)
            out = io.BytesIO()
            with zipfile.ZipFile(out, "w") as archive:
                for other, raw in members.items():
                    archive.writestr(other, bytes(member) if other == name else raw)
            blob = bytearray(out.getvalue())
        path.write_bytes(bytes(blob))
        try:
            load_captured(path)
            outcomes["loaded"] += 1
        except TraceFormatError as exc:
            assert "\n" not in str(exc)
            outcomes["refused"] += 1
    assert outcomes["refused"] > 300  # anything else escaping fails the test


def test_steps_where_no_layer_ran_are_kept_and_replay_as_their_gpu_time():
    from hw_model.routing_capture import RoutingCapture
    from hw_model.routing_trace import CapturedTrace
    from hw_model.trace_replay import replay

    capture = RoutingCapture(2, 8)
    dense = np.zeros((2, 8), dtype=np.int64)
    dense[0, [1, 2]] = 1
    dense[1, [0, 5]] = 1
    capture.add_step("decode", [0, 1], [1, 1], dense, 0.0, 0.0)
    capture.add_step("unknown", None, (), None, 0.25, 0.25)  # a zero-token run, last: its cells are empty
    header = TraceHeader(layers=(LAYERS[0], TraceLayer("m", 6, 2, 16, 32)), prompt_tokens=0, new_tokens=1)
    trace = CapturedTrace(header, capture.steps())
    assert trace.step(1)[1] == [] and replay(trace).step_s[1] == 0.25
