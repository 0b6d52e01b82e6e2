"""Draw one side (before or after) of a changed region as a standalone SVG: a layered top-to-bottom layout.

    layer 0:   [Softmax]   [MatMul]        nodes placed by topological generation (networkx),
                  │  ╲        │            ordered within a layer by the mean x of their producers,
    layer 1:   [TopK]  [Einsum]            edges drawn as cubic curves from bottom to top centre.

Colours follow the node status: removed red, added green, changed amber, renamed blue, context grey.
"""

from __future__ import annotations

import html

import networkx as nx

from ndp_ep.diff.result import RegionSide

FILL = {"removed": "#fde2e1", "added": "#dcf5e3", "changed": "#fff1c7", "renamed": "#dfeafd", "context": "#f1f1f1"}
STROKE = {"removed": "#c0392b", "added": "#1e8449", "changed": "#b7950b", "renamed": "#2e61b5", "context": "#9a9a9a"}
NODE_HEIGHT_PX = 38
LAYER_GAP_PX = 34
NODE_GAP_PX = 14
CHAR_WIDTH_PX = 6.6
MAX_LABEL_CHARS = 30


def _short(text: str) -> str:
    return text if len(text) <= MAX_LABEL_CHARS else "…" + text[-(MAX_LABEL_CHARS - 1) :]


def _layers(side: RegionSide) -> list[list[str]]:
    graph = nx.DiGraph()
    graph.add_nodes_from(n.node_id for n in side.nodes)
    graph.add_edges_from(side.edges)
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


def draw_region_side(side: RegionSide, caption: str, marker_id: str = "arrow") -> str:
    """An <svg> element (no XML prolog) ready to inline in HTML; ``marker_id`` must be unique in the page."""
    if not side.nodes:
        return (
            f'<svg class="subgraph empty" xmlns="http://www.w3.org/2000/svg" width="220" height="40" role="img" '
            f'aria-label="{html.escape(caption)}"><text x="10" y="24" font-size="12" fill="#777">'
            f"nothing on this side</text></svg>"
        )
    by_id = {n.node_id: n for n in side.nodes}
    widths = {n.node_id: max(len(_short(n.label)), len(n.op)) * CHAR_WIDTH_PX + 18 for n in side.nodes}
    layers = _layers(side)
    row_widths = [sum(widths[i] for i in layer) + NODE_GAP_PX * (len(layer) - 1) for layer in layers]
    canvas_width = max(row_widths) + 2 * NODE_GAP_PX
    boxes: dict[str, tuple[float, float, float]] = {}
    for depth, layer in enumerate(layers):
        x = (canvas_width - row_widths[depth]) / 2
        y = NODE_GAP_PX + depth * (NODE_HEIGHT_PX + LAYER_GAP_PX)
        for node_id in layer:
            boxes[node_id] = (x, y, widths[node_id])
            x += widths[node_id] + NODE_GAP_PX
    canvas_height = NODE_GAP_PX * 2 + len(layers) * (NODE_HEIGHT_PX + LAYER_GAP_PX) - LAYER_GAP_PX
    parts = [
        f'<svg class="subgraph" xmlns="http://www.w3.org/2000/svg" width="{canvas_width:.0f}" '
        f'height="{canvas_height:.0f}" viewBox="0 0 {canvas_width:.0f} {canvas_height:.0f}" role="img" '
        f'aria-label="{html.escape(caption)}">',
        f'<defs><marker id="{marker_id}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#777"/></marker></defs>',
    ]
    for source, target in side.edges:
        sx, sy, sw = boxes[source]
        tx, ty, tw = boxes[target]
        x1, y1, x2, y2 = sx + sw / 2, sy + NODE_HEIGHT_PX, tx + tw / 2, ty
        bend = max(18.0, (y2 - y1) / 2)
        parts.append(
            f'<path d="M {x1:.1f} {y1:.1f} C {x1:.1f} {y1 + bend:.1f}, {x2:.1f} {y2 - bend:.1f}, {x2:.1f} {y2:.1f}" '
            f'fill="none" stroke="#888" stroke-width="1.2" marker-end="url(#{marker_id})"/>'
        )
    for node_id, (x, y, width) in boxes.items():
        node = by_id[node_id]
        parts.append(
            f'<g class="node {node.status}"><title>{html.escape(node.label)} ({html.escape(node.op)}) — '
            f"{node.status}</title>"
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{NODE_HEIGHT_PX}" rx="5" '
            f'fill="{FILL[node.status]}" stroke="{STROKE[node.status]}" stroke-width="1.4"/>'
            f'<text x="{x + width / 2:.1f}" y="{y + 15:.1f}" text-anchor="middle" font-size="11" '
            f'font-weight="bold" font-family="sans-serif">{html.escape(node.op)}</text>'
            f'<text x="{x + width / 2:.1f}" y="{y + 29:.1f}" text-anchor="middle" font-size="10" '
            f'font-family="monospace" fill="#444">{html.escape(_short(node.label))}</text></g>'
        )
    parts.append("</svg>")
    return "".join(parts)
