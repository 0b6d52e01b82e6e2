"""Emit sharded expert ops from verified :class:`MoEBlockPlan` s (saving them: :mod:`graph_passes.model_io`).

For a block with E experts, FFN width I and S shards the rewrite replaces the block's expert nodes by

    hidden[..,H] ─┐
    expert_ids ───┼─► ndp_ep::ShardedMoEExperts ─► (the block's output value, same name)
    routing_w ────┤
    {block}.experts.{e}.shard{s}.gate_up  [H, 2I/S]   gate columns s*I/S..(s+1)*I/S, then up columns
    {block}.experts.{e}.shard{s}.down     [I/S, H]    rows of the down projection
    ({block}.experts.{e}.shard{s}.gate_up_bias [2I/S], {block}.experts.{e}.down_bias [H] with biases)

(``.up`` instead of ``.gate_up`` for non-GLU experts). Each shard's partial output
``act(x @ gate_up_s) @ down_s`` is summed over shards, which equals the unsharded expert exactly in real
arithmetic. New weights are :class:`LazyTensor` s: their bytes are produced one expert at a time when the
model is materialised in memory or streamed to an external-data file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from graph_passes.errors import GraphPassError
from graph_passes.expert_math import ExpertArrays, copy_blocked, load_expert
from graph_passes.graph_index import copy_with_stubbed_initializers, live_nodes
from graph_passes.plan import MoEBlockPlan
from graph_passes.weights import WeightStore

NDP_DOMAIN = "ndp_ep"
NDP_OPSET = 1
SHARDED_OP = "ShardedMoEExperts"


@dataclass
class LazyTensor:
    """A float32 initializer whose values are computed on demand."""

    name: str
    dims: tuple[int, ...]
    produce: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.dims, dtype=np.int64)) * 4


@dataclass
class RewrittenModel:
    """A rewritten graph whose new initializers are lazy; ``store`` reads the original weights."""

    model: onnx.ModelProto
    lazy: dict[str, LazyTensor] = field(default_factory=dict)
    store: WeightStore | None = None


class _ExpertCache:
    """Loads each expert's canonical weights once while its shards are produced in order."""

    def __init__(self, plan: MoEBlockPlan, store: WeightStore) -> None:
        self.plan, self.store = plan, store
        self.expert = -1
        self.arrays: ExpertArrays | None = None

    def get(self, expert: int) -> ExpertArrays:
        if expert != self.expert:
            self.arrays = None  # release the previous expert's pages before mapping the next
            self.arrays = load_expert(self.plan, self.store.expert, expert, views=True)
            self.expert = expert
        return self.arrays


def shard_names(plan: MoEBlockPlan, shards: int) -> dict[str, list[str]]:
    first = "gate_up" if plan.gated else "up"
    names: dict[str, list[str]] = {"first": [], "down": [], "first_bias": [], "down_bias": []}
    for e in range(plan.num_experts):
        for s in range(shards):
            names["first"].append(f"{plan.name}.experts.{e}.shard{s}.{first}")
            names["down"].append(f"{plan.name}.experts.{e}.shard{s}.down")
            names["first_bias"].append(f"{plan.name}.experts.{e}.shard{s}.{first}_bias")
        names["down_bias"].append(f"{plan.name}.experts.{e}.down_bias")
    return names


def _shard_producers(plan: MoEBlockPlan, store: WeightStore, shards: int) -> list[LazyTensor]:
    width = plan.ffn // shards
    cache = _ExpertCache(plan, store)
    names = shard_names(plan, shards)
    has_first_bias = plan.weights.up_bias is not None or plan.weights.gate_bias is not None
    tensors: list[LazyTensor] = []
    first_width = 2 * width if plan.gated else width

    # each shard is copied once, straight from the source layout (a transpose when it is [out, in])
    def first(e: int, s: int) -> np.ndarray:
        w = cache.get(e)
        cols = slice(s * width, (s + 1) * width)
        if not plan.gated:
            return copy_blocked(w.up[:, cols])
        out = np.empty((plan.hidden, 2 * width), dtype=np.float32)
        copy_blocked(w.gate[:, cols], out[:, :width])
        copy_blocked(w.up[:, cols], out[:, width:])
        return out

    def down(e: int, s: int) -> np.ndarray:
        return copy_blocked(cache.get(e).down[s * width : (s + 1) * width, :])

    def first_bias(e: int, s: int) -> np.ndarray:
        w = cache.get(e)
        cols = slice(s * width, (s + 1) * width)
        up = w.up_bias[cols] if w.up_bias is not None else np.zeros(width, np.float32)
        if not plan.gated:
            return up
        gate = w.gate_bias[cols] if w.gate_bias is not None else np.zeros(width, np.float32)
        return np.concatenate([gate, up])

    position = 0
    for e in range(plan.num_experts):
        for s in range(shards):
            tensors.append(
                LazyTensor(names["first"][position], (plan.hidden, first_width), lambda e=e, s=s: first(e, s))
            )
            position += 1
    position = 0
    for e in range(plan.num_experts):
        for s in range(shards):
            tensors.append(LazyTensor(names["down"][position], (width, plan.hidden), lambda e=e, s=s: down(e, s)))
            position += 1
    if has_first_bias:
        position = 0
        for e in range(plan.num_experts):
            for s in range(shards):
                name = names["first_bias"][position]
                tensors.append(LazyTensor(name, (first_width,), lambda e=e, s=s: first_bias(e, s)))
                position += 1
    if plan.weights.down_bias is not None:
        for e in range(plan.num_experts):
            tensors.append(LazyTensor(names["down_bias"][e], (plan.hidden,), lambda e=e: cache.get(e).down_bias))
    return tensors


def sharded_node(plan: MoEBlockPlan, shards: int, weight_inputs: list[str]) -> onnx.NodeProto:
    node = helper.make_node(
        SHARDED_OP,
        [plan.hidden_value, plan.expert_ids_value, plan.routing_weights_value, *weight_inputs],
        [plan.output_value],
        name=f"{plan.name}/ShardedMoEExperts",
        domain=NDP_DOMAIN,
        layer=plan.name,
        num_experts=plan.num_experts,
        top_k=plan.top_k,
        hidden=plan.hidden,
        ffn=plan.ffn,
        shards=shards,
        activation=plan.activation,
        activation_alpha=float(plan.activation_alpha),
        activation_limit=float(plan.activation_limit),
        has_first_bias=int(plan.weights.up_bias is not None or plan.weights.gate_bias is not None),
        has_down_bias=int(plan.weights.down_bias is not None),
    )
    block = plan.summary(shards)
    for key, value in (
        ("ndp_ep.replaced_nodes", json.dumps(list(plan.replaced_nodes))),
        ("ndp_ep.block", json.dumps(block)),
    ):
        entry = node.metadata_props.add()
        entry.key, entry.value = key, value
    return node


def _remove_dead_nodes(graph: onnx.GraphProto) -> list[str]:
    """Drop nodes none of whose outputs reach a graph output, and unused initializers; returns the nodes' names."""
    keep, live_values = live_nodes(list(graph.node), {o.name for o in graph.output})
    kept = {node.name for node in keep}
    removed = [node.name for node in graph.node if node.name not in kept]
    del graph.node[:]
    graph.node.extend(keep)
    unused = [t for t in graph.initializer if t.name not in live_values]
    for tensor in unused:
        graph.initializer.remove(tensor)
    return removed


def apply_plans(
    model: onnx.ModelProto, plans: Iterable[MoEBlockPlan], shards: int | dict[str, int], store: WeightStore
) -> RewrittenModel:
    """Rewrite ``model`` (a copy is made) so every plan's block runs as one sharded expert op.

    ``shards`` is one count for every block or a count per block name.
    """
    plans = list(plans)
    shards_of = shards if isinstance(shards, dict) else {p.name: shards for p in plans}
    out, stubbed = _copy_without_expert_bytes(model, plans)
    graph = out.graph
    lazy: dict[str, LazyTensor] = {}
    replaced_by_plan: dict[str, set[str]] = {}
    for plan in plans:
        if plan.ffn % shards_of[plan.name]:
            raise GraphPassError(f"{plan.name}: FFN width {plan.ffn} is not divisible by {shards_of[plan.name]} shards")
        replaced_by_plan[plan.name] = set(plan.replaced_nodes)
    all_replaced = set().union(*replaced_by_plan.values()) if plans else set()
    position_of_output = {}
    for position, node in enumerate(graph.node):
        for o in node.output:
            position_of_output[o] = position
    new_nodes: dict[int, list[onnx.NodeProto]] = {}
    for plan in plans:
        tensors = _shard_producers(plan, store, shards_of[plan.name])
        for tensor in tensors:
            lazy[tensor.name] = tensor
            header = graph.initializer.add()
            header.name, header.data_type = tensor.name, TensorProto.FLOAT
            header.dims.extend(tensor.dims)
        node = sharded_node(plan, shards_of[plan.name], [t.name for t in tensors])
        new_nodes.setdefault(position_of_output[plan.output_value], []).extend([*plan.router_nodes, node])
    rebuilt: list[onnx.NodeProto] = []
    for position, node in enumerate(graph.node):
        if node.name not in all_replaced:
            rebuilt.append(node)
        rebuilt.extend(new_nodes.get(position, []))
    del graph.node[:]
    graph.node.extend(rebuilt)
    if plans and not any(o.domain == NDP_DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(NDP_DOMAIN, NDP_OPSET))
    dead = set(_remove_dead_nodes(graph)) - all_replaced
    side_nodes = _side_nodes_by_block(model.graph, replaced_by_plan, dead)
    for node in graph.node:
        if node.domain == NDP_DOMAIN and node.op_type == SHARDED_OP and node.name.endswith("/" + SHARDED_OP):
            block = node.name[: -len("/" + SHARDED_OP)]
            if block not in side_nodes:
                continue
            props = {p.key: p for p in node.metadata_props}
            replaced = json.loads(props["ndp_ep.replaced_nodes"].value)
            props["ndp_ep.replaced_nodes"].value = json.dumps(replaced + side_nodes[block])
    originals = {t.name: t for t in model.graph.initializer if t.name in stubbed}
    for tensor in graph.initializer:  # an expert weight still read elsewhere keeps its bytes
        if tensor.name in stubbed:
            tensor.CopyFrom(originals[tensor.name])
    kept = {t.name for t in graph.initializer}
    return RewrittenModel(out, {k: v for k, v in lazy.items() if k in kept}, store)


def _expert_initializers(plan: MoEBlockPlan) -> set[str]:
    w = plan.weights
    names = {m.initializer for m in (w.up, w.down, w.gate) if m is not None and m.initializer}
    names |= {n for m in (w.up, w.down, w.gate) if m is not None for n in m.per_expert}
    names |= {b.initializer for b in (w.up_bias, w.gate_bias, w.down_bias) if b is not None}
    return names


def _copy_without_expert_bytes(model: onnx.ModelProto, plans: list[MoEBlockPlan]) -> tuple[onnx.ModelProto, set]:
    """A copy of ``model`` whose inline expert weights (about to be replaced by shards) are headers only.

    Copying them only to delete them would double the memory an embedded model holds. Returns the copy and
    the names of the tensors stubbed (the caller restores any that stay in use).
    """
    expert_names = set().union(*(_expert_initializers(p) for p in plans)) if plans else set()
    stubbed = {
        t.name
        for t in model.graph.initializer
        if t.name in expert_names and t.data_location != TensorProto.EXTERNAL and _np_size(t) > 1024
    }
    return copy_with_stubbed_initializers(model, stubbed), stubbed


def _side_nodes_by_block(
    original: onnx.GraphProto, replaced_by_plan: dict[str, set[str]], dead: set[str]
) -> dict[str, list[str]]:
    """Attribute nodes that died with a block (index reshapes, hidden-state tiling) to that block."""
    consumers: dict[str, list[str]] = {}
    for node in original.node:
        for inp in node.input:
            consumers.setdefault(inp, []).append(node.name)
    outputs = {node.name: list(node.output) for node in original.node}
    result: dict[str, list[str]] = {}
    for node in reversed(original.node):
        if node.name not in dead:
            continue
        users = {u for o in outputs[node.name] for u in consumers.get(o, [])}
        for block, members in replaced_by_plan.items():
            if users and users <= members | set(result.get(block, [])):
                result.setdefault(block, []).append(node.name)
                break
    return {block: list(reversed(names)) for block, names in result.items()}


def materialize(rewritten: RewrittenModel) -> onnx.ModelProto:
    """Fill every lazy initializer's bytes in memory (small models, in-memory sessions)."""
    model = onnx.ModelProto()
    model.CopyFrom(rewritten.model)
    for tensor in model.graph.initializer:
        lazy = rewritten.lazy.get(tensor.name)
        if lazy is not None:
            tensor.raw_data = np.ascontiguousarray(lazy.produce(), dtype=np.float32).tobytes()
    return model


def _np_size(tensor: TensorProto) -> int:
    return int(np.prod(tensor.dims, dtype=np.int64))


def materialize_with_store(rewritten: RewrittenModel) -> onnx.ModelProto:
    """Materialise lazy tensors and load any external data of the original initializers into memory."""
    model = materialize(rewritten)
    if rewritten.store is not None:
        for tensor in model.graph.initializer:
            if tensor.data_location == TensorProto.EXTERNAL:
                array = rewritten.store.full(tensor.name)
                tensor.raw_data = np.ascontiguousarray(array).tobytes()
                del tensor.external_data[:]
                tensor.data_location = TensorProto.DEFAULT
    return model
