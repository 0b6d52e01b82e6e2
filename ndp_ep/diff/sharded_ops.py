"""What each ``ndp_ep::ShardedMoEExperts`` node of a model says about its block, read while the model is loaded
(:func:`ndp_ep.diff.loading.load_snapshot`); :mod:`ndp_ep.diff.moe` describes the rewrites from it.

The attributes are read with :func:`~graph_passes.sharded_op.parse_node`; a node that breaks the contract
(tampered attributes or inputs) is still described: its facts then come from the ``ndp_ep.block`` summary where
present, and the contract error is kept with them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from graph_passes.sharded_op import (
    META_BLOCK,
    META_PLACEMENT,
    META_REPLACED_NODES,
    ShardedOpError,
    block_of_node_name,
    get_metadata,
    is_sharded_node,
    parse_node,
)

INT_FIELDS = ("num_experts", "top_k", "shards", "hidden", "ffn")


@dataclass(frozen=True)
class ShardedOpInfo:
    """What one sharded expert node says about its block, read when the model is loaded."""

    fields: Mapping[str, Any]
    placement: Mapping[str, Any] | None
    replaced_names: tuple[str, ...] | None
    contract_error: str | None

    def __post_init__(self) -> None:
        if set(self.fields) != {*INT_FIELDS, "activation", "layer"}:
            raise ValueError(f"fields must be {INT_FIELDS} + activation, layer; got {sorted(self.fields)}")


def _as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_sharded_op(node) -> ShardedOpInfo:
    """The block facts of one ``onnx.NodeProto`` of the sharded op (see :func:`is_sharded_node`)."""
    summary = get_metadata(node, META_BLOCK)
    summary = summary if isinstance(summary, dict) else {}
    try:
        spec = parse_node(node)
    except ShardedOpError as exc:
        spec, error = None, str(exc)
    else:
        error = None
    fields: dict[str, Any] = {}
    for key in INT_FIELDS:
        fields[key] = getattr(spec, key) if spec is not None else _as_int(summary.get(key))
    activation = spec.activation if spec is not None else summary.get("activation")
    fields["activation"] = str(activation) if activation is not None else None
    fields["layer"] = spec.layer if spec is not None else block_of_node_name(node.name)
    placement = get_metadata(node, META_PLACEMENT)
    if placement is not None and not isinstance(placement, dict):
        placement = {"value": placement}
    replaced = get_metadata(node, META_REPLACED_NODES)
    return ShardedOpInfo(
        fields=MappingProxyType(fields),
        placement=MappingProxyType(placement) if placement is not None else None,
        replaced_names=tuple(str(n) for n in replaced) if isinstance(replaced, list) else None,
        contract_error=error,
    )


def read_sharded_ops(nodes: Iterable) -> Mapping[int, ShardedOpInfo]:
    """``{node index: facts}`` for every sharded expert node among a graph's ``onnx.NodeProto`` nodes."""
    return MappingProxyType({index: read_sharded_op(n) for index, n in enumerate(nodes) if is_sharded_node(n)})
