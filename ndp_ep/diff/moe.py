"""Recognise ndp-ep MoE rewrites: ``ndp_ep::ShardedMoEExperts`` nodes and what they replaced.

A rewritten block in model B looks like this (the contract, with the input order and the weight layouts, is
:mod:`graph_passes.sharded_op`; this module reads the node only through it)::

    router (kept) ─┬─ expert_ids ──────────┐
                   └─ routing_weights ─────┤
    hidden ────────────────────────────────┼─> ndp_ep::ShardedMoEExperts ─> [..., H]
    {block}.experts.{e}.shard{s}.gate_up ──┤   initializers, fed straight to the node,
    {block}.experts.{e}.shard{s}.down ─────┘   expert-major then shard (e * S + s)

The attributes (layer, num_experts, top_k, shards, hidden, ffn, activation, ...) are read when the model is
loaded (:mod:`ndp_ep.diff.sharded_ops`, with :func:`~graph_passes.sharded_op.parse_node`); the metadata
(``ndp_ep.replaced_nodes``, ``ndp_ep.block``, ``ndp_ep.placement``) with
:func:`~graph_passes.sharded_op.get_metadata`. The diff must describe any model, so a node that breaks the
contract (tampered attributes or inputs) is still shown: its facts then come from the ``ndp_ep.block`` summary
where present, and the contract error is reported with the block.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from graph_passes.sharded_op import (
    parse_shard_name,
)
from ndp_ep.diff.result import shape_text
from ndp_ep.text import plural

if TYPE_CHECKING:
    from ndp_ep.diff.loading import ModelSnapshot, NodeRecord

MAX_WEIGHT_LINES = 4


@dataclass(frozen=True)
class ShardedNode:
    """One ShardedMoEExperts node with its parsed block description."""

    node: NodeRecord
    block: str
    fields: Mapping[str, Any]
    placement: Mapping[str, Any] | None
    replaced_names: tuple[str, ...] | None
    contract_error: str | None


def find_sharded_nodes(snapshot: ModelSnapshot) -> tuple[ShardedNode, ...]:
    found = []
    for index, info in snapshot.sharded_ops.items():
        node = snapshot.nodes[index]
        layer = info.fields.get("layer")
        found.append(
            ShardedNode(
                node=node,
                block=str(layer) if layer else (node.name or f"#{node.index}"),
                fields=info.fields,
                placement=info.placement,
                replaced_names=info.replaced_names,
                contract_error=info.contract_error,
            )
        )
    return tuple(found)


def weight_lines(snapshot: ModelSnapshot, node_index: int) -> tuple[str, ...]:
    """What a drawn node reads from initializers, one line per weight: expert shards grouped by kind
    (``gate_up: 8 experts × 4 shards of [64, 64]``), other matrices by name and shape; scalars and 1-D
    constants (axes, shapes) are left out."""
    groups: dict[str, list[tuple[int, int | None, tuple[int, ...]]]] = {}
    others: list[str] = []
    for name in snapshot.nodes[node_index].inputs:
        record = snapshot.initializers.get(name)
        if record is None:
            continue
        shard = parse_shard_name(name)
        if shard is not None:
            groups.setdefault(shard.kind, []).append((shard.expert, shard.shard, record.shape))
        elif len(record.shape) >= 2:
            others.append(f"{name} {shape_text(record.shape)}")
    lines = []
    for kind, members in groups.items():
        experts = len({e for e, _, _ in members})
        shards = len({s for _, s, _ in members if s is not None})
        shapes = {shape for _, _, shape in members}
        shape = shape_text(next(iter(shapes))) if len(shapes) == 1 else "mixed shapes"
        count = plural(experts, "expert") + (f" × {plural(shards, 'shard')}" if shards else "")
        lines.append(f"{kind}: {count} of {shape}")
    lines += others
    if len(lines) > MAX_WEIGHT_LINES:
        lines = [*lines[: MAX_WEIGHT_LINES - 1], f"… {len(lines) - MAX_WEIGHT_LINES + 1} more weights"]
    return tuple(lines)
