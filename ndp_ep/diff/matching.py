"""Pair the nodes of model A with the nodes of model B: by name first, by structure where names changed.

Phases (each only touches nodes the previous ones left unmatched)::

    1. name        unique, non-empty node names present in both graphs with the same operator (a name
                   pair whose operator differs is kept for last, in case generated names shifted)
    2. structure   Weisfeiler-Lehman subgraph hashes (networkx) over the dataflow graph, whose initial node
                   labels are (op, domain, attributes, where each input comes from); a hash unique on both
                   sides pairs two nodes, deepest iteration first
    3. neighbours  anchor propagation: an unmatched consumer/producer of a matched pair, reached through
                   the same output index and input slot, pairs with the single candidate carrying the
                   same label on the other side; a second sweep accepts the same op type alone, which is
                   how a node whose attributes changed gets paired

Repeated identical layers share WL hashes; phase 3 separates them by walking from matched anchors, so the
whole matching stays linear in the number of edges.
"""

from __future__ import annotations

import warnings
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import networkx as nx

from ndp_ep.diff.loading import ModelSnapshot

WL_ITERATIONS = 3


@dataclass(frozen=True)
class GraphIndex:
    """Who produces and who consumes each tensor of one graph."""

    producer: Mapping[str, tuple[int, int]]
    consumers: Mapping[str, tuple[tuple[int, int], ...]]
    graph_inputs: Mapping[str, int]
    graph_outputs: Mapping[str, int]


def build_index(snapshot: ModelSnapshot) -> GraphIndex:
    producer: dict[str, tuple[int, int]] = {}
    consumers: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for node in snapshot.nodes:
        for slot, tensor in enumerate(node.outputs):
            if tensor:
                producer[tensor] = (node.index, slot)
        for slot, tensor in enumerate(node.inputs):
            if tensor:
                consumers[tensor].append((node.index, slot))
    return GraphIndex(
        producer=MappingProxyType(producer),
        consumers=MappingProxyType({k: tuple(v) for k, v in consumers.items()}),
        graph_inputs=MappingProxyType({v.name: i for i, v in enumerate(snapshot.inputs)}),
        graph_outputs=MappingProxyType({v.name: i for i, v in enumerate(snapshot.outputs)}),
    )


@dataclass(frozen=True)
class NodeMatching:
    """The node pairs (A index → B index) and how each pair was found."""

    a_to_b: Mapping[int, int]
    basis: Mapping[int, str]

    def __post_init__(self) -> None:
        if len(set(self.a_to_b.values())) != len(self.a_to_b):
            raise ValueError("a node of B is matched twice")


def input_source(
    snapshot: ModelSnapshot, index: GraphIndex, tensor: str, initializer_ids: Mapping[str, str]
) -> tuple[str, ...]:
    """Where a tensor comes from, in terms that do not depend on tensor names inside the graph."""
    if not tensor:
        return ("empty",)
    if tensor in index.producer:
        node_index, slot = index.producer[tensor]
        return ("node", str(node_index), str(slot))
    if tensor in snapshot.initializers:
        return ("init", initializer_ids.get(tensor, "?" + snapshot.initializers[tensor].describe()))
    if tensor in index.graph_inputs:
        return ("input", tensor)
    return ("outer", tensor)


def _local_labels(snapshot: ModelSnapshot, index: GraphIndex, initializer_ids: Mapping[str, str]) -> dict[int, str]:
    labels = {}
    for node in snapshot.nodes:
        parts = [node.domain, node.op_type, repr(sorted(node.attributes.items()))]
        for tensor in node.inputs:
            source = input_source(snapshot, index, tensor, initializer_ids)
            # Producers are encoded by the WL edges; here only the output index and leaf sources count.
            parts.append(f"n{source[2]}" if source[0] == "node" else ":".join(source))
        parts.append(f"out{len(node.outputs)}")
        parts.extend(f"gout{index.graph_outputs[t]}" for t in node.outputs if t in index.graph_outputs)
        labels[node.index] = "|".join(parts)
    return labels


def _dataflow_graph(snapshot: ModelSnapshot, index: GraphIndex, labels: Mapping[int, str]) -> nx.DiGraph:
    graph = nx.DiGraph()
    for node in snapshot.nodes:
        graph.add_node(node.index, label=labels[node.index])
    slots: dict[tuple[int, int], list[str]] = defaultdict(list)
    for node in snapshot.nodes:
        for slot, tensor in enumerate(node.inputs):
            if tensor in index.producer:
                producer, out_slot = index.producer[tensor]
                slots[(producer, node.index)].append(f"{out_slot}>{slot}")
    for (producer, consumer), names in slots.items():
        graph.add_edge(producer, consumer, slot=",".join(names))
    return graph


def _wl_hashes(graph: nx.DiGraph) -> dict[int, list[str]]:
    """Per node: [initial label hash, hash after iteration 1, ..., after WL_ITERATIONS]."""
    with warnings.catch_warnings():  # networkx notes that directed hashes changed in 3.5; both sides use one version
        warnings.simplefilter("ignore", UserWarning)
        return nx.weisfeiler_lehman_subgraph_hashes(
            graph,
            edge_attr="slot",
            node_attr="label",
            iterations=WL_ITERATIONS,
            digest_size=12,
            include_initial_labels=True,
        )


def match_nodes(
    a: ModelSnapshot,
    b: ModelSnapshot,
    index_a: GraphIndex,
    index_b: GraphIndex,
    initializer_ids_a: Mapping[str, str],
    initializer_ids_b: Mapping[str, str],
    reserved_a: Iterable[int] = (),
) -> NodeMatching:
    """Pair nodes of A and B. ``reserved_a`` nodes (known to be replaced) are only ever paired by name."""
    a_to_b: dict[int, int] = {}
    basis: dict[int, str] = {}

    def unique_names(snapshot: ModelSnapshot) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for node in snapshot.nodes:
            counts[node.name] += 1
        return {n.name: n.index for n in snapshot.nodes if n.name and counts[n.name] == 1}

    names_a, names_b = unique_names(a), unique_names(b)
    # Same name but another operator: generated names ("node_12") may have shifted, so let structure decide
    # first and pair these by name only if both are still unmatched at the end.
    deferred: dict[int, int] = {}
    for name, ia in names_a.items():
        if name in names_b:
            ib = names_b[name]
            if (a.nodes[ia].op_type, a.nodes[ia].domain) == (b.nodes[ib].op_type, b.nodes[ib].domain):
                a_to_b[ia] = ib
                basis[ia] = "name"
            else:
                deferred[ia] = ib
    if len(a_to_b) == len(a.nodes) == len(b.nodes):
        return NodeMatching(MappingProxyType(a_to_b), MappingProxyType(basis))

    reserved = frozenset(reserved_a)
    labels_a = _local_labels(a, index_a, initializer_ids_a)
    labels_b = _local_labels(b, index_b, initializer_ids_b)
    hashes_a = _wl_hashes(_dataflow_graph(a, index_a, labels_a))
    hashes_b = _wl_hashes(_dataflow_graph(b, index_b, labels_b))
    matched_b = set(a_to_b.values())

    def record(ia: int, ib: int, how: str) -> None:
        a_to_b[ia] = ib
        basis[ia] = how
        matched_b.add(ib)

    # Phase 2: unique WL hashes, deepest first (they see the widest neighbourhood).
    for level in range(WL_ITERATIONS, -1, -1):
        groups_a: dict[str, list[int]] = defaultdict(list)
        groups_b: dict[str, list[int]] = defaultdict(list)
        for node in a.nodes:
            if node.index not in a_to_b and node.index not in reserved:
                groups_a[hashes_a[node.index][level]].append(node.index)
        for node in b.nodes:
            if node.index not in matched_b:
                groups_b[hashes_b[node.index][level]].append(node.index)
        for key, members_a in groups_a.items():
            members_b = groups_b.get(key, [])
            if len(members_a) == 1 and len(members_b) == 1:
                record(members_a[0], members_b[0], "structure")

    # Phase 3: propagate from anchors, exact labels first, then op type alone.
    exact = (labels_a.__getitem__, labels_b.__getitem__)
    ops_a = {n.index: f"{n.domain}::{n.op_type}" for n in a.nodes}
    ops_b = {n.index: f"{n.domain}::{n.op_type}" for n in b.nodes}
    coarse = (ops_a.__getitem__, ops_b.__getitem__)
    for keys in ((exact,), (exact, coarse)):
        _propagate(a, b, index_a, index_b, a_to_b, matched_b, reserved, keys, record)
    for ia, ib in deferred.items():
        if ia not in a_to_b and ib not in matched_b:
            record(ia, ib, "name")
    return NodeMatching(MappingProxyType(a_to_b), MappingProxyType(basis))


KeyPair = tuple[Callable[[int], str], Callable[[int], str]]


def _propagate(
    a: ModelSnapshot,
    b: ModelSnapshot,
    index_a: GraphIndex,
    index_b: GraphIndex,
    a_to_b: dict[int, int],
    matched_b: set[int],
    reserved: frozenset[int],
    key_pairs: tuple[KeyPair, ...],
    record: Callable[[int, int, str], None],
) -> None:
    queue = deque(a_to_b.items())
    while queue:
        ia, ib = queue.popleft()
        node_a, node_b = a.nodes[ia], b.nodes[ib]
        # Candidate neighbour groups: (direction, output index, input slot) → unmatched nodes on each side.
        groups_a: dict[tuple[str, int, int], list[int]] = defaultdict(list)
        groups_b: dict[tuple[str, int, int], list[int]] = defaultdict(list)
        for out_slot, tensor in enumerate(node_a.outputs):
            for consumer, slot in index_a.consumers.get(tensor, ()):
                if consumer not in a_to_b and consumer not in reserved:
                    groups_a[("down", out_slot, slot)].append(consumer)
        for out_slot, tensor in enumerate(node_b.outputs):
            for consumer, slot in index_b.consumers.get(tensor, ()):
                if consumer not in matched_b:
                    groups_b[("down", out_slot, slot)].append(consumer)
        for slot, tensor in enumerate(node_a.inputs):
            if tensor in index_a.producer:
                producer, out_slot = index_a.producer[tensor]
                if producer not in a_to_b and producer not in reserved:
                    groups_a[("up", out_slot, slot)].append(producer)
        for slot, tensor in enumerate(node_b.inputs):
            if tensor in index_b.producer:
                producer, out_slot = index_b.producer[tensor]
                if producer not in matched_b:
                    groups_b[("up", out_slot, slot)].append(producer)
        for where, members_a in groups_a.items():
            members_b = groups_b.get(where)
            if not members_b:
                continue
            for key_a, key_b in key_pairs:
                by_key_a: dict[str, list[int]] = defaultdict(list)
                by_key_b: dict[str, list[int]] = defaultdict(list)
                for m in dict.fromkeys(members_a):
                    if m not in a_to_b:
                        by_key_a[key_a(m)].append(m)
                for m in dict.fromkeys(members_b):
                    if m not in matched_b:
                        by_key_b[key_b(m)].append(m)
                for key, candidates_a in by_key_a.items():
                    candidates_b = by_key_b.get(key, [])
                    if len(candidates_a) == 1 and len(candidates_b) == 1:
                        record(candidates_a[0], candidates_b[0], "neighbours")
                        queue.append((candidates_a[0], candidates_b[0]))
