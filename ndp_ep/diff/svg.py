"""Draw one side (before or after) of a changed region as a standalone SVG: a layered top-to-bottom layout.

    layer 0:   [Softmax]   [MatMul]        nodes placed by topological generation (networkx),
                  │  ╲        │            ordered within a layer by the mean x of their producers,
               probs  logits  │            edges drawn as cubic curves, labelled with their tensor's name,
    layer 1:   [TopK]  [Einsum]            from bottom to top centre.

A node box shows its op, its full name wrapped over as many lines as it needs (broken after ``/ . _`` where
possible) and the weights it reads (the expert shards of a sharded node, grouped by kind); its ``<title>``
tooltip repeats all of it. An edge label longer than :data:`MAX_EDGE_LABEL_CHARS` is shortened in the
drawing and given in full in its tooltip. Colours follow the node status: removed red, added green, changed
amber, renamed blue, context grey.
"""

from __future__ import annotations

import html
import re

import networkx as nx

from ndp_ep.diff.result import DrawNode, RegionSide

FILL = {"removed": "#fde2e1", "added": "#dcf5e3", "changed": "#fff1c7", "renamed": "#dfeafd", "context": "#f1f1f1"}
STROKE = {"removed": "#c0392b", "added": "#1e8449", "changed": "#b7950b", "renamed": "#2e61b5", "context": "#9a9a9a"}
PAD_PX = 8
OP_LINE_PX = 15
LABEL_LINE_PX = 12
WEIGHT_LINE_PX = 11
LAYER_GAP_PX = 44  # room for the edge labels between layers
NODE_GAP_PX = 14
CHAR_WIDTH_PX = {"op": 6.8, "label": 6.1, "weight": 5.6, "edge": 5.2}
MAX_LABEL_CHARS = 30
MAX_EDGE_LABEL_CHARS = 24


def wrap_label(text: str, width: int = MAX_LABEL_CHARS) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken after ``/``, ``.``, ``_`` or ``-`` where it
    can be (a run longer than a line without such a break is split at the width); joined, the lines give
    ``text`` back exactly."""
    if width < 1:
        raise ValueError(f"width must be positive, got {width}")
    pieces: list[str] = []
    for piece in re.findall(r"[^/._\-]*[/._\-]?", text):
        while len(piece) > width:
            pieces.append(piece[:width])
            piece = piece[width:]
        if piece:
            pieces.append(piece)
    lines: list[str] = []
    for piece in pieces:
        if lines and len(lines[-1]) + len(piece) <= width:
            lines[-1] += piece
        else:
            lines.append(piece)
    return lines or [""]


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit // 2 - 1] + "…" + text[-(limit - limit // 2) :]


def _layers(side: RegionSide) -> list[list[str]]:
    graph = nx.DiGraph()
    graph.add_nodes_from(n.node_id for n in side.nodes)
    graph.add_edges_from((e.source, e.target) for e in side.edges)
    try:
        layers = [list(layer) for layer in nx.topological_generations(graph)]
    except nx.NetworkXUnfeasible:  # a cyclic (invalid) graph: draw in file order
        return [[n.node_id] for n in side.nodes]
    order = {n.node_id: k for k, n in enumerate(side.nodes)}
    placed: dict[str, float] = {}
    for layer in layers:

        def barycentre(node_id: str) -> tuple[float, int]:
            xs = [placed[p] for p in graph.predecessors(node_id) if p in placed]
            return (sum(xs) / len(xs) if xs else float(order[node_id]), order[node_id])

        layer.sort(key=barycentre)
        for position, node_id in enumerate(layer):
            placed[node_id] = float(position)
    return layers


def _box_size(node: DrawNode) -> tuple[float, float]:
    label = wrap_label(node.label)
    width = max(
        len(node.op) * CHAR_WIDTH_PX["op"],
        max(len(line) for line in label) * CHAR_WIDTH_PX["label"],
        max((len(w) for w in node.weights), default=0) * CHAR_WIDTH_PX["weight"],
    )
    height = 2 * PAD_PX + OP_LINE_PX + len(label) * LABEL_LINE_PX + len(node.weights) * WEIGHT_LINE_PX
    return width + 2 * PAD_PX, height


def _node_svg(node: DrawNode, x: float, y: float, width: float, height: float) -> str:
    centre = x + width / 2
    tooltip = f"{node.label} ({node.op}) — {node.status}"
    if node.weights:
        tooltip += "\nweights: " + "; ".join(node.weights)
    parts = [
        f'<g class="node {node.status}"><title>{html.escape(tooltip)}</title>'
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{height:.1f}" rx="5" '
        f'fill="{FILL[node.status]}" stroke="{STROKE[node.status]}" stroke-width="1.4"/>'
    ]
    baseline = y + PAD_PX + 11
    parts.append(
        f'<text x="{centre:.1f}" y="{baseline:.1f}" text-anchor="middle" font-size="11" font-weight="bold" '
        f'font-family="sans-serif">{html.escape(node.op)}</text>'
    )
    baseline += OP_LINE_PX - 2
    for line in wrap_label(node.label):
        parts.append(
            f'<text class="label" x="{centre:.1f}" y="{baseline:.1f}" text-anchor="middle" font-size="10" '
            f'font-family="monospace" fill="#444">{html.escape(line)}</text>'
        )
        baseline += LABEL_LINE_PX
    for line in node.weights:
        parts.append(
            f'<text class="weights" x="{centre:.1f}" y="{baseline:.1f}" text-anchor="middle" font-size="9" '
            f'font-family="monospace" fill="#6b4f00">{html.escape(line)}</text>'
        )
        baseline += WEIGHT_LINE_PX
    parts.append("</g>")
    return "".join(parts)


def draw_region_side(side: RegionSide, caption: str, marker_id: str = "arrow") -> str:
    """An <svg> element (no XML prolog) ready to inline in HTML; ``marker_id`` must be unique in the page."""
    if not side.nodes:
        return (
            f'<svg class="subgraph empty" xmlns="http://www.w3.org/2000/svg" width="220" height="40" role="img" '
            f'aria-label="{html.escape(caption)}"><text x="10" y="24" font-size="12" fill="#777">'
            f"nothing on this side</text></svg>"
        )
    by_id = {n.node_id: n for n in side.nodes}
    sizes = {n.node_id: _box_size(n) for n in side.nodes}
    layers = _layers(side)
    row_widths = [sum(sizes[i][0] for i in layer) + NODE_GAP_PX * (len(layer) - 1) for layer in layers]
    row_heights = [max(sizes[i][1] for i in layer) for layer in layers]
    canvas_width = max(row_widths) + 2 * NODE_GAP_PX
    boxes: dict[str, tuple[float, float, float, float]] = {}
    y = float(NODE_GAP_PX)
    for depth, layer in enumerate(layers):
        x = (canvas_width - row_widths[depth]) / 2
        for node_id in layer:
            width, height = sizes[node_id]
            boxes[node_id] = (x, y, width, height)
            x += width + NODE_GAP_PX
        y += row_heights[depth] + LAYER_GAP_PX
    canvas_height = y - LAYER_GAP_PX + NODE_GAP_PX
    parts = [
        f'<svg class="subgraph" xmlns="http://www.w3.org/2000/svg" width="{canvas_width:.0f}" '
        f'height="{canvas_height:.0f}" viewBox="0 0 {canvas_width:.0f} {canvas_height:.0f}" role="img" '
        f'aria-label="{html.escape(caption)}">',
        f'<defs><marker id="{marker_id}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#777"/></marker></defs>',
    ]
    labels = []
    for edge in side.edges:
        sx, sy, sw, sh = boxes[edge.source]
        tx, ty, tw, _th = boxes[edge.target]
        x1, y1, x2, y2 = sx + sw / 2, sy + sh, tx + tw / 2, ty
        bend = max(18.0, (y2 - y1) / 2)
        parts.append(
            f'<path d="M {x1:.1f} {y1:.1f} C {x1:.1f} {y1 + bend:.1f}, {x2:.1f} {y2 - bend:.1f}, {x2:.1f} {y2:.1f}" '
            f'fill="none" stroke="#888" stroke-width="1.2" marker-end="url(#{marker_id})"/>'
        )
        # the curve's midpoint (its control points are symmetric about it); labels drawn over every curve
        labels.append(
            f'<g class="edge-label"><title>{html.escape(edge.tensor)}</title>'
            f'<text x="{(x1 + x2) / 2:.1f}" y="{(y1 + y2) / 2 + 3:.1f}" text-anchor="middle" font-size="9" '
            f'font-family="monospace" fill="#555" stroke="#fff" stroke-width="3" paint-order="stroke">'
            f"{html.escape(_short(edge.tensor, MAX_EDGE_LABEL_CHARS))}</text></g>"
        )
    parts.extend(labels)
    for node_id, (x, y, width, height) in boxes.items():
        parts.append(_node_svg(by_id[node_id], x, y, width, height))
    parts.append("</svg>")
    return "".join(parts)
