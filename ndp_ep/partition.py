"""Partitioning: which nodes the NDP side claims and which stay on the GPU.

As in ONNX Runtime's ``partitioning_utils`` and torch.fx's ``CapabilityBasedPartitioner``, a support
predicate marks the nodes the provider can run, and supported nodes are grouped greedily in topological
order, merging a node into a neighbour's group only when the merge cannot create a cycle between groups
(no path leaves the group and re-enters it). Every other node is costed on the GPU.

The claimed node, ``ndp_ep::ShardedMoEExperts``, is not pinned to the NDP units: for each invocation the
scheduler places every activated expert on the GPU or spreads its shards over the NDP units.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx
import onnx

from graph_passes.rewrite import NDP_DOMAIN, SHARDED_OP
from hw_model.hardware import SystemSpec

GPU = "gpu"
NDP = "ndp"


@dataclass(frozen=True)
class Partition:
    device: str
    nodes: tuple[str, ...]


def is_ndp_supported(node: onnx.NodeProto) -> bool:
    return node.domain == NDP_DOMAIN and node.op_type == SHARDED_OP


def _dependency_graph(graph: onnx.GraphProto) -> nx.DiGraph:
    producer = {o: n.name for n in graph.node for o in n.output if o}
    dag = nx.DiGraph()
    dag.add_nodes_from(n.name for n in graph.node)
    for node in graph.node:
        for inp in node.input:
            if inp in producer:
                dag.add_edge(producer[inp], node.name)
    return dag


def partition_graph(graph: onnx.GraphProto, supported: Callable[[onnx.NodeProto], bool] = is_ndp_supported):
    """Groups of supported nodes (device ``ndp``) and the rest (device ``gpu``), cycle-free."""
    dag = _dependency_graph(graph)
    group_of: dict[str, int] = {}
    groups: list[set[str]] = []
    for node in graph.node:
        if not supported(node):
            continue
        merged = False
        for pred in dag.predecessors(node.name):
            if pred not in group_of:
                continue
            group = groups[group_of[pred]]
            if not _creates_cycle(dag, group, node.name):
                group.add(node.name)
                group_of[node.name] = group_of[pred]
                merged = True
                break
        if not merged:
            group_of[node.name] = len(groups)
            groups.append({node.name})
    order = [n.name for n in graph.node]
    partitions = [Partition(NDP, tuple(n for n in order if n in g)) for g in groups]
    rest = tuple(n for n in order if n not in group_of)
    if rest:
        partitions.append(Partition(GPU, rest))
    return partitions


def _creates_cycle(dag: nx.DiGraph, group: set[str], candidate: str) -> bool:
    """True if some path from the group reaches ``candidate`` through a node outside the group."""
    frontier = [s for g in group for s in dag.successors(g) if s not in group and s != candidate]
    seen: set[str] = set()
    while frontier:
        current = frontier.pop()
        if current == candidate:
            return True
        if current in seen:
            continue
        seen.add(current)
        frontier.extend(dag.successors(current))
    return False


def annotate_placement(model: onnx.ModelProto, system: SystemSpec, policy: str) -> None:
    """Record on every claimed node where its shards live and who decides its placement."""
    for node in model.graph.node:
        if not is_ndp_supported(node):
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        shards = int(attrs.get("shards", 1))
        units = max(system.num_ndp_units, 1)
        placement = {
            "device": "ndp+gpu",
            "hardware": system.name,
            "ndp_units": system.num_ndp_units,
            "shard_to_ndp_unit": [s % units for s in range(shards)],
            "scheduler": policy,
            "note": "the scheduler places each activated expert on the GPU or on the NDP units per invocation",
        }
        props = {p.key: p for p in node.metadata_props}
        if "ndp_ep.placement" in props:
            props["ndp_ep.placement"].value = json.dumps(placement)
        else:
            entry = node.metadata_props.add()
            entry.key, entry.value = "ndp_ep.placement", json.dumps(placement)
