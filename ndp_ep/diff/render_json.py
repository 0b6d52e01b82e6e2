"""The ``--json`` output: a stable, versioned document (schema ``ndp-ep.diff/1``, described in docs/diff.md).

Field names and their meaning only change together with the schema version. Unchanged nodes and initializers
are counted, not listed. Keys are always present; values that a model does not carry are null.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ndp_ep.diff.renderers import RenderOptions
from ndp_ep.diff.result import (
    InitializerDiff,
    ModelDiff,
    ModelSummary,
    MoEBlockDiff,
    NodeDiff,
    NodeRef,
    Region,
    TensorRef,
)

FORMAT = "json"
DESCRIPTION = "the ndp-ep.diff/1 JSON document (schema in docs/diff.md)"

SCHEMA_ID = "ndp-ep.diff/1"


def _node(ref: NodeRef | None) -> dict[str, Any] | None:
    if ref is None:
        return None
    return {"index": ref.index, "name": ref.name, "op_type": ref.op_type, "domain": ref.domain}


def _tensor(ref: TensorRef) -> dict[str, Any]:
    return {"name": ref.name, "dtype": ref.dtype, "shape": list(ref.shape), "bytes": ref.size_bytes}


def _model(summary: ModelSummary) -> dict[str, Any]:
    return {
        "path": summary.path,
        "ir_version": summary.ir_version,
        "producer": summary.producer,
        "opsets": dict(sorted(summary.opsets.items())),
        "nodes": summary.node_count,
        "initializers": summary.initializer_count,
        "initializer_bytes": summary.initializer_bytes,
    }


def _node_diff(item: NodeDiff) -> dict[str, Any]:
    return {
        "status": item.status,
        "a": _node(item.a),
        "b": _node(item.b),
        "match": item.match,
        "block": item.block,
        "changes": [{"field": c.field, "key": c.key, "a": c.a, "b": c.b} for c in item.changes],
    }


def _initializer_diff(item: InitializerDiff) -> dict[str, Any]:
    return {
        "status": item.status,
        "summary": item.summary,
        "block": item.block,
        "basis": item.basis,
        "a": [_tensor(t) for t in item.a],
        "b": [_tensor(t) for t in item.b],
        "a_bytes": item.a_bytes,
        "b_bytes": item.b_bytes,
    }


def _block(block: MoEBlockDiff) -> dict[str, Any]:
    return {
        "block": block.block,
        "node": _node(block.node),
        "direction": block.direction,
        "num_experts": block.num_experts,
        "top_k": block.top_k,
        "shards": block.shards,
        "hidden": block.hidden,
        "ffn": block.ffn,
        "activation": block.activation,
        "placement": dict(block.placement) if block.placement is not None else None,
        "replaced_source": block.replaced_source,
        "replaced_nodes": [_node(r) for r in block.replaced_nodes],
        "missing_replaced_nodes": list(block.missing_replaced_nodes),
        "contract_error": block.contract_error,
        "new_nodes": [_node(r) for r in block.new_nodes],
        "initializers": [_initializer_diff(i) for i in block.initializers],
    }


def _region(region: Region) -> dict[str, Any]:
    return {
        "index": region.index,
        "title": region.title,
        "block": region.block,
        "a_nodes": [r.name or f"#{r.index}" for r in region.a_nodes],
        "b_nodes": [r.name or f"#{r.index}" for r in region.b_nodes],
    }


def to_json_document(diff: ModelDiff) -> dict[str, Any]:
    """The JSON document as plain Python data (what ``--json`` prints)."""
    return {
        "schema": SCHEMA_ID,
        "equivalent": diff.equivalent,
        "models": {"a": _model(diff.a), "b": _model(diff.b)},
        "summary": {
            "nodes": dict(diff.node_counts),
            "initializers": dict(diff.initializer_counts),
            "initializer_bytes": {
                "a": diff.a.initializer_bytes,
                "b": diff.b.initializer_bytes,
                "delta": diff.b.initializer_bytes - diff.a.initializer_bytes,
            },
            "moe_blocks": len(diff.moe_blocks),
            "regions": len(diff.regions),
            "hashed_bytes": diff.hashed_bytes,
        },
        "opsets": [{"domain": o.domain, "a": o.a, "b": o.b, "status": o.status} for o in diff.opsets],
        "io": [{"kind": v.kind, "status": v.status, "position": v.position, "a": v.a, "b": v.b} for v in diff.values],
        "functions": [{"name": f.name, "status": f.status} for f in diff.functions],
        "moe_blocks": [_block(b) for b in diff.moe_blocks],
        "nodes": [_node_diff(n) for n in diff.nodes],
        "initializers": [_initializer_diff(i) for i in diff.initializers],
        "regions": [_region(r) for r in diff.regions],
    }


_C1 = re.compile(r"[\x7f-\x9f]")  # json.dumps escapes C0 controls but leaves DEL and C1 raw under ensure_ascii=False


def render_json(diff: ModelDiff) -> str:
    """The diff as JSON; names stay readable UTF-8 but no control character is raw (``\\u009b``, ...)."""
    text = json.dumps(to_json_document(diff), indent=2, ensure_ascii=False)
    return _C1.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + "\n"


def render(diff: ModelDiff, options: RenderOptions) -> str:
    return render_json(diff)
