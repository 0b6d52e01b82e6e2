"""Diagnostics for eager-unrolled exports: the TorchScript tracer unrolled the Python loop over the experts
that the example input happened to hit, so the graph holds a few expert branches instead of all of them.

Such a block cannot be converted (another input drops experts or fails); :func:`find_eager_unrolled` reports
one :class:`Skip` per expert mask with the advice to re-export with ``experts_implementation='batched_mm'``.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx

from graph_passes.graph_index import GraphIndex, scope_of, through
from graph_passes.plan import Skip
from graph_passes.shape_eval import ShapeEvaluator

EAGER_REASON = "eager export unrolled only the experts hit while tracing"


def find_eager_unrolled(index: GraphIndex) -> list[Skip]:
    """One :class:`Skip` per expert mask (``OneHot`` of router ids) whose expert loop was unrolled."""
    routers = {n.output[1] for n in index.nodes_of_type("TopK") if len(n.output) > 1}
    routers |= {n.output[0] for n in index.nodes_of_type("ArgMax")}
    scatters_by_mask: dict[str, list[str]] = {}
    for scatter in list(index.nodes_of_type("ScatterElements")) + list(index.nodes_of_type("ScatterND")):
        if len(scatter.input) < 2:
            continue
        # the nearest one-hot of router ids upstream of the scatter indices is this block's expert mask
        seen_nonzero = False
        for node in _upstream_nearest_first(index, scatter.input[1], stop=routers):
            seen_nonzero = seen_nonzero or node.op_type == "NonZero"
            if node.op_type == "OneHot" and _router_derived(index, routers, node.name):
                if seen_nonzero:
                    scatters_by_mask.setdefault(node.name, []).append(scatter.name)
                break
    skips = []
    for mask_name, scatters in scatters_by_mask.items():
        branches = len(scatters)
        mask = index.node_by_name[mask_name]
        depth = ShapeEvaluator(index).ints(mask.input[1]) if len(mask.input) > 1 else None
        classes = f" of a {depth[0]}-class expert mask" if depth else ""
        where = scope_of(scatters[0]) or mask_name
        skips.append(
            Skip(
                where,
                f"{EAGER_REASON}: {branches} unrolled expert branch(es){classes} (a loop over NonZero of the "
                "one-hot expert mask, accumulated with ScatterElements); other inputs drop experts or fail. "
                "Re-export with experts_implementation='batched_mm'.",
                (mask_name, *scatters),
            )
        )
    return skips


def _upstream_nearest_first(index: GraphIndex, value: str, stop: set[str]) -> Iterable[onnx.NodeProto]:
    """Producers upstream of ``value`` in breadth-first order (nearest first), not crossing ``stop`` values."""
    seen: set[str] = set()
    frontier = [value]
    while frontier:
        next_frontier: list[str] = []
        for current in frontier:
            node = index.producer.get(current)
            if current in stop or node is None or node.name in seen:
                continue
            seen.add(node.name)
            yield node
            next_frontier.extend(i for i in node.input if i)
        frontier = next_frontier


def _router_derived(index: GraphIndex, routers: set[str], mask_name: str) -> set[str]:
    """Values equal to router ids up to casts/reshapes, seen from the OneHot's input."""
    mask = index.node_by_name[mask_name]
    value = through(index, mask.input[0], ("Cast", "Reshape", "Unsqueeze", "Squeeze", "Identity"))
    return {mask.input[0]} if value in routers else set()
