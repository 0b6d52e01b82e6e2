"""The claim step: which nodes of a converted model the NDP provider takes, found once.

Like ONNX Runtime's ``GetCapability``, :func:`claim` walks the graph once and returns the
``ndp_ep::ShardedMoEExperts`` nodes (the only op the provider runs) with their validated contract specs, in
graph order. Everything downstream consumes that result: the native library's own ``GetCapability`` claims
exactly these nodes; the session builds its simulator layers and its report from them; the costing replaces
them; :func:`annotate_placement` records where their shards live. Every other node stays with ONNX Runtime's
CPU provider and is costed as GPU work.

The claimed node is not pinned to the NDP units: for each invocation the scheduler places every activated
expert on the GPU or spreads its shards over the NDP units.
"""

from __future__ import annotations

from dataclasses import dataclass

from graph_passes import sharded_op
from graph_passes.sharded_op import ShardedOpSpec
from hw_model.hardware import SystemSpec


@dataclass(frozen=True)
class ClaimedNode:
    """One node the provider runs: its position among the claimed nodes, its name and its contract."""

    index: int
    name: str
    spec: ShardedOpSpec

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ValueError(f"ClaimedNode.index must be non-negative, got {self.index}")
        if not self.name:
            raise ValueError("ClaimedNode.name must not be empty")


def is_ndp_supported(node) -> bool:
    """True for the nodes the provider claims (``ndp_ep::ShardedMoEExperts``)."""
    return sharded_op.is_sharded_node(node)


def claim(model) -> tuple[ClaimedNode, ...]:
    """The provider's nodes of ``model`` (an ``onnx.ModelProto``) in graph order, each contract-checked.

    Raises :class:`graph_passes.sharded_op.ShardedOpError` when a node of the op breaks the contract.
    """
    claimed: list[ClaimedNode] = []
    for node in model.graph.node:
        if is_ndp_supported(node):
            claimed.append(ClaimedNode(len(claimed), node.name, sharded_op.parse_node(node)))
    return tuple(claimed)


def placement(spec: ShardedOpSpec, system: SystemSpec, policy: str) -> dict:
    """Where a claimed node's shards live and who decides each invocation's placement."""
    units = max(system.num_ndp_units, 1)
    return {
        "device": "ndp+gpu",
        "hardware": system.name,
        "ndp_units": system.num_ndp_units,
        "shard_to_ndp_unit": [s % units for s in range(spec.shards)],
        "scheduler": policy,
        "note": "the scheduler places each activated expert on the GPU or on the NDP units per invocation",
    }


def annotate_placement(model, system: SystemSpec, policy: str, claimed: tuple[ClaimedNode, ...] | None = None) -> None:
    """Record on every claimed node of ``model`` (the ``ndp_ep.placement`` metadata) where its shards live."""
    claimed = claim(model) if claimed is None else claimed
    by_name = {c.name: c for c in claimed}
    for node in model.graph.node:
        found = by_name.get(node.name) if is_ndp_supported(node) else None
        if found is not None:
            sharded_op.set_metadata(node, sharded_op.META_PLACEMENT, placement(found.spec, system, policy))
