"""The isolated region of an MoE block: the small ONNX model computing the block from its own inputs, and random
feeds for it (:mod:`graph_passes.verify` runs it and judges the block's readings against what it computes).

The region is the nodes the rewrite replaces, plus the router nodes a fused op's plan inserts, plus any upstream
nodes computable from the region's inputs (shape arithmetic, constants); a region that reads some other computed
value is not self-contained (:func:`isolated_region` returns None).
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from graph_passes.graph_index import GraphIndex, live_nodes
from graph_passes.plan import MoEBlockPlan

PROBE_SEQ_LEN = 16


def _with_router_nodes(nodes: list[onnx.NodeProto], plan: MoEBlockPlan) -> list[onnx.NodeProto]:
    """``nodes`` plus ``plan``'s router nodes right after the node producing the last value they read."""
    return _insert_router(nodes, list(plan.router_nodes))


def _insert_router(nodes: list[onnx.NodeProto], router: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    if not router:
        return nodes
    produced = {o: position for position, node in enumerate(nodes) for o in node.output}
    reads = [i for n in router for i in n.input if i in produced]
    position = max((produced[i] for i in reads), default=-1) + 1
    return [*nodes[:position], *router, *nodes[position:]]


def _empty_like(model: onnx.ModelProto, graph_name: str) -> onnx.ModelProto:
    """A model with ``model``'s header (IR version, opsets, functions) and an empty graph."""
    probe = onnx.ModelProto()
    for field_name in ("ir_version", "producer_name", "domain", "model_version"):
        setattr(probe, field_name, getattr(model, field_name))
    probe.opset_import.extend(model.opset_import)
    probe.functions.extend(model.functions)
    probe.graph.name = graph_name
    return probe


def isolated_region(
    model: onnx.ModelProto, index: GraphIndex, plan: MoEBlockPlan, tokens: int = PROBE_SEQ_LEN
) -> onnx.ModelProto | None:
    """A model computing ``plan``'s block from its own inputs (``tokens`` where the token count is not fixed),
    or None when the region is not self-contained."""
    replaced = set(plan.replaced_nodes)
    nodes = [n for n in model.graph.node if n.name in replaced]
    if len(nodes) != len(replaced):
        return None
    nodes = _with_router_nodes(nodes, plan)
    inputs = {plan.hidden_value, plan.expert_ids_value, plan.routing_weights_value}
    router_reads = {i for n in plan.router_nodes for i in n.input if i}
    router_made = {o for n in plan.router_nodes for o in n.output}
    inputs = (inputs - router_made) | (router_reads - router_made - set(index.initializers))
    nodes = _pull_upstream(nodes, index, inputs)
    if nodes is None:
        return None
    made = {o for n in nodes for o in n.output if o}
    if plan.output_value not in made:
        return None
    reads, _ = _reads(nodes)
    probe = _empty_like(model, f"{plan.name}/isolated")
    for value in sorted(inputs & reads):
        shape = _concrete_shape(index, value, plan, tokens)
        elem_type = _elem_type(index, value, plan)
        if shape is None or elem_type is None:
            return None
        probe.graph.input.append(onnx.helper.make_tensor_value_info(value, elem_type, shape))
    probe.graph.node.extend(nodes)
    probe.graph.initializer.extend(index.initializers[n] for n in sorted(reads) if n in index.initializers)
    for value in (plan.output_value, plan.expert_ids_value, plan.routing_weights_value, plan.hidden_value):
        if value in made:
            probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(value))
    return probe


def _reads(nodes: list[onnx.NodeProto]) -> tuple[set[str], set[str]]:
    _, reads = live_nodes(nodes, {o for n in nodes for o in n.output if o})
    made = {o for n in nodes for o in n.output if o}
    return reads, made


def _pull_upstream(nodes: list[onnx.NodeProto], index: GraphIndex, inputs: set[str]) -> list[onnx.NodeProto] | None:
    """Add the upstream nodes the region needs that read only ``inputs``, initializers and one another."""
    chosen = {n.name for n in nodes}
    while True:
        reads, made = _reads(nodes)
        missing = reads - made - inputs - set(index.initializers)
        if not missing:
            order = {n.name: position for position, n in enumerate(index.graph.node)}
            router = [n for n in nodes if n.name not in order]
            ordered = sorted((n for n in nodes if n.name in order), key=lambda n: order[n.name])
            return _insert_router(ordered, router)
        added = False
        for value in sorted(missing):
            producer = index.producer.get(value)
            if producer is None or producer.name in chosen:
                return None  # a graph input or a value the region cannot compute from its own inputs
            upstream = index.upstream(value, stop=inputs)
            needed = [index.node_by_name[n] for n in upstream if n not in chosen]
            sources = {i for n in needed for i in n.input if i} - {o for n in needed for o in n.output}
            if sources - inputs - set(index.initializers) - {o for n in nodes for o in n.output}:
                return None
            if any(n.op_type in ("If", "Loop", "Scan") for n in needed) or len(needed) > 64:
                return None
            nodes = [*needed, *nodes]
            chosen.update(n.name for n in needed)
            added = True
        if not added:
            return None


def _elem_type(index: GraphIndex, value: str, plan: MoEBlockPlan) -> int | None:
    known = index.elem_type(value)
    if known:
        return known
    if value == plan.expert_ids_value:
        return onnx.TensorProto.INT64
    w = plan.weights.up
    source = w.scales or w.initializer or (w.per_expert[0] if w.per_expert else "")
    tensor = index.initializers.get(source)
    return tensor.data_type if tensor is not None else None


def _concrete_shape(index: GraphIndex, value: str, plan: MoEBlockPlan, tokens: int) -> list[int] | None:
    """``value``'s shape with unknown leading dims set so that there are ``tokens`` tokens."""
    shape = index.shape(value)
    last = {plan.hidden_value: plan.hidden, plan.expert_ids_value: plan.top_k, plan.routing_weights_value: plan.top_k}
    if shape is None:
        if value in last:
            return [tokens, last[value]]
        if plan.router_nodes:  # a fused op's router logits
            return [tokens, plan.num_experts]
        return None
    dims: list[int] = []
    token_dim_given = False
    for position, d in enumerate(shape):
        if isinstance(d, int) and d > 0:
            dims.append(d)
        elif position == len(shape) - 1:
            if value not in last:
                return None
            dims.append(last[value])
        elif not token_dim_given:
            dims.append(tokens)
            token_dim_given = True
        else:
            dims.append(1)
    return dims


def _random_region_feeds(
    probe: onnx.ModelProto, plan: MoEBlockPlan, seed: int, num_experts: int | None = None
) -> dict[str, np.ndarray]:
    """Random inputs for an isolated region: normal hidden states and logits, distinct ids (among the first
    ``num_experts``, default all), positive weights."""
    rng = np.random.default_rng(seed)
    num_experts = plan.num_experts if num_experts is None else num_experts
    feeds: dict[str, np.ndarray] = {}
    for value in probe.graph.input:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        if value.name == plan.expert_ids_value:
            tokens = math.prod(dims[:-1])
            if num_experts < plan.num_experts:  # a sample: token t takes the next top-k of them, so all are hit
                cycle = np.arange(tokens * plan.top_k).reshape(tokens, plan.top_k) % num_experts
                ids = rng.permuted(cycle, axis=1)
            else:
                ids = np.stack([rng.permutation(num_experts)[: plan.top_k] for _ in range(tokens)])
            feeds[value.name] = ids.reshape(dims).astype(dtype)
        elif value.name == plan.routing_weights_value:
            weights = rng.uniform(0.1, 1.0, dims)
            feeds[value.name] = (weights / weights.sum(axis=-1, keepdims=True)).astype(dtype)
        elif np.issubdtype(dtype, np.floating) or dtype == np.dtype("bfloat16"):
            scale = 2.0 if value.name != plan.hidden_value else 1.0
            feeds[value.name] = (rng.standard_normal(dims) * scale).astype(dtype)
        else:
            raise ValueError(f"no random values for integer input {value.name}")
    return feeds
