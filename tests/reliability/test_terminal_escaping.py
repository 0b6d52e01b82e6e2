"""No command sends a control character from a model or a hardware file to the terminal (issue 32, kind 8).

Node and initializer names (which become block names), op types in error lines and a hardware file's ``name``
carry escape sequences (a window-title change, a screen clear, a C1 CSI); ``inspect``, ``convert``, ``run`` and
the error line on stderr must show them escaped, as ``diff`` does.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from onnx import TensorProto, helper

from ndp_ep.cli import main
from ndp_ep.text import terminal_safe
from tests.reliability.conftest import tiny_model

HOSTILE = "\x1b]0;owned\x07\x1b[2J\x9b31m"
REPO = Path(__file__).resolve().parents[2]
RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _hostile_model(tmp_path):
    model = tiny_model()
    renames = {}
    for tensor in model.graph.initializer:
        renames[tensor.name] = HOSTILE + tensor.name
        tensor.name = renames[tensor.name]
    for node in model.graph.node:
        node.name = HOSTILE + node.name
        node.input[:] = [renames.get(name, name) for name in node.input]
    path = tmp_path / "hostile.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _assert_clean(capsys):
    out, err = capsys.readouterr()
    assert not RAW.search(out), out
    assert not RAW.search(err), err
    return out, err


def test_terminal_safe_escapes_every_control_but_tab_and_newline():
    text = "a\tb\nc" + "".join(chr(c) for c in (*range(0, 9), *range(11, 32), *range(0x7F, 0xA0)))
    safe = terminal_safe(text)
    assert not RAW.search(safe)
    assert safe.startswith("a\tb\nc\\x00") and safe.endswith("\\x9f")
    assert safe.count("\\x") == 9 + 21 + 33


@pytest.mark.parametrize("command", ["inspect", "convert", "run"])
def test_model_names_reach_the_terminal_escaped(tmp_path, capsys, command):
    model = _hostile_model(tmp_path)
    argv = [command, str(model)]
    if command == "convert":
        argv += ["-o", str(tmp_path / "out.onnx")]
    code = main(argv)
    out, err = _assert_clean(capsys)
    assert code in (0, 2), err
    assert "\\x1b]0;owned\\x07" in out + err  # shown, not dropped


def test_an_op_type_in_an_error_line_is_escaped(tmp_path, capsys):
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Evil\x1b[2J\x1b]0;t\x07", ["x"], ["y"], domain="ai.evil\x1b[5m")],
        "g",
        [value("x", TensorProto.FLOAT, [2])],
        [value("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.evil\x1b[5m", 1)]
    )
    path = tmp_path / "evil.onnx"
    path.write_bytes(model.SerializeToString())
    assert main(["run", str(path)]) == 2
    _assert_clean(capsys)


def test_a_hardware_name_is_escaped(tmp_path, capsys):
    hw = tmp_path / "hw.toml"
    text = (REPO / "hw_model" / "presets" / "paper.toml").read_text(encoding="utf-8")
    hw.write_text(re.sub(r"(?m)^name\s*=.*$", lambda _: 'name = "x\\u001b]0;owned\\u0007y"', text, count=1))
    code = main(["convert", str(_hostile_model(tmp_path)), "-o", str(tmp_path / "o.onnx"), "--hw", str(hw)])
    out, err = _assert_clean(capsys)
    assert code in (0, 2), err
    assert "\\x1b]0;owned\\x07" in out
