"""Fuzz (b): mutated models never cause a traceback, a read outside their folder, or a change to an input.

Each example copies a valid model (the tiny MoE block with external weights, or its 2-shard conversion with
external weights) into a fresh folder, mutates it — bytes of the model file, fields of the parsed model
(dims, dtypes, attributes, node inputs, opsets), its external-data entries (location, offset, length, pointed
at a canary file outside the folder), or the converted node's attributes and inputs — and runs ``ndp-ep
convert``, ``ndp-ep run`` and ``ndp-ep diff`` on it in-process through :func:`ndp_ep.cli.main`. Each command
must return 0, 1 (diff: different) or 2 with one line on stderr — any other exception fails the test with its
traceback; no file outside the folder may be opened (Python's ``open`` audit event; the canary holds valid
weight bytes, so a read would go unnoticed otherwise); every input file keeps its hash.

``NDP_FUZZ_MUTATIONS`` sets the number of examples (default 150; ``NDP_FUZZ_MUTATIONS=5000`` locally).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import onnx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ndp_ep import convert_model
from ndp_ep.cli import main
from sample_models.build_samples import MoEBlockSpec, build_moe_block

EXAMPLES = int(os.environ.get("NDP_FUZZ_MUTATIONS", "150"))
_OPENED: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and args and isinstance(args[0], str | bytes | os.PathLike):
        _OPENED.append(os.path.realpath(os.fsdecode(args[0])))


sys.addaudithook(_audit)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """``{"plain": folder, "converted": folder}``, each holding ``m.onnx`` and its external data; a canary."""
    root = tmp_path_factory.mktemp("bases")
    model = build_moe_block(MoEBlockSpec(num_experts=4, top_k=2, hidden=8, ffn=16), seed=5)
    plain = root / "plain"
    plain.mkdir()
    onnx.save_model(model, str(plain / "m.onnx"), save_as_external_data=True, location="w.bin", size_threshold=0)
    converted = root / "converted"
    converted.mkdir()
    convert_model(plain / "m.onnx", converted / "m.onnx", shards=2, external_data=True)
    canary = root / "canary.bin"
    canary.write_bytes((plain / "w.bin").read_bytes() * 2)
    return {"plain": plain, "converted": converted, "canary": canary, "root": root}


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


# -- mutations -------------------------------------------------------------------------------------------------
def _flip_bytes(data: bytes, draw) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 8))):
        position = draw(st.integers(0, len(out) - 1))
        out[position] = draw(st.integers(0, 255))
    return bytes(out)


def _truncate(data: bytes, draw) -> bytes:
    return data[: draw(st.integers(0, len(data) - 1))]


NASTY_INTS = [-1, 0, 1, 3, 7, 2**31, 10**12, -(2**40), 2**62]
NASTY_STRINGS = ["", "evil", "../canary.bin", "x" * 300, "a\x1b[2Jb", "swiglu", "relu"]


def _mutate_proto(model: onnx.ModelProto, draw, canary: Path) -> None:
    graph = model.graph
    kind = draw(
        st.sampled_from(
            [
                "dim",
                "dtype",
                "attribute",
                "node_input",
                "drop_node",
                "duplicate_node",
                "opset",
                "location",
                "offset",
                "length",
                "graph_io",
                "swap_nodes",
            ]
        )
    )
    if kind in ("dim", "dtype", "location", "offset", "length") and graph.initializer:
        tensor = graph.initializer[draw(st.integers(0, len(graph.initializer) - 1))]
        if kind == "dim" and tensor.dims:
            tensor.dims[draw(st.integers(0, len(tensor.dims) - 1))] = draw(st.sampled_from(NASTY_INTS))
        elif kind == "dtype":
            tensor.data_type = draw(st.integers(0, 25))
        elif tensor.external_data:
            key = {"location": "location", "offset": "offset", "length": "length"}.get(kind, "location")
            values = {
                "location": ["../canary.bin", str(canary), "w.bin/../../canary.bin", "", "missing.bin", "m.onnx", "."],
                "offset": ["-1", "abc", "1e3", str(10**15), "0", "4", " 8"],
                "length": ["-5", "0", "xyz", str(10**15), "1", "4096"],
            }[key]
            entries = {e.key: e for e in tensor.external_data}
            if key in entries:
                entries[key].value = draw(st.sampled_from(values))
            else:
                entry = tensor.external_data.add()
                entry.key, entry.value = key, draw(st.sampled_from(values))
        return
    if not graph.node:
        return
    node = graph.node[draw(st.integers(0, len(graph.node) - 1))]
    if kind == "attribute" and node.attribute:
        attribute = node.attribute[draw(st.integers(0, len(node.attribute) - 1))]
        if attribute.type == onnx.AttributeProto.INT:
            attribute.i = draw(st.sampled_from(NASTY_INTS))
        elif attribute.type == onnx.AttributeProto.FLOAT:
            attribute.f = draw(st.sampled_from([float("nan"), float("inf"), -1.0, 0.0, 1e30]))
        elif attribute.type == onnx.AttributeProto.STRING:
            attribute.s = draw(st.sampled_from(NASTY_STRINGS)).encode()
        elif attribute.type == onnx.AttributeProto.INTS and attribute.ints:
            attribute.ints[0] = draw(st.sampled_from(NASTY_INTS))
        else:
            attribute.type = onnx.AttributeProto.STRING
    elif kind == "node_input" and node.input:
        position = draw(st.integers(0, len(node.input) - 1))
        names = [v for n in graph.node for v in n.output] + [t.name for t in graph.initializer] + ["nowhere", ""]
        node.input[position] = draw(st.sampled_from(names))
    elif kind == "drop_node":
        graph.node.remove(node)
    elif kind == "duplicate_node":
        graph.node.append(node)
    elif kind == "opset":
        model.opset_import[0].version = draw(st.sampled_from([0, 1, 6, 17, 99, -3]))
    elif kind == "graph_io":
        value = draw(st.sampled_from(list(graph.input) + list(graph.output)))
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[draw(st.integers(0, len(dims) - 1))].dim_value = draw(st.sampled_from([0, 1, 3, 10**12]))
        value.type.tensor_type.elem_type = draw(st.sampled_from([0, 1, 7, 10, 16]))
    elif kind == "swap_nodes" and len(graph.node) > 1:
        other = draw(st.integers(0, len(graph.node) - 1))
        first = onnx.NodeProto()
        first.CopyFrom(node)
        node.CopyFrom(graph.node[other])
        graph.node[other].CopyFrom(first)


# -- the property ------------------------------------------------------------------------------------------------
def _run_cli(argv: list[str], capsys) -> None:
    code = main(argv)  # any exception but SystemExit propagates and fails the example with its traceback
    err = capsys.readouterr().err
    assert code in (0, 1, 2), (argv, code, err)
    if code == 2:
        assert err.count("\n") == 1 and err.startswith(f"ndp-ep {argv[0]}: error:"), err
        assert "Traceback" not in err


@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each example is already small, and shrinking is slow
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(drawn=st.data())
def test_mutated_models_fail_cleanly_read_nothing_outside_and_change_no_input(bases, capsys, drawn):
    global _OPENED
    base = drawn.draw(st.sampled_from(["plain", "converted"]))
    layer = drawn.draw(st.sampled_from(["bytes", "truncate", "proto", "proto", "proto", "data_file"]))
    folder = bases["root"] / "example"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(bases[base], folder)
    out = bases["root"] / "outputs"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    model_path = folder / "m.onnx"
    data = model_path.read_bytes()
    if layer == "bytes":
        model_path.write_bytes(_flip_bytes(data, drawn.draw))
    elif layer == "truncate":
        model_path.write_bytes(_truncate(data, drawn.draw))
    elif layer == "data_file":
        data_file = next(p for p in folder.iterdir() if p != model_path)
        content = data_file.read_bytes()
        data_file.write_bytes(
            _truncate(content, drawn.draw) if drawn.draw(st.booleans()) else _flip_bytes(content, drawn.draw)
        )
    else:
        model = onnx.load(str(model_path), load_external_data=False)
        for _ in range(drawn.draw(st.integers(1, 3))):
            _mutate_proto(model, drawn.draw, bases["canary"])
        model_path.write_bytes(model.SerializeToString())
    before, canary_before = _hashes(folder), _hashes(bases["root"] / "plain")
    _OPENED = []
    try:
        _run_cli(["convert", str(model_path), "-o", str(out / "c.onnx"), "--shards", "2"], capsys)
        _run_cli(["run", str(model_path), "--seq-len", "3"], capsys)
        _run_cli(["diff", str(model_path), str(bases[base] / "m.onnx"), "-q"], capsys)
        opened = list(_OPENED)
    finally:
        _OPENED = None
    outside = [p for p in opened if p == os.path.realpath(bases["canary"])]
    assert outside == [], f"read outside the model folder: {outside}"
    assert _hashes(folder) == before and _hashes(bases["root"] / "plain") == canary_before
