"""Small helpers for the text the CLI and the reports print: plurals, aligned columns, wrapped notes.

plural(1, "token")                 -> "1 token"
plural(3, "MoE block")             -> "3 MoE blocks"
table([["a", "1.0"], ["bbb", "22.5"]], align="<>")   -> rows padded to common column widths
wrap("a long note ...", width=80, indent="    ")   -> lines never cut inside a word
human_bytes(3 * 2**30)             -> "3.0 GiB" (hw_model.units', the one byte formatter, re-exported)
terminal_safe("a\x1b]0;t\x07")      -> "a\\x1b]0;t\\x07" (control characters shown, never sent to the terminal)

:func:`terminal_safe` is the one escaping helper of everything the CLI prints: :func:`terminal_streams` wraps
stdout and stderr in :class:`TerminalSafeStream` for the duration of a command (``ndp_ep.cli.main``), so no
printer (a report, a block line, an error naming an op type, a hardware file's ``name``) can send an escape
sequence from a model or a file to the terminal. Text that escaped itself and keeps its own colour codes (the
diff renderer) writes to the stream's ``unescaped`` attribute.
"""

from __future__ import annotations

import contextlib
import re
import sys
import textwrap
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

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


_SGR = re.compile(r"(\x1b\[(?:[0-9]{1,2};)*[0-9]{1,2}m)")


_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")  # and lone surrogates


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte of a file name that is not UTF-8 (surrogateescape): that byte
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str, keep_colours: bool = False) -> str:
    """``text`` with every control character but tab and newline shown as ``\\xNN`` (escape sequences in node
    names, attributes or a hardware ``name``: cursor moves, window titles, screen clears, ...), and each byte of a
    file name that is not UTF-8 (a lone surrogate) as ``\\xNN`` too, so printing never fails on it; with
    ``keep_colours``, plain colour codes (``ESC [ n ; m m``) stay."""
    if not keep_colours:
        return _UNPRINTABLE.sub(_visible, text)
    return "".join(part if _SGR.fullmatch(part) else _UNPRINTABLE.sub(_visible, part) for part in _SGR.split(text))


class TerminalSafeStream:
    """A text stream that passes everything written through :func:`terminal_safe`; a carriage return opening a
    write (a progress bar redrawing its line) is kept. Every other attribute is the wrapped stream's; the wrapped
    stream itself is :attr:`unescaped`."""

    def __init__(self, stream: TextIO) -> None:
        self.unescaped = stream

    def write(self, text: str) -> int:
        if text.startswith("\r"):
            self.unescaped.write("\r" + terminal_safe(text[1:]))
        else:
            self.unescaped.write(terminal_safe(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.unescaped, name)


def unescaped(stream: Any) -> Any:
    """The stream below a :class:`TerminalSafeStream` (for text that escaped itself), else ``stream``."""
    return getattr(stream, "unescaped", stream)


@contextlib.contextmanager
def terminal_streams() -> Iterator[None]:
    """While active, ``sys.stdout`` and ``sys.stderr`` escape control characters (:class:`TerminalSafeStream`)."""
    saved = sys.stdout, sys.stderr
    if not isinstance(sys.stdout, TerminalSafeStream):
        sys.stdout = TerminalSafeStream(sys.stdout)  # type: ignore[assignment]
    if not isinstance(sys.stderr, TerminalSafeStream):
        sys.stderr = TerminalSafeStream(sys.stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
