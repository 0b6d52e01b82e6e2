"""Line wrapping of ``ndp-ep diff``'s text: at most the width, never inside a word, a list or a size."""

from __future__ import annotations

import re

import pytest

from ndp_ep.diff.render_text import CONTINUATION, visible_width, wrap_line


def test_short_lines_are_left_alone_with_their_spacing():
    line = "  split          moe experts down  (1.0 KiB → 1.0 KiB)"
    assert wrap_line(line, 80) == [line]


@pytest.mark.parametrize("width", [24, 33, 50, 80])
def test_wrapped_lines_fit_and_rejoin_into_the_same_words(width):
    words = [f"w{k}" * (k % 4 + 1) for k in range(60)]  # at most 12 characters: every word fits a line
    text = "    " + " ".join(words)
    lines = wrap_line(text, width)
    assert len(lines) > 1 and all(len(line) <= width for line in lines)
    assert lines[0].startswith("    w0") and all(line.startswith("    " + CONTINUATION) for line in lines[1:])
    assert " ".join(" ".join(lines).split()) == " ".join(words)


def test_a_word_longer_than_the_line_stays_whole():
    long_path = "/very/" + "long/" * 30 + "model.onnx"
    lines = wrap_line(f"A: {long_path}  (3 nodes)", 40)
    assert long_path in lines[0] or any(long_path in line for line in lines)


def test_lists_shapes_and_sizes_are_not_broken():
    text = "x " * 30 + "shard_to_ndp_unit [0, 1, 2, 3] then 512.0 KiB and [64, 64]"
    for width in range(30, 90):
        lines = wrap_line(text, width)
        assert not any(re.search(r"\[[^\]]*$", line) for line in lines), lines  # no line ends inside brackets
        assert not any(line.lstrip().startswith("KiB") for line in lines)


def test_colour_codes_do_not_count_towards_the_width():
    painted = "\x1b[1mbold\x1b[0m " * 20
    assert visible_width(painted) == len("bold " * 20)
    assert all(visible_width(line) <= 30 for line in wrap_line(painted, 30))
