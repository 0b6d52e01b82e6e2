"""Recognise ndp-ep MoE rewrites: ``ndp_ep::ShardedMoEExperts`` nodes and what they replaced.

A rewritten block in model B looks like::

    router (kept) ─┬─ expert_ids ──────────┐
                   └─ routing_weights ─────┤
    hidden ────────────────────────────────┼─> ndp_ep::ShardedMoEExperts ─> [T, H]
    {block}.experts.{e}.shard{s}.gate_up ─> Concat ─> packed_gate_up ─┘
    {block}.experts.{e}.shard{s}.down ────> Concat ─> packed_down ────┘

The node's attributes (layer, num_experts, top_k, shards, hidden, ffn, activation) and metadata_props
(``ndp_ep.replaced_nodes``, ``ndp_ep.block``, ``ndp_ep.placement``) describe the block; every field is read
defensively because the format may gain or lose fields.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ndp_ep.diff.loading import ModelSnapshot, NodeRecord

SHARDED_OP = "ShardedMoEExperts"
NDP_EP_DOMAIN = "ndp_ep"
INT_FIELDS = ("num_experts", "top_k", "shards", "hidden", "ffn")


@dataclass(frozen=True)
class ShardedNode:
    """One ShardedMoEExperts node with its parsed block description."""

    node: NodeRecord
    block: str
    fields: Mapping[str, Any]
    placement: Mapping[str, Any] | None
    replaced_names: tuple[str, ...] | None


def _json_entry(entries: Mapping[str, str], key: str) -> Any:
    """The JSON value stored as text under ``key`` (a node attribute or metadata entry), else None."""
    text = entries.get(key)
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _attribute_value(node: NodeRecord, name: str) -> Any:
    return _json_entry(node.attributes, name)


def _json_metadata(node: NodeRecord, key: str) -> Any:
    return _json_entry(node.metadata, key)


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def find_sharded_nodes(snapshot: ModelSnapshot) -> tuple[ShardedNode, ...]:
    found = []
    for node in snapshot.nodes:
        if node.op_type != SHARDED_OP or node.domain != NDP_EP_DOMAIN:
            continue
        block_meta = _json_metadata(node, "ndp_ep.block")
        block_meta = block_meta if isinstance(block_meta, dict) else {}
        fields: dict[str, Any] = {}
        for key in INT_FIELDS:
            value = _as_int(_attribute_value(node, key))
            fields[key] = value if value is not None else _as_int(block_meta.get(key))
        activation = _attribute_value(node, "activation") or block_meta.get("activation")
        fields["activation"] = str(activation) if activation is not None else None
        layer = _attribute_value(node, "layer") or block_meta.get("layer") or block_meta.get("block")
        placement = _json_metadata(node, "ndp_ep.placement")
        if placement is not None and not isinstance(placement, dict):
            placement = {"value": placement}
        replaced = _json_metadata(node, "ndp_ep.replaced_nodes")
        replaced_names = tuple(str(n) for n in replaced) if isinstance(replaced, list) else None
        found.append(
            ShardedNode(
                node=node,
                block=str(layer) if layer else (node.name or f"#{node.index}"),
                fields=MappingProxyType(fields),
                placement=MappingProxyType(placement) if placement is not None else None,
                replaced_names=replaced_names,
            )
        )
    return tuple(found)
