"""The text helpers every command prints with: plurals, aligned columns, wrapped paragraphs."""

from __future__ import annotations

import pytest

from ndp_ep.text import human_bytes, plural, table, wrap


@pytest.mark.parametrize(
    ("count", "noun", "expected"),
    [
        (0, "token", "0 tokens"),
        (1, "token", "1 token"),
        (2, "MoE block", "2 MoE blocks"),
        (1, "NDP unit", "1 NDP unit"),
    ],
)
def test_plural_uses_the_singular_only_for_one(count, noun, expected):
    assert plural(count, noun) == expected


def test_plural_takes_an_irregular_form():
    assert plural(3, "entry", "entries") == "3 entries" and plural(1, "entry", "entries") == "1 entry"


def test_table_pads_each_column_to_its_widest_cell():
    lines = table([["a", "1.5", "x"], ["long name", "22.25", ""]], "<><", indent="  ")
    assert lines == ["  a            1.5  x", "  long name  22.25"]


def test_table_refuses_ragged_rows_and_unknown_alignments():
    with pytest.raises(ValueError, match="2 cells"):
        table([["a", "b"], ["c"]], "<<")
    with pytest.raises(ValueError, match="align"):
        table([["a"]], "^")


def test_wrap_keeps_words_whole_and_lines_short():
    text = "a " * 10 + "unbreakable_" * 10 + " end"
    lines = wrap(text, width=30, indent="  ")
    assert "  " + "unbreakable_" * 10 in lines and all(len(line) <= 30 or " " not in line.strip() for line in lines)
    assert " ".join(" ".join(lines).split()) == " ".join(text.split())


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (98304, "96.0 KiB"),
        (1e5, "97.7 KiB"),
        (32e9, "29.8 GiB"),
        (3 * 2**30, "3.0 GiB"),
        (4 * 2**40, "4.0 TiB"),
        (-1536, "-1.5 KiB"),
    ],
)
def test_human_bytes_picks_the_largest_unit_that_keeps_the_value_at_least_one(count, expected):
    assert human_bytes(count) == expected
