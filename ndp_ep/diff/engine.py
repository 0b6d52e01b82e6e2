"""Diff two ONNX models: load both, pair initializers and nodes, classify, explain MoE rewrites, find regions.

    A.onnx, B.onnx ─load_snapshot─> snapshots ─match_initializers─> initializer pairs + canonical ids
        ─match_nodes (name, WL structure, neighbours)─> node pairs ─compare pairs─> NodeDiff records
        ─find_sharded_nodes─> MoE blocks (replaced nodes, new nodes, shard summaries)
        ─connected changed nodes─> regions (before/after subgraphs for the HTML drawing)

Unchanged nodes and initializers are only counted. Renames (of nodes, intermediate tensors, initializers)
are reported but keep two models equivalent; anything else makes them differ.
"""

from __future__ import annotations

import os
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from ndp_ep.diff.initializers import match_initializers, normalise_name, summarise_unpaired
from ndp_ep.diff.loading import ContentHasher, ModelSnapshot, load_snapshot
from ndp_ep.diff.matching import GraphIndex, NodeMatching, build_index, input_source, match_nodes
from ndp_ep.diff.moe import ShardedNode, find_sharded_nodes, weight_lines
from ndp_ep.diff.result import (
    INITIALIZER_STATUSES,
    NODE_STATUSES,
    DrawEdge,
    DrawNode,
    FieldChange,
    FunctionChange,
    InitializerDiff,
    ModelDiff,
    ModelSummary,
    MoEBlockDiff,
    NodeDiff,
    NodeRef,
    OpsetChange,
    Region,
    RegionSide,
    ValueChange,
)

MAX_DRAWN_NODES_PER_SIDE = 48


def diff_models(path_a: str | os.PathLike[str], path_b: str | os.PathLike[str]) -> ModelDiff:
    """Semantic diff of two ONNX model files. Raises ndp_ep.errors.ModelLoadError on unreadable input."""
    a = load_snapshot(path_a)
    b = load_snapshot(path_b)
    return diff_snapshots(a, b)


def _ref(snapshot: ModelSnapshot, index: int) -> NodeRef:
    node = snapshot.nodes[index]
    return NodeRef(index, node.name, node.op_type, node.domain)


def diff_snapshots(a: ModelSnapshot, b: ModelSnapshot) -> ModelDiff:
    hasher = ContentHasher()
    index_a, index_b = build_index(a), build_index(b)
    init_matching = match_initializers(a, b, hasher)

    sharded_b = find_sharded_nodes(b)
    sharded_a = find_sharded_nodes(a)
    names_a = {n.name: n.index for n in a.nodes if n.name}
    reserved_a = {names_a[name] for s in sharded_b for name in (s.replaced_names or ()) if name in names_a}
    matching = match_nodes(a, b, index_a, index_b, init_matching.ids_a, init_matching.ids_b, reserved_a)
    matched_b = set(matching.a_to_b.values())
    unmatched_a = [n.index for n in a.nodes if n.index not in matching.a_to_b]
    unmatched_b = [n.index for n in b.nodes if n.index not in matched_b]

    blocks_raw = [
        _resolve_block(s, b, a, index_b, set(unmatched_b), set(unmatched_a), "rewrite") for s in sharded_b
    ] + [_resolve_block(s, a, b, index_a, set(unmatched_a), set(unmatched_b), "reverse") for s in sharded_a]

    # Per block: the initializers its original (replaced) nodes consumed, in whichever model holds them.
    block_sources = {}
    for block in blocks_raw:
        original = a if block.direction == "rewrite" else b
        block_sources[block.block] = frozenset(
            t for ref in block.replaced_nodes for t in original.nodes[ref.index].inputs if t in original.initializers
        )
    initializer_diffs = init_matching.diffs + summarise_unpaired(
        a, b, init_matching.removed, init_matching.added, block_sources
    )
    initializer_diffs = tuple(_attach_removed_to_block(d, block_sources) for d in initializer_diffs)
    blocks = tuple(
        _with_initializers(block, [d for d in initializer_diffs if d.block == block.block]) for block in blocks_raw
    )

    block_of_a: dict[int, str] = {}
    block_of_b: dict[int, str] = {}
    for block in blocks:
        old_side, new_side = (block_of_a, block_of_b) if block.direction == "rewrite" else (block_of_b, block_of_a)
        for ref in block.replaced_nodes:
            old_side[ref.index] = block.block
        for ref in block.new_nodes:
            new_side[ref.index] = block.block

    node_diffs: list[NodeDiff] = []
    counts = dict.fromkeys(NODE_STATUSES, 0)
    for ia, ib in sorted(matching.a_to_b.items()):
        changes = _compare_pair(
            a, b, index_a, index_b, ia, ib, matching, matched_b, init_matching.ids_a, init_matching.ids_b
        )
        renamed = a.nodes[ia].name != b.nodes[ib].name
        status = "changed" if changes else "renamed" if renamed else "unchanged"
        counts[status] += 1
        if status != "unchanged":
            node_diffs.append(
                NodeDiff(status, _ref(a, ia), _ref(b, ib), matching.basis[ia], changes, block_of_a.get(ia))
            )
    for ia in unmatched_a:
        counts["removed"] += 1
        node_diffs.append(NodeDiff("removed", _ref(a, ia), None, None, (), block_of_a.get(ia)))
    for ib in unmatched_b:
        counts["added"] += 1
        node_diffs.append(NodeDiff("added", None, _ref(b, ib), None, (), block_of_b.get(ib)))

    init_counts = dict.fromkeys(INITIALIZER_STATUSES, 0)
    init_counts["unchanged"] = init_matching.unchanged_count
    for item in initializer_diffs:
        init_counts[item.status] += 1

    return ModelDiff(
        a=_summary(a),
        b=_summary(b),
        node_counts=MappingProxyType(counts),
        initializer_counts=MappingProxyType(init_counts),
        nodes=tuple(node_diffs),
        initializers=tuple(initializer_diffs),
        opsets=_opset_changes(a, b),
        values=_value_changes(a, b),
        functions=_function_changes(a, b),
        moe_blocks=blocks,
        regions=_regions(a, b, index_a, index_b, node_diffs, blocks),
        hashed_bytes=hasher.bytes_read,
    )


def _summary(snapshot: ModelSnapshot) -> ModelSummary:
    return ModelSummary(
        path=str(snapshot.path),
        ir_version=snapshot.ir_version,
        producer=snapshot.producer,
        opsets=snapshot.opsets,
        node_count=len(snapshot.nodes),
        initializer_count=len(snapshot.initializers),
        initializer_bytes=snapshot.initializer_bytes,
    )


def _compare_pair(
    a: ModelSnapshot,
    b: ModelSnapshot,
    index_a: GraphIndex,
    index_b: GraphIndex,
    ia: int,
    ib: int,
    matching: NodeMatching,
    matched_b: set[int],
    ids_a: Mapping[str, str],
    ids_b: Mapping[str, str],
) -> tuple[FieldChange, ...]:
    node_a, node_b = a.nodes[ia], b.nodes[ib]
    changes: list[FieldChange] = []
    if node_a.op_type != node_b.op_type:
        changes.append(FieldChange("op_type", "op_type", node_a.op_type, node_b.op_type))
    if node_a.domain != node_b.domain:
        changes.append(FieldChange("domain", "domain", node_a.domain, node_b.domain))
    for key in sorted(set(node_a.attributes) | set(node_b.attributes)):
        value_a, value_b = node_a.attributes.get(key), node_b.attributes.get(key)
        if value_a != value_b:
            changes.append(FieldChange("attribute", key, value_a, value_b))
    for slot in range(max(len(node_a.inputs), len(node_b.inputs))):
        tensor_a = node_a.inputs[slot] if slot < len(node_a.inputs) else None
        tensor_b = node_b.inputs[slot] if slot < len(node_b.inputs) else None
        if tensor_a is None or tensor_b is None:
            changes.append(FieldChange("input", f"#{slot}", tensor_a, tensor_b))
            continue
        source_a = input_source(a, index_a, tensor_a, ids_a)
        source_b = input_source(b, index_b, tensor_b, ids_b)
        if source_a[0] == "node":
            partner = matching.a_to_b.get(int(source_a[1]))
            source_a = ("node", str(partner), source_a[2]) if partner is not None else ("unmatched",)
        if source_a[0] == "init" and source_a[1].startswith("?"):
            source_a = ("unpaired-initializer", tensor_a)
        if source_a == ("unmatched",) and source_b[0] == "node" and tensor_a == tensor_b:
            # Both producers were replaced (e.g. by a MoE rewrite) but still feed the same tensor name: the
            # change belongs to the producers, which are reported themselves.
            producer_b = int(source_b[1])
            if producer_b not in matched_b:
                continue
        if source_a != source_b:
            changes.append(FieldChange("input", f"#{slot}", tensor_a or "∅", tensor_b or "∅"))
    if len(node_a.outputs) != len(node_b.outputs):
        changes.append(FieldChange("outputs", "count", str(len(node_a.outputs)), str(len(node_b.outputs))))
    return tuple(changes)


def _resolve_block(
    sharded: ShardedNode,
    own: ModelSnapshot,
    other: ModelSnapshot,
    own_index: GraphIndex,
    own_unmatched: set[int],
    other_unmatched: set[int],
    direction: str,
) -> MoEBlockDiff:
    other_names = {n.name: n.index for n in other.nodes if n.name}
    if sharded.replaced_names is not None:
        replaced = [other_names[n] for n in sharded.replaced_names if n in other_names]
        missing = tuple(n for n in sharded.replaced_names if n not in other_names)
        source = "metadata"
    else:
        prefix = normalise_name(sharded.block) + "."
        replaced = [i for i in sorted(other_unmatched) if normalise_name(other.nodes[i].name).startswith(prefix)]
        missing = ()
        source = "inferred"
    new_nodes = {sharded.node.index}
    frontier = deque([sharded.node.index])
    while frontier:  # unmatched producers feeding the op (none in a conversion: its weights are initializers)
        for tensor in own.nodes[frontier.popleft()].inputs:
            producer = own_index.producer.get(tensor)
            if producer and producer[0] in own_unmatched and producer[0] not in new_nodes:
                new_nodes.add(producer[0])
                frontier.append(producer[0])
    fields = sharded.fields
    return MoEBlockDiff(
        block=sharded.block,
        node=_ref(own, sharded.node.index),
        direction=direction,
        num_experts=fields.get("num_experts"),
        top_k=fields.get("top_k"),
        shards=fields.get("shards"),
        hidden=fields.get("hidden"),
        ffn=fields.get("ffn"),
        activation=fields.get("activation"),
        placement=sharded.placement,
        replaced_nodes=tuple(_ref(other, i) for i in sorted(set(replaced))),
        replaced_source=source,
        missing_replaced_nodes=missing,
        new_nodes=tuple(_ref(own, i) for i in sorted(new_nodes)),
        initializers=(),
        contract_error=sharded.contract_error,
    )


def _attach_removed_to_block(item: InitializerDiff, block_sources: Mapping[str, frozenset[str]]) -> InitializerDiff:
    """A removed (added, for a reversed rewrite) initializer that only the replaced nodes of one MoE block
    consumed belongs to that block."""
    if item.status not in ("removed", "added") or item.block is not None:
        return item
    tensors = item.a or item.b
    owners = [block for block, names in block_sources.items() if all(t.name in names for t in tensors)]
    return replace(item, block=owners[0]) if len(owners) == 1 else item


def _with_initializers(block: MoEBlockDiff, diffs: list[InitializerDiff]) -> MoEBlockDiff:
    return replace(block, initializers=tuple(diffs))


def _opset_changes(a: ModelSnapshot, b: ModelSnapshot) -> tuple[OpsetChange, ...]:
    return tuple(
        OpsetChange(domain, a.opsets.get(domain), b.opsets.get(domain))
        for domain in sorted(set(a.opsets) | set(b.opsets))
        if a.opsets.get(domain) != b.opsets.get(domain)
    )


def _value_changes(a: ModelSnapshot, b: ModelSnapshot) -> tuple[ValueChange, ...]:
    changes: list[ValueChange] = []
    for kind, values_a, values_b in (("input", a.inputs, b.inputs), ("output", a.outputs, b.outputs)):
        by_name_b = {v.name: v for v in values_b}
        names_a = {v.name for v in values_a}
        removed = {pos: v for pos, v in enumerate(values_a) if v.name not in by_name_b}
        added = {pos: v for pos, v in enumerate(values_b) if v.name not in names_a}
        for pos, value in enumerate(values_a):
            other = by_name_b.get(value.name)
            if other is not None and other.describe() != value.describe():
                text_a, text_b = f"{value.name} {value.describe()}", f"{other.name} {other.describe()}"
                changes.append(ValueChange(kind, "changed", pos, text_a, text_b))
        for pos in sorted(set(removed) | set(added)):
            old, new = removed.get(pos), added.get(pos)
            text_a = f"{old.name} {old.describe()}" if old else None
            text_b = f"{new.name} {new.describe()}" if new else None
            status = "renamed" if old and new else "removed" if old else "added"
            changes.append(ValueChange(kind, status, pos, text_a, text_b))
    return tuple(changes)


def _function_changes(a: ModelSnapshot, b: ModelSnapshot) -> tuple[FunctionChange, ...]:
    changes = []
    for name in sorted(set(a.functions) | set(b.functions)):
        if name not in b.functions:
            changes.append(FunctionChange(name, "removed"))
        elif name not in a.functions:
            changes.append(FunctionChange(name, "added"))
        elif a.functions[name] != b.functions[name]:
            changes.append(FunctionChange(name, "changed"))
    return tuple(changes)


class _UnionFind:
    def __init__(self, items: Iterable[tuple[str, int]]) -> None:
        self.parent = {item: item for item in items}

    def find(self, item: tuple[str, int]) -> tuple[str, int]:
        root = item
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[item] != root:
            self.parent[item], item = root, self.parent[item]
        return root

    def union(self, x: tuple[str, int], y: tuple[str, int]) -> None:
        self.parent[self.find(x)] = self.find(y)


def _neighbours(snapshot: ModelSnapshot, index: GraphIndex, node: int) -> list[int]:
    found = [index.producer[t][0] for t in snapshot.nodes[node].inputs if t in index.producer]
    for tensor in snapshot.nodes[node].outputs:
        found.extend(consumer for consumer, _ in index.consumers.get(tensor, ()))
    return found


def _regions(
    a: ModelSnapshot,
    b: ModelSnapshot,
    index_a: GraphIndex,
    index_b: GraphIndex,
    node_diffs: list[NodeDiff],
    blocks: tuple[MoEBlockDiff, ...],
) -> tuple[Region, ...]:
    """Connected groups of changed nodes (changed/removed in A, changed/added in B) with their MoE block."""
    status_a: dict[int, str] = {}
    status_b: dict[int, str] = {}
    pairs: list[tuple[int, int]] = []
    for item in node_diffs:
        if item.status in ("changed", "removed") and item.a is not None:
            status_a[item.a.index] = item.status
        if item.status in ("changed", "added") and item.b is not None:
            status_b[item.b.index] = item.status
        if item.status == "changed" and item.a is not None and item.b is not None:
            pairs.append((item.a.index, item.b.index))
    if not status_a and not status_b:
        return ()
    forest = _UnionFind([("a", i) for i in status_a] + [("b", i) for i in status_b])
    for side, snapshot, index, touched in (("a", a, index_a, status_a), ("b", b, index_b, status_b)):
        for node in touched:
            for other in _neighbours(snapshot, index, node):
                if other in touched:
                    forest.union((side, node), (side, other))
    for ia, ib in pairs:
        forest.union(("a", ia), ("b", ib))
    block_of_root: dict[tuple[str, int], str] = {}
    for block in blocks:
        old_side, new_side = ("a", "b") if block.direction == "rewrite" else ("b", "a")
        members = [(old_side, r.index) for r in block.replaced_nodes] + [(new_side, r.index) for r in block.new_nodes]
        members = [m for m in members if m in forest.parent]
        for member in members[1:]:
            forest.union(members[0], member)
        if members:
            block_of_root[forest.find(members[0])] = block.block
    components: dict[tuple[str, int], list[tuple[str, int]]] = defaultdict(list)
    for item in forest.parent:
        components[forest.find(item)].append(item)
    ordered = sorted(components.items(), key=lambda kv: min((s == "b", i) for s, i in kv[1]))
    regions = []
    for number, (root, members) in enumerate(ordered):
        nodes_a = sorted(i for s, i in members if s == "a")
        nodes_b = sorted(i for s, i in members if s == "b")
        block = block_of_root.get(root)
        first = _ref(a, nodes_a[0]) if nodes_a else _ref(b, nodes_b[0])
        title = f"MoE block {block}" if block else f"around {first.label()}"
        regions.append(
            Region(
                index=number,
                title=title,
                block=block,
                a_nodes=tuple(_ref(a, i) for i in nodes_a),
                b_nodes=tuple(_ref(b, i) for i in nodes_b),
                before=_region_side(a, index_a, nodes_a, status_a, "a"),
                after=_region_side(b, index_b, nodes_b, status_b, "b"),
            )
        )
    return tuple(regions)


def _connected_chunk(snapshot: ModelSnapshot, index: GraphIndex, members: list[int], limit: int) -> list[int]:
    """All members if they fit; else a connected piece grown breadth-first from the earliest member, so a
    truncated drawing shows a readable subgraph rather than a row of unrelated source nodes."""
    if len(members) <= limit:
        return members
    allowed = set(members)
    start = members[0]
    chosen, queue = {start}, deque([start])
    while queue and len(chosen) < limit:
        for other in _neighbours(snapshot, index, queue.popleft()):
            if other in allowed and other not in chosen and len(chosen) < limit:
                chosen.add(other)
                queue.append(other)
    return sorted(chosen)


def _region_side(
    snapshot: ModelSnapshot, index: GraphIndex, members: list[int], status: Mapping[int, str], side: str
) -> RegionSide:
    # Constant nodes feed everything and would fill the first row; they stay in the tables, not the drawing.
    drawable = [m for m in members if snapshot.nodes[m].op_type != "Constant"] or members
    drawn = _connected_chunk(snapshot, index, drawable, MAX_DRAWN_NODES_PER_SIDE)
    omitted = len(members) - len(drawn)
    chosen = set(drawn)
    context: set[int] = set()
    if drawn:
        for node in drawn:
            context.update(
                n
                for n in _neighbours(snapshot, index, node)
                if n not in chosen and snapshot.nodes[n].op_type != "Constant"
            )
        context = set(sorted(context)[: max(4, MAX_DRAWN_NODES_PER_SIDE // 4)])
    everything = sorted(chosen | context)
    nodes = tuple(
        DrawNode(
            node_id=f"{side}{i}",
            label=snapshot.nodes[i].name or f"#{i}",
            op=snapshot.nodes[i].qualified_op,
            status=status.get(i, "context") if i in chosen else "context",
            weights=weight_lines(snapshot, i),
        )
        for i in everything
    )
    present = set(everything)
    edges: set[DrawEdge] = set()
    for node in everything:
        for tensor in snapshot.nodes[node].inputs:
            producer = index.producer.get(tensor)
            if producer and producer[0] in present and producer[0] != node:
                edges.add(DrawEdge(f"{side}{producer[0]}", f"{side}{node}", tensor))
    ordered = sorted(edges, key=lambda e: (e.source, e.target, e.tensor))
    return RegionSide(nodes=nodes, edges=tuple(ordered), omitted_nodes=omitted)
