"""Each hostile or broken input of issue 11 gives a typed error in the API and one line + exit 2 in the CLI.

Every case is checked through ``convert_model`` / ``InferenceSession`` (typed :class:`NdpEpError`) and through
``ndp-ep convert`` and ``ndp-ep run`` (one line on stderr, exit 2, nothing written, the input unchanged).
"""

from __future__ import annotations

import builtins
import errno
import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graph_passes.sharded_op import is_sharded_node
from hw_model.errors import HardwareConfigError
from ndp_ep import InferenceSession, convert_model
from ndp_ep.cli import main
from ndp_ep.errors import ModelLoadError, NdpEpError
from tests.reliability.conftest import digest, save_external, tiny_model

REPO = Path(__file__).resolve().parents[2]


def _value(name, dims=(2,)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))


def _model(nodes, inputs=("x",), outputs=("y",), initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", [_value(i) for i in inputs], [_value(o) for o in outputs], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _raw_short():
    model = tiny_model()
    tensor = next(t for t in model.graph.initializer if t.name == "moe.experts.down_proj")
    tensor.raw_data = tensor.raw_data[: len(tensor.raw_data) // 2]
    return model


def _dims(value):
    def build():
        model = tiny_model()
        tensor = next(t for t in model.graph.initializer if t.name == "moe.experts.down_proj")
        tensor.dims[0] = value
        return model

    return build


MODELS = {
    "cyclic graph": lambda: _model(
        [
            helper.make_node("Add", ["x", "b"], ["a"], name="add"),
            helper.make_node("Relu", ["a"], ["b"], name="relu"),
            helper.make_node("Identity", ["a"], ["y"], name="out"),
        ]
    ),
    "duplicate output names": lambda: _model(
        [helper.make_node("Relu", ["x"], ["y"], name="one"), helper.make_node("Abs", ["x"], ["y"], name="two")]
    ),
    "opset beyond ONNX Runtime": lambda: _model([helper.make_node("Relu", ["x"], ["y"])], opset=99),
    "raw_data shorter than dims": _raw_short,
    "dims of 10^12": _dims(10**12),
    "negative dims": _dims(-8),
    "undefined input": lambda: _model([helper.make_node("Add", ["x", "nowhere"], ["y"], name="add")]),
}
WORDS = {
    "cyclic graph": "cycle",
    "duplicate output names": "produced twice",
    "opset beyond ONNX Runtime": "opset 99",
    "raw_data shorter than dims": "raw_data",
    "dims of 10^12": "raw_data",
    "negative dims": "negative",
    "undefined input": "nowhere",
}


def _cli_one_line(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"ndp-ep {argv[0]}: error:") and "Traceback" not in err
    return err


@pytest.mark.parametrize("case", sorted(MODELS))
def test_broken_models(tmp_path, capsys, case):
    path = tmp_path / "m.onnx"
    path.write_bytes(MODELS[case]().SerializeToString())
    before = digest(path)
    with pytest.raises(NdpEpError, match=WORDS[case]):
        convert_model(path, tmp_path / "out.onnx", shards=2)
    with pytest.raises(ModelLoadError, match=WORDS[case]):
        InferenceSession(path, shards=2)
    for argv in (["convert", str(path), "-o", str(tmp_path / "out.onnx")], ["run", str(path)]):
        assert WORDS[case] in _cli_one_line(capsys, argv)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"] and digest(path) == before


def test_unknown_operator_domain_at_run(tmp_path, capsys):
    model = _model([helper.make_node("Foo", ["x"], ["y"], domain="evil.domain", name="foo")])
    model.opset_import.append(helper.make_opsetid("evil.domain", 1))
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelLoadError, match="evil.domain::Foo is not known"):
        InferenceSession(path)
    assert "evil.domain::Foo" in _cli_one_line(capsys, ["run", str(path)])


def test_negative_external_data_offset(tmp_path, capsys):
    path = save_external(tiny_model(), tmp_path / "m.onnx")
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "offset":
                entry.value = "-64"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelLoadError, match="offset '-64'"):
        InferenceSession(path, shards=2)
    assert "offset" in _cli_one_line(capsys, ["convert", str(path), "-o", str(tmp_path / "o.onnx")])


def test_symlink_loop_as_the_model(tmp_path, capsys):
    (tmp_path / "a.onnx").symlink_to(tmp_path / "b.onnx")
    (tmp_path / "b.onnx").symlink_to(tmp_path / "a.onnx")
    with pytest.raises(ModelLoadError, match="symbolic link loop"):
        InferenceSession(tmp_path / "a.onnx")
    for argv in (["run", str(tmp_path / "a.onnx")], ["convert", str(tmp_path / "a.onnx"), "-o", str(tmp_path / "o")]):
        assert "loop" in _cli_one_line(capsys, argv)
    assert "loop" in _cli_one_line(capsys, ["diff", str(tmp_path / "a.onnx"), str(tmp_path / "a.onnx")]).lower()


def test_unreadable_input_is_permission_denied_not_not_onnx(tmp_path, monkeypatch, capsys):
    path = tmp_path / "m.onnx"
    path.write_bytes(tiny_model().SerializeToString())
    real_open = builtins.open

    def guarded_open(file, *args, **kwargs):  # chmod 000 does not stop root, which the CI may be
        if str(file) == str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded_open)
    with pytest.raises(ModelLoadError, match="permission denied"):
        InferenceSession(path)
    for argv in (["run", str(path)], ["diff", str(path), str(path)]):
        err = _cli_one_line(capsys, argv)
        assert "permission denied" in err.lower() and "not an ONNX" not in err


@pytest.mark.parametrize("output", ["", "x" * 256 + ".onnx"])
def test_bad_output_names(tmp_path, capsys, monkeypatch, output):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "m.onnx"
    path.write_bytes(tiny_model().SerializeToString())
    _cli_one_line(capsys, ["convert", str(path), "-o", output])
    _cli_one_line(capsys, ["run", str(path), "--outputs", output]) if output else None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_full_disk_during_convert_is_one_line(tmp_path, capsys, monkeypatch):
    import os

    path = tmp_path / "m.onnx"
    path.write_bytes(tiny_model().SerializeToString())

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    err = _cli_one_line(capsys, ["convert", str(path), "-o", str(tmp_path / "o.onnx")])
    assert "No space left" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> onnx.ModelProto:
    out = tmp_path_factory.mktemp("conv") / "c.onnx"
    src = out.parent / "m.onnx"
    src.write_bytes(tiny_model().SerializeToString())
    convert_model(src, out, shards=2, external_data=False)
    return onnx.load(str(out))


def _sharded(model):
    return next(n for n in model.graph.node if is_sharded_node(n))


def _set_attr(name, value):
    def tamper(model):
        node = _sharded(model)
        for attribute in node.attribute:
            if attribute.name == name:
                attribute.CopyFrom(helper.make_attribute(name, value))

    return tamper


def _drop_input(model):
    node = _sharded(model)
    del node.input[-1]


def _swap_weight_shape(model):
    node = _sharded(model)
    tensor = next(t for t in model.graph.initializer if t.name == node.input[3])
    array = numpy_helper.to_array(tensor)
    tensor.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(array.T), tensor.name))


TAMPERS = {
    "shards 3": (_set_attr("shards", 3), "shards"),
    "top_k 0": (_set_attr("top_k", 0), "top_k"),
    "unknown activation": (_set_attr("activation", "evil"), "activation"),
    "num_experts 10^9": (_set_attr("num_experts", 10**9), "weight inputs"),
    "a weight input dropped": (_drop_input, "weight inputs"),
    "a weight transposed": (_swap_weight_shape, "shape"),
}


@pytest.mark.parametrize("case", sorted(TAMPERS))
def test_tampered_converted_node(tmp_path, capsys, converted, case):
    tamper, words = TAMPERS[case]
    model = onnx.ModelProto()
    model.CopyFrom(converted)
    tamper(model)
    path = tmp_path / "t.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelLoadError, match=words):
        InferenceSession(path)
    assert words in _cli_one_line(capsys, ["run", str(path)])
    json.dumps(case)  # the parametrisation id stays printable


# -- found by tests/fuzz/test_mutated_models.py -------------------------------------------------------------------
def test_a_failing_expert_kernel_is_one_line_not_an_abort(tmp_path, cli):
    """The router reads a weight instead of its logits: expert ids no longer match the tokens. A kernel's
    exception once crossed ONNX Runtime's C++ frames and terminated the process (SIGABRT); now the provider
    refuses the node (its routing shapes disagree with the hidden state) or the run fails, in one line."""
    src, out = tmp_path / "m.onnx", tmp_path / "c.onnx"
    src.write_bytes(tiny_model().SerializeToString())
    convert_model(src, out, shards=2, external_data=False)
    model = onnx.load(str(out))
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    softmax.input[0] = _sharded(model).input[3]  # [H, 2I/S] weight: 16 rows of "logits" instead of 3 tokens
    out.write_bytes(model.SerializeToString())
    done = cli("run", str(out), "--seq-len", "3")
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("ndp-ep run: error")]  # not ORT's logs
    assert len(lines) == 1 and "Traceback" not in done.stderr and lines[0].startswith("ndp-ep run: error: ")
    assert "ShardedMoEExperts" in lines[0] or "the model failed while running" in lines[0]


def test_names_that_are_not_utf8_are_a_load_error(tmp_path, capsys):
    model = tiny_model()
    model.graph.node[0].name = "MARKER"
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString().replace(b"MARKER", b"MA\x92\x93ER"))
    with pytest.raises(ModelLoadError, match="UTF-8"):
        InferenceSession(path)
    for argv in (["run", str(path)], ["diff", str(path), str(path)]):
        assert "UTF-8" in _cli_one_line(capsys, argv)


def test_random_feeds_are_sized_before_allocating(tmp_path, capsys):
    model = _model([helper.make_node("Relu", ["x"], ["y"])])
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_value = 10**12
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    assert "MiB" in _cli_one_line(capsys, ["run", str(path)])


def test_a_fifo_is_refused_without_blocking(tmp_path, capsys):
    fifo = tmp_path / "m.onnx"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    for argv in (["run", str(fifo)], ["diff", str(fifo), str(fifo)], ["convert", str(fifo), "-o", str(tmp_path / "o")]):
        assert "not a" in _cli_one_line(capsys, argv)
    model = tmp_path / "ok.onnx"
    model.write_bytes(tiny_model().SerializeToString())
    assert "not a regular file" in _cli_one_line(capsys, ["run", str(model), "--inputs", str(fifo)])


@pytest.mark.parametrize("feeds", [[np.zeros((1, 2, 16), np.float32)], None, "hidden_states"])
def test_feeds_that_are_not_a_mapping_are_a_feed_error(feeds):
    from ndp_ep.errors import FeedError

    session = InferenceSession(tiny_model(), shards=2)
    with pytest.raises(FeedError, match="mapping"):
        session.run(None, feeds)


def test_a_graph_the_rules_cannot_read_converts_nothing_and_fails_no_rule(tmp_path, capsys):
    """A swapped-input mutation of an exported block once crashed the one-hot rule's constant folder with an
    AttributeError traceback (found by mutating every node of the sample exports)."""
    source = REPO / "sample_models" / "hf" / "extra" / "deepseek_v3_block_torchscript.onnx"
    model = onnx.load(str(source))
    node = model.graph.node[59]
    swapped = [node.input[1], node.input[0], *node.input[2:]]
    del node.input[:]
    node.input.extend(swapped)
    mutated = tmp_path / "mutated.onnx"
    mutated.write_bytes(model.SerializeToString())
    code = main(["convert", str(mutated), "-o", str(tmp_path / "out.onnx"), "--json"])
    out, err = capsys.readouterr()
    assert code in (0, 2) and "Traceback" not in err
    if code == 2:
        assert len(err.strip().splitlines()) == 1
    else:  # whatever could not be read is reported as skipped, with the reason
        report = json.loads(out)
        assert report["moe_blocks"] or report["skipped"]


def _paper_with_units(path: Path, units: int) -> Path:
    text = (REPO / "hw_model" / "presets" / "paper.toml").read_text(encoding="utf-8")
    assert "\nnum_ndp_units = 4\n" in text
    path.write_text(text.replace("\nnum_ndp_units = 4\n", f"\nnum_ndp_units = {units}\n", 1), encoding="utf-8")
    return path


def test_an_ndp_unit_count_beyond_64_is_refused_by_file_override_and_api(tmp_path, capsys):
    from hw_model.hardware import load_system

    model = tmp_path / "m.onnx"
    model.write_bytes(tiny_model().SerializeToString())
    huge = _paper_with_units(tmp_path / "huge.toml", 10**9)
    in_file = "num_ndp_units must be an integer from 0 to 64, got 1000000000"  # 0: a GPU-only system
    given = "ndp_units: expected an integer from 1 to 64, got 1,000,000,000"  # an override must add units
    from hw_model.errors import SettingsError

    for call, error, expected in (
        (lambda: InferenceSession(model, ndp_units=10**9), SettingsError, given),
        (lambda: InferenceSession(model, hw=load_system("paper"), ndp_units=10**9), SettingsError, given),
        (lambda: convert_model(model, tmp_path / "o.onnx", ndp_units=10**9), SettingsError, given),
        (lambda: InferenceSession(model, hw=huge), HardwareConfigError, in_file),
        (lambda: convert_model(model, tmp_path / "o.onnx", hw=huge), HardwareConfigError, in_file),
    ):
        with pytest.raises(error, match=expected):
            call()
    for argv in (
        ["run", str(model), "--hw", str(huge)],
        ["convert", str(model), "-o", str(tmp_path / "o.onnx"), "--hw", str(huge)],
    ):
        assert expected in _cli_one_line(capsys, argv)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.toml", "m.onnx"]


def test_converting_for_a_system_without_ndp_units_is_refused_and_writes_nothing(tmp_path, capsys):
    from hw_model.errors import SettingsError
    from hw_model.hardware import load_system

    model = tmp_path / "m.onnx"
    model.write_bytes(tiny_model().SerializeToString())
    gpu_only = _paper_with_units(tmp_path / "gpu_only.toml", 0)
    out = tmp_path / "o.onnx"
    cases = [
        ({"ndp_units": 0}, SettingsError, "ndp_units: expected an integer from 1 to 64, got 0"),
        ({"hw": load_system("paper"), "ndp_units": 0}, SettingsError, "expected an integer from 1 to 64, got 0"),
        ({"hw": gpu_only}, NdpEpError, "conversion places the experts on the NDP units"),
        ({"hw": gpu_only, "shards": 2}, NdpEpError, "conversion places the experts on the NDP units"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            convert_model(model, out, **kwargs)
    line = _cli_one_line(capsys, ["convert", str(model), "-o", str(out), "--hw", str(gpu_only)])
    assert "num_ndp_units" in line and "got 0" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_only.toml", "m.onnx"]


def test_convert_model_takes_model_bytes_as_the_session_does_and_refuses_other_things(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(tiny_model().SerializeToString())
    convert_model(model, tmp_path / "from_path.onnx")
    convert_model(model.read_bytes(), tmp_path / "from_bytes.onnx")
    assert (tmp_path / "from_bytes.onnx").read_bytes() == (tmp_path / "from_path.onnx").read_bytes()
    for junk in (b"junk", 42):
        with pytest.raises(ModelLoadError):
            convert_model(junk, tmp_path / "never.onnx")
    assert not (tmp_path / "never.onnx").exists()
