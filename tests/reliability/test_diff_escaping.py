"""Hostile node names cannot break the HTML diff's scripts or drive the terminal (issue 11, item 7)."""

from __future__ import annotations

import json
import re

import pytest
from onnx import TensorProto, helper

from ndp_ep.diff import diff_models, render_html, render_text, to_json_document

HOSTILE = ["x<!--<script>", "</script><script>alert(1)</script>", "a\x1b]0;owned\x07b", "c\x1b[2J\x1b[31md", "e\x9bf"]


def _model(names):
    value = helper.make_tensor_value_info("v0", TensorProto.FLOAT, [2])
    nodes, previous = [], "v0"
    for position, name in enumerate(names):
        nodes.append(helper.make_node("Relu", [previous], [f"v{position + 1}"], name=name))
        previous = f"v{position + 1}"
    out = helper.make_tensor_value_info(previous, TensorProto.FLOAT, [2])
    return helper.make_model(helper.make_graph(nodes, "g", [value], [out]), opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def hostile_diff(tmp_path):
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    a.write_bytes(_model(["plain"]).SerializeToString())
    b.write_bytes(_model(HOSTILE).SerializeToString())
    return diff_models(a, b)


def test_embedded_json_has_no_markup_and_round_trips(hostile_diff):
    page = render_html(hostile_diff, to_json_document(hostile_diff))
    match = re.search(r'<script type="application/json" id="diff-data">(.*?)</script>', page, re.S)
    assert match is not None
    embedded = match.group(1)
    assert "<" not in embedded and ">" not in embedded
    assert json.loads(embedded) == json.loads(json.dumps(to_json_document(hostile_diff)))
    names = json.dumps(json.loads(embedded))
    assert all(json.dumps(name)[1:-1] in names for name in HOSTILE[:2])
    # the page has exactly the scripts it was built with: none opened or closed by a name
    assert page.count("<script") == page.count("</script>") == 3


@pytest.mark.parametrize("colour", [False, True])
def test_text_output_shows_control_characters_escaped(hostile_diff, colour):
    text = render_text(hostile_diff, colour=colour, max_items=0)
    assert "\x07" not in text and "\x9b" not in text and "\x1b]" not in text and "\x1b[2J" not in text
    assert "\\x1b]0;owned\\x07" in text
    if colour:  # only colour codes survive (a name may at most recolour itself)
        codes = {code for seq in re.findall(r"\x1b\[([0-9;]*)m", text) for code in seq.split(";")}
        assert codes <= {"0", "1", "2", "31", "32", "33", "34", "36"}
        assert len(re.findall("\x1b", text)) == len(re.findall(r"\x1b\[[0-9;]*m", text))
    else:
        assert "\x1b" not in text
