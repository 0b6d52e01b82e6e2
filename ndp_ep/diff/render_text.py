"""The default, human-readable output of ``ndp-ep diff`` (ANSI colours when asked for).

Sections: headline and counts, opset/io/function changes, MoE block rewrites ("these N nodes → these
sharded expert ops"), changed / removed / added / renamed nodes (nodes inside a MoE block are shown with their
block, not one by one), and initializer groups. Long lists are cut at ``max_items`` with a count of the rest.
Lines are wrapped at ``width`` columns (80 by default) between words, never inside one; a continuation is
indented four spaces deeper than its line. Colour codes do not count towards the width.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ndp_ep.diff.renderers import RenderOptions
from ndp_ep.diff.result import INITIALIZER_STATUSES, InitializerDiff, ModelDiff, ModelSummary, MoEBlockDiff, NodeRef
from ndp_ep.text import human_bytes, plural, terminal_safe

FORMAT = "text"
DESCRIPTION = "readable text, wrapped at 80 columns, coloured on a terminal (the default)"

_COLOURS = {"red": "31", "green": "32", "yellow": "33", "blue": "34", "bold": "1", "dim": "2", "cyan": "36"}
INDENT = "  "
WIDTH = 80
CONTINUATION = "    "
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
SIZE_UNITS = frozenset(unit + end for unit in ("B", "KiB", "MiB", "GiB", "TiB") for end in ("", ")", ";"))
PROVENANCE = {
    "metadata": "recorded by ndp-ep at conversion",
    "inferred": "inferred from node names (the converted node does not list them)",
}
STATUS_MARKS = {"changed": ("~", "yellow"), "removed": ("-", "red"), "added": ("+", "green"), "renamed": ("=", "blue")}
INIT_COLOURS = {
    "split": "cyan",
    "merged": "cyan",
    "removed": "red",
    "added": "green",
    "renamed": "blue",
    "values_changed": "yellow",
    "reshaped": "yellow",
    "retyped": "yellow",
}


def placement_text(placement: Mapping[str, Any] | None) -> str:
    """'device ndp+gpu · ndp_units 4 · shard_to_ndp_unit [0, 1, 2, 3]': every value in full."""
    if placement is None:
        return "not annotated"
    parts = []
    for key in sorted(placement):
        value = placement[key]
        parts.append(f"{key} {value if isinstance(value, str) else json.dumps(value)}")
    return " · ".join(parts)


def visible_width(text: str) -> int:
    """Columns ``text`` takes on a terminal (colour codes take none)."""
    return len(_ANSI.sub("", text))


def wrap_line(text: str, width: int = WIDTH) -> list[str]:
    """``text`` broken between words into lines of at most ``width`` visible columns (a word longer than a
    line stays whole); continuation lines are indented four spaces deeper than the first. Runs of spaces
    inside a line are kept (aligned columns stay aligned); a ``[...]`` list or shape and a size with its
    unit (``770.1 KiB``) are never broken."""
    if visible_width(text) <= width:
        return [text]
    indent = text[: len(text) - len(text.lstrip(" "))]
    continuation = indent + CONTINUATION
    lines: list[str] = []
    current = indent
    for space, word in _words(text[len(indent) :]):
        if current not in (indent, continuation) and visible_width(current + space + word) > width:
            lines.append(current)
            current = continuation + word
        else:
            current += ("" if current in (indent, continuation) else space) + word
    lines.append(current)
    return lines


def _words(text: str) -> list[tuple[str, str]]:
    """``(spaces before, word)`` pairs; spaces inside brackets or before a size unit join their neighbours."""

    def brackets(word: str) -> int:
        plain = _ANSI.sub("", word)  # a colour code is written with "[" too
        return plain.count("[") - plain.count("]")

    parts = re.split(r"( +)", text)
    words: list[tuple[str, str]] = [("", parts[0])]
    depth = brackets(parts[0])
    for space, word in zip(parts[1::2], parts[2::2], strict=True):
        if depth > 0 or _ANSI.sub("", word) in SIZE_UNITS:
            words[-1] = (words[-1][0], words[-1][1] + space + word)
        else:
            words.append((space, word))
        depth += brackets(word)
    return words


def op_histogram(refs: Iterable[NodeRef]) -> str:
    """'1 ndp_ep::ShardedMoEExperts, 2 Concat': custom-domain ops first, then by count."""
    counts = Counter(r.qualified_op for r in refs)
    return ", ".join(f"{n} {op}" for op, n in sorted(counts.items(), key=lambda kv: ("::" not in kv[0], -kv[1], kv[0])))


class _Writer:
    def __init__(self, colour: bool, max_items: int, width: int) -> None:
        self.colour = colour
        self.max_items = max_items
        self.width = width
        self.lines: list[str] = []

    def paint(self, text: str, *styles: str) -> str:
        if not self.colour or not styles:
            return text
        codes = ";".join(_COLOURS[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"

    def line(self, text: str = "") -> None:
        for part in text.split("\n"):
            self.lines.extend(wrap_line(part, self.width))

    def limited(self, items: Sequence[str], indent: str) -> None:
        """One entry per item (an item may span lines); at most ``max_items`` items."""
        shown = items if self.max_items <= 0 else items[: self.max_items]
        for item in shown:
            self.line(indent + item)
        if len(shown) < len(items):
            self.line(indent + self.paint(f"… and {len(items) - len(shown)} more (use --max-items 0)", "dim"))


def _model_line(label: str, summary: ModelSummary) -> str:
    return (
        f"{label}: {summary.path}  ({summary.node_count} nodes, {summary.initializer_count} initializers, "
        f"{human_bytes(summary.initializer_bytes)})"
    )


def _counts(counts: dict[str, int], order: Sequence[str]) -> str:
    return " · ".join(f"{key.replace('_', ' ')} {counts[key]}" for key in order if counts.get(key))


def block_headline(block: MoEBlockDiff) -> str:
    """'17 nodes (4 Unsqueeze, …) → 1 ndp_ep::ShardedMoEExperts', always model A's side first."""
    original = f"{plural(len(block.replaced_nodes), 'node')} ({op_histogram(block.replaced_nodes)})"
    sharded = op_histogram(block.new_nodes)
    return f"{original} → {sharded}" if block.direction == "rewrite" else f"{sharded} → {original}"


def _block_lines(out: _Writer, block: MoEBlockDiff) -> None:
    out.line(f"  {out.paint(block.block, 'bold')}: {block_headline(block)}")
    facts = [
        f"experts {block.num_experts if block.num_experts is not None else '?'}",
        f"top-k {block.top_k if block.top_k is not None else '?'}",
        f"shards {block.shards if block.shards is not None else '?'}",
    ]
    facts += [f"{name} {value}" for name, value in (("hidden", block.hidden), ("ffn", block.ffn)) if value is not None]
    if block.activation:
        facts.append(f"activation {block.activation}")
    out.line("    " + " · ".join(facts))
    out.line(f"    placement: {placement_text(block.placement)}")
    out.line(f"    replaced nodes: {PROVENANCE[block.replaced_source]}")
    if block.contract_error:
        out.line("    " + out.paint(f"the sharded node breaks the op contract: {block.contract_error}", "yellow"))
    if block.missing_replaced_nodes:
        missing = ", ".join(block.missing_replaced_nodes[:5])
        out.line("    " + out.paint(f"listed as replaced but absent from the other model: {missing}", "yellow"))
    for item in block.initializers:
        if item.status in ("split", "merged"):
            summary = item.summary.removeprefix(block.block + " ")
            out.line(f"    {summary}  ({human_bytes(item.a_bytes)} → {human_bytes(item.b_bytes)})")
    others = [i for i in block.initializers if i.status not in ("split", "merged")]
    # Small tensors (axes, shapes) that only the original nodes used disappear with them.
    gone_status = "removed" if block.direction == "rewrite" else "added"
    gone = [i for i in others if i.status == gone_status]
    if gone:
        names = ", ".join((i.a or i.b)[0].name.removeprefix(block.block + ".") for i in gone[:4])
        more = f", … {len(gone) - 4} more" if len(gone) > 4 else ""
        total = human_bytes(sum(i.a_bytes + i.b_bytes for i in gone))
        out.line(
            f"    {len(gone)} other initializers used only by the original nodes {gone_status} ({names}{more}; {total})"
        )
    for item in others:
        if item.status != gone_status:
            out.line(f"    {item.status} {item.summary}")


def _init_line(out: _Writer, item: InitializerDiff) -> str:
    status = out.paint(f"{item.status.replace('_', ' '):<14}", INIT_COLOURS.get(item.status, "bold"))
    sizes = ""
    if item.status in ("split", "merged", "reshaped", "retyped"):
        sizes = f"  ({human_bytes(item.a_bytes)} → {human_bytes(item.b_bytes)})"
    elif item.status in ("removed", "added"):
        sizes = f"  ({human_bytes(item.a_bytes or item.b_bytes)})"
    return f"{status} {item.summary}{sizes}"


def render_text(diff: ModelDiff, colour: bool = False, max_items: int = 50, width: int = WIDTH) -> str:
    """The readable report: lines of at most ``width`` columns (words are never cut), colours when asked."""
    if width < 20:
        raise ValueError(f"width must be at least 20 columns, got {width}")
    out = _Writer(colour, max_items, width)
    verdict = out.paint("EQUIVALENT", "green", "bold") if diff.equivalent else out.paint("DIFFERENT", "red", "bold")
    out.line(_model_line("A", diff.a))
    out.line(_model_line("B", diff.b))
    out.line(f"Result: {verdict}")
    node_order = ("unchanged", "renamed", "changed", "removed", "added")
    out.line(f"Nodes: {diff.a.node_count} → {diff.b.node_count}   {_counts(dict(diff.node_counts), node_order)}")
    init_order = INITIALIZER_STATUSES
    delta = diff.b.initializer_bytes - diff.a.initializer_bytes
    out.line(
        f"Initializers: {diff.a.initializer_count} → {diff.b.initializer_count}   "
        f"{_counts(dict(diff.initializer_counts), init_order)}"
    )
    out.line(
        f"Initializer bytes: {human_bytes(diff.a.initializer_bytes)} → {human_bytes(diff.b.initializer_bytes)} "
        f"({'+' if delta >= 0 else ''}{human_bytes(delta)}); hashed {human_bytes(diff.hashed_bytes)} of external data"
    )
    if diff.opsets:
        parts = []
        for change in diff.opsets:
            if change.status == "added":
                parts.append(out.paint(f"+ {change.domain} {change.b}", "green"))
            elif change.status == "removed":
                parts.append(out.paint(f"- {change.domain} {change.a}", "red"))
            else:
                parts.append(out.paint(f"~ {change.domain} {change.a} → {change.b}", "yellow"))
        out.line("Opsets: " + ", ".join(parts))
    for value in diff.values:
        out.line(f"Graph {value.kind} #{value.position} {value.status}: {value.a or '∅'} → {value.b or '∅'}")
    for function in diff.functions:
        out.line(f"Function {function.name} {function.status}")

    if diff.moe_blocks:
        out.line()
        for direction, title in (("rewrite", "MoE blocks rewritten by ndp-ep"), ("reverse", "MoE blocks restored")):
            blocks = [b for b in diff.moe_blocks if b.direction == direction]
            if blocks:
                out.line(out.paint(f"{title} ({len(blocks)})", "bold"))
            for block in blocks:
                _block_lines(out, block)

    in_block = [n for n in diff.nodes if n.block is not None]
    for status, title in (("changed", "Changed"), ("removed", "Removed"), ("added", "Added"), ("renamed", "Renamed")):
        items = [n for n in diff.nodes if n.status == status and n.block is None]
        if not items:
            continue
        note = ""
        hidden = sum(1 for n in in_block if n.status == status)
        if hidden:
            note = f", plus {hidden} shown with their MoE block"
        out.line()
        out.line(out.paint(f"{title} nodes ({len(items)}{note})", "bold"))
        mark, colour = STATUS_MARKS[status]
        lines = []
        for item in items:
            if status == "renamed":
                assert item.a is not None and item.b is not None
                text = f"{item.a.name or '#' + str(item.a.index)} → {item.b.name or '#' + str(item.b.index)} "
                text += f"({item.b.qualified_op}, matched by {item.match})"
                lines.append(out.paint(f"{mark} ", colour) + text)
                continue
            ref = item.a if item.a is not None else item.b
            assert ref is not None
            head = out.paint(f"{mark} ", colour) + ref.label()
            if status == "changed":
                assert item.b is not None
                if item.a is not None and item.a.name != item.b.name:
                    head += f" → {item.b.name or '#' + str(item.b.index)}"
                head += f"  [matched by {item.match}]"
            lines.append(head)
            for change in item.changes:
                what = change.field if change.key == change.field else f"{change.field} {change.key}"
                lines[-1] += f"\n  {INDENT}  {what}: {change.a} → {change.b}"
        out.limited(lines, "  ")

    init_items = [i for i in diff.initializers if i.block is None]
    if init_items:
        out.line()
        shown_with_blocks = len(diff.initializers) - len(init_items)
        note = f", plus {shown_with_blocks} shown with their MoE block" if shown_with_blocks else ""
        out.line(out.paint(f"Initializers ({len(init_items)} groups{note})", "bold"))
        out.limited([_init_line(out, item) for item in init_items], "  ")
    return terminal_safe("\n".join(out.lines) + "\n", keep_colours=out.colour)


def render(diff: ModelDiff, options: RenderOptions) -> str:
    return render_text(diff, colour=options.colour, max_items=options.max_items)
