"""Small helpers for the text the CLI and the reports print: plurals, aligned columns, wrapped notes.

plural(1, "token")                 -> "1 token"
plural(3, "MoE block")             -> "3 MoE blocks"
table([["a", "1.0"], ["bbb", "22.5"]], align="<>")   -> rows padded to common column widths
wrap("a long note ...", width=80, indent="    ")   -> lines never cut inside a word
human_bytes(3 * 2**30)             -> "3.0 GiB" (hw_model.units', the one byte formatter, re-exported)
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from hw_model.units import human_bytes as human_bytes

TERMINAL_WIDTH = 80


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """``count`` and ``noun``, the noun in the plural unless ``count`` is exactly 1."""
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {plural_form or noun + 's'}"


def table(rows: Sequence[Sequence[str]], align: str, gap: str = "  ", indent: str = "") -> list[str]:
    """Rows of cells padded to the widest cell of each column; ``align`` holds one ``<`` or ``>`` per column."""
    if not rows:
        return []
    columns = len(align)
    if any(len(row) != columns for row in rows):
        raise ValueError(f"every row needs {columns} cells")
    if set(align) - {"<", ">"}:
        raise ValueError(f"align takes only '<' and '>', got {align!r}")
    widths = [max(len(row[c]) for row in rows) for c in range(columns)]
    lines = []
    for row in rows:
        cells = [cell.ljust(w) if a == "<" else cell.rjust(w) for cell, w, a in zip(row, widths, align, strict=True)]
        lines.append((indent + gap.join(cells)).rstrip())
    return lines


def wrap(text: str, width: int = TERMINAL_WIDTH, indent: str = "", subsequent_indent: str | None = None) -> list[str]:
    """``text`` wrapped at ``width`` columns on word boundaries (a word longer than a line is kept whole)."""
    return textwrap.wrap(
        text,
        width=width,
        initial_indent=indent,
        subsequent_indent=indent if subsequent_indent is None else subsequent_indent,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [indent.rstrip()]
