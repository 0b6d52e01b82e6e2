"""Emit sharded expert ops from verified :class:`MoEBlockPlan` s (saving them: :mod:`graph_passes.model_io`).

For a block with E experts, FFN width I and S shards the rewrite replaces the block's expert nodes by one
``ndp_ep::ShardedMoEExperts`` node built by :func:`graph_passes.sharded_op.make_node` (the contract, its input
order, shard layouts and names are documented there)::

    hidden[..,H] ─┐
    expert_ids ───┼─► ndp_ep::ShardedMoEExperts ─► (the block's output value, same name)
    routing_w ────┤
    {block}.experts.{e}.shard{s}.gate_up / .down (+ scales, zero points, biases)

Each shard's partial output ``act(x @ first_s) @ down_s`` is summed over shards, which equals the unsharded
expert exactly in real arithmetic. Shards keep the model's precision: float16/bfloat16 matrices stay in their
dtype, block-quantized matrices keep their packed 4/8-bit values, scales and zero points, cut on block
boundaries. New weights are :class:`LazyTensor` s: their bytes are produced one expert at a time when the
model is materialised in memory or streamed to an external-data file.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from graph_passes import quant, sharded_op
from graph_passes.errors import GraphPassError
from graph_passes.expert_math import canonical_view, copy_blocked, select_columns
from graph_passes.graph_index import copy_with_stubbed_initializers, live_nodes
from graph_passes.plan import MoEBlockPlan, StackedBias, StackedMatrix
from graph_passes.shard_audit import ShardAudit, SourceRange
from graph_passes.sharded_op import DOMAIN as NDP_DOMAIN  # noqa: F401  (re-exported for ndp_ep.partition)
from graph_passes.sharded_op import OP_TYPE as SHARDED_OP  # noqa: F401
from graph_passes.signature import expert_tensors
from graph_passes.tensors import element_count
from graph_passes.weights import WeightStore


@dataclass
class LazyTensor:
    """An initializer whose values are computed on demand.

    ``produce()`` returns the tensor's values as one array of ``dims``, or as a tuple of 2-D arrays whose rows,
    stacked in order, are the tensor (a shard made of row blocks of its source). Arrays may be views of the
    source's file pages, strided or not: :meth:`parts` hands them to a writer as they are (a C-contiguous view
    of an external-data file is copied file to file, see :func:`graph_passes.model_io.save_rewritten`),
    :meth:`array` joins them. Values are of ``data_type`` (an ``onnx.TensorProto`` data type): bfloat16 as
    ``ml_dtypes.bfloat16`` (or its raw uint16), packed 4-bit values as uint8. Writers store their bytes as-is.
    """

    name: str
    dims: tuple[int, ...]
    produce: Callable[[], np.ndarray | tuple[np.ndarray, ...]]
    data_type: int = TensorProto.FLOAT

    def __post_init__(self) -> None:
        if any(not isinstance(d, int) or d < 0 for d in self.dims):
            raise ValueError(f"{self.name}: dims must be non-negative integers, got {self.dims}")
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(self.data_type)).itemsize  # raises for an unknown type
        self.dims = tuple(int(d) for d in self.dims)
        self._nbytes = math.prod(self.dims) * itemsize  # read once per tensor written: worked out once

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def parts(self) -> tuple[np.ndarray, ...]:
        """The values as arrays whose C-order bytes, one after the other, are the tensor's bytes."""
        produced = self.produce()
        parts = (produced,) if isinstance(produced, np.ndarray) else tuple(produced)
        if sum(part.nbytes for part in parts) != self.nbytes:
            raise GraphPassError(f"{self.name}: produced {sum(p.nbytes for p in parts)} bytes, expected {self.nbytes}")
        return parts

    def array(self) -> np.ndarray:
        """The values as one C-contiguous array of ``dims``."""
        parts = self.parts()
        if len(parts) == 1:
            return np.ascontiguousarray(parts[0]).reshape(self.dims)
        return np.concatenate([part.reshape(-1) for part in parts]).reshape(self.dims)


@dataclass
class RewrittenModel:
    """A rewritten graph whose new initializers are lazy; ``store`` reads the original weights."""

    model: onnx.ModelProto
    lazy: dict[str, LazyTensor] = field(default_factory=dict)
    store: WeightStore | None = None
    # blocks whose shards must prove to be byte views of their own weights (see graph_passes.shard_audit)
    audits: dict[str, ShardAudit] = field(default_factory=dict)

    def refuted_views(self, blocks: Iterable[str]) -> list[str]:
        """Why each of ``blocks`` (audited ones) has shards, as produced so far, that are not exact byte views of its
        own weights; empty when every audit holds. Asked once the shards were written; a block never audited is
        refuted."""
        reasons = []
        for block in blocks:
            reason = self.audits[block].holds() if block in self.audits else f"{block}: shards never audited"
            if reason:
                reasons.append(reason)
        return reasons


class _ExpertCache:
    """Canonical views of one expert's float weights at a time (the expert whose shards are being produced).

    Shards are produced group by group (every expert's first shards, then every expert's down shards...), each
    group expert by expert, so a matrix is read once per group that needs it and never one a group does not
    need; a gate and an up projection stacked in one initializer are one read.
    """

    def __init__(self, plan: MoEBlockPlan, store: WeightStore) -> None:
        self.plan, self.store = plan, store
        self.expert = -1
        self.views: dict[str, np.ndarray | None] = {}
        self.raw: dict[str, np.ndarray] = {}

    def get(self, expert: int, part: str) -> np.ndarray | None:
        """``part`` (``up``, ``gate``, ``down`` or one of their biases, as :class:`ExpertArrays` names them) of
        ``expert``: a matrix as :func:`canonical_view`, a bias as its selected columns (a view in its stored dtype),
        None when absent."""
        if expert != self.expert:
            self.views, self.raw = {}, {}  # release the previous expert's pages before mapping the next
            self.expert = expert
        if part not in self.views:
            self.views[part] = self._load(part)
        return self.views[part]

    def _load(self, part: str) -> np.ndarray | None:
        source = getattr(self.plan.weights, part)
        if source is None:
            return None
        if isinstance(source, StackedBias):
            return select_columns(self._read(source.initializer, self.expert), source.columns)
        if source.per_expert:
            return canonical_view(self._read(source.per_expert[self.expert], -1), source)
        return canonical_view(self._read(source.initializer, self.expert), source)

    def _read(self, name: str, expert: int) -> np.ndarray:
        raw = self.raw.get(name)
        if raw is None:
            raw = self.raw[name] = self.store.expert(name, expert)
        return raw


def sharded_spec(plan: MoEBlockPlan, shards: int) -> sharded_op.ShardedOpSpec:
    """The contract attributes of ``plan`` rewritten into ``shards`` shards."""
    w = plan.weights
    matrices = [m for m in (w.up, w.down, w.gate) if m is not None]
    return sharded_op.ShardedOpSpec(
        layer=plan.name,
        num_experts=plan.num_experts,
        top_k=plan.top_k,
        hidden=plan.hidden,
        ffn=plan.ffn,
        shards=shards,
        activation=plan.activation,
        activation_alpha=float(plan.activation_alpha),
        activation_limit=float(plan.activation_limit),
        activation_beta=float(plan.activation_beta),
        has_first_bias=w.up_bias is not None or w.gate_bias is not None,
        has_down_bias=w.down_bias is not None,
        weight_dtype=plan.weight_dtype,
        quant_block_size=plan.quant_block_size if plan.quantized else 0,
        has_zero_points=plan.quantized and any(m.zero_points for m in matrices),
        # float shards keep their source's layout (no transposing copies); quantized ones have one layout
        first_layout=sharded_op.DEFAULT_LAYOUT if plan.quantized else w.up.layout,
        down_layout=sharded_op.DEFAULT_LAYOUT if plan.quantized else w.down.layout,
    )


def _data_type(store: WeightStore, name: str) -> int:
    return store.tensors[name].data_type


def _row_slice(matrix: StackedMatrix, total_rows: int, start: int, stop: int) -> slice:
    """The source rows (output features) ``start:stop`` of ``matrix``'s column selection, as one slice."""
    rows = range(total_rows)
    selected = {"all": rows, "first_half": rows[: total_rows // 2], "second_half": rows[total_rows // 2 :]}
    selected |= {"even": rows[0::2], "odd": rows[1::2]}
    if matrix.columns not in selected:
        raise ValueError(f"unknown column selection {matrix.columns!r}")
    chosen = selected[matrix.columns][start:stop]
    return slice(chosen.start, chosen.stop, chosen.step)


def _float_producers(plan: MoEBlockPlan, store: WeightStore, spec: sharded_op.ShardedOpSpec) -> dict[str, list]:
    """``group -> [(dims, data_type, produce)]`` for float (float32/float16/bfloat16) experts.

    Each shard is produced as views of the source expert (its file's pages when external) in the layout the
    spec chose from the source, so nothing is transposed: an ``out_in`` first shard is the gate row block
    then the up row block, an ``out_in`` down shard a column block of the ``[H, I]`` matrix (strided: the
    writer copies it once), an ``in_out`` down shard a row block. Only an ``in_out`` gated first shard (gate
    columns beside up columns) is assembled here, in one copy; a gate stored the other way round from the up
    projection is transposed while copied (:func:`copy_blocked`).
    """
    width = spec.shard_width
    cache = _ExpertCache(plan, store)
    w = plan.weights
    matrix_type = _data_type(store, w.up.initializer or w.up.per_expert[0])

    def first(e: int, s: int) -> np.ndarray | tuple[np.ndarray, ...]:
        up = cache.get(e, "up")
        cols = slice(s * width, (s + 1) * width)
        matrices = [cache.get(e, "gate"), up] if plan.gated else [up]
        if spec.first_layout == "out_in":
            return tuple(_untransposed(m[:, cols].T) for m in matrices)
        if not plan.gated:
            return up[:, cols]
        out = np.empty((plan.hidden, 2 * width), dtype=up.dtype)
        copy_blocked(matrices[0][:, cols], out[:, :width])
        copy_blocked(up[:, cols], out[:, width:])
        return out

    def down(e: int, s: int) -> np.ndarray:
        rows = cache.get(e, "down")[s * width : (s + 1) * width, :]
        return rows.T if spec.down_layout == "out_in" else rows

    groups: dict[str, list] = {
        "first": [(spec.float_shape("first"), matrix_type, lambda e, s: first(e, s))],
        "down": [(spec.float_shape("down"), matrix_type, lambda e, s: down(e, s))],
    }
    groups.update(_bias_producers(plan, store, spec, cache))
    return groups


def _untransposed(view: np.ndarray) -> np.ndarray:
    """``view`` itself, or a C-contiguous copy when it is a transposing view (a gate laid out unlike its up)."""
    if view.ndim == 2 and abs(view.strides[0]) < abs(view.strides[1]):
        return copy_blocked(view)
    return view


def _bias_producers(
    plan: MoEBlockPlan, store: WeightStore, spec: sharded_op.ShardedOpSpec, cache: _ExpertCache
) -> dict:
    """Biases keep the dtype of the source bias tensor (missing halves of a gated pair are zeros); a shard of a bias is
    a view of it (a gated pair: the gate part, then the up part)."""
    w = plan.weights
    width = spec.shard_width
    first_width = 2 * width if plan.gated else width
    groups: dict[str, list] = {}

    def bias(e: int, part: str) -> np.ndarray | None:
        return cache.get(e, part)  # the bias tensor only: never the expert's matrices

    if spec.has_first_bias:
        source = w.up_bias or w.gate_bias
        bias_type = _data_type(store, source.initializer)
        dtype = helper.tensor_dtype_to_np_dtype(bias_type)

        def first_bias(e: int, s: int) -> np.ndarray | tuple[np.ndarray, ...]:
            cols = slice(s * width, (s + 1) * width)
            up_bias = bias(e, "up_bias")
            up = up_bias[cols].astype(dtype, copy=False) if up_bias is not None else np.zeros(width, dtype)
            if not plan.gated:
                return up
            gate_bias = bias(e, "gate_bias")
            gate = gate_bias[cols].astype(dtype, copy=False) if gate_bias is not None else np.zeros(width, dtype)
            return gate, up

        groups["first_bias"] = [((first_width,), bias_type, first_bias)]
    if spec.has_down_bias:
        bias_type = _data_type(store, w.down_bias.initializer)
        dtype = helper.tensor_dtype_to_np_dtype(bias_type)
        groups["down_bias"] = [((plan.hidden,), bias_type, lambda e: bias(e, "down_bias").astype(dtype, copy=False))]
    return groups


def _quantized_producers(plan: MoEBlockPlan, store: WeightStore, spec: sharded_op.ShardedOpSpec) -> dict[str, list]:
    """``group -> [(dims, data_type, produce)]`` for block-quantized experts: packed rows / blocks, unchanged."""
    w = plan.weights
    bits, block, width = spec.bits, spec.quant_block_size, spec.shard_width
    first_matrices = [w.gate, w.up] if plan.gated else [w.up]
    first_rows_total = store.tensors[w.up.initializer].dims[1]
    hidden_blocks, width_blocks = quant.block_count(plan.hidden, block), quant.block_count(width, block)
    scale_type = _data_type(store, w.up.scales)

    current: dict[str, np.ndarray] = {}  # the windows of the expert whose shards are being produced
    current_expert = [-1]

    def read(name: str, e: int) -> np.ndarray:
        """``name[e]``, one window per tensor and expert: its shards (and a gate and an up projection stacked in
        one tensor) are views of it, released when the next expert's are read."""
        if e != current_expert[0]:
            current.clear()
            current_expert[0] = e
        if name not in current:
            current[name] = store.expert(name, e)
        return current[name]

    def default_zero_points(rows: int, blocks: int) -> np.ndarray:
        return quant.pack(np.full((rows, blocks), 2 ** (bits - 1), np.uint8), bits)

    def first_part(kind: str, e: int, s: int) -> tuple[np.ndarray, ...]:
        parts = []
        for m in first_matrices:
            rows = _row_slice(m, first_rows_total, s * width, (s + 1) * width)
            if kind == "zero_points" and not m.zero_points:
                parts.append(default_zero_points(width, hidden_blocks))
                continue
            source = {"weights": m.initializer, "scales": m.scales, "zero_points": m.zero_points}[kind]
            parts.append(read(source, e)[rows])  # a row block (strided for interleaved rows): no copy here
        return tuple(parts)

    def down_part(kind: str, e: int, s: int) -> np.ndarray:
        m = w.down
        if kind == "weights":
            return quant.slice_inputs(read(m.initializer, e), bits, s * width, (s + 1) * width, copy=False)
        if kind == "scales":
            return read(m.scales, e)[:, s * width_blocks : (s + 1) * width_blocks]
        if not m.zero_points:
            return default_zero_points(plan.hidden, width_blocks)
        return quant.slice_inputs(read(m.zero_points, e), bits, s * width_blocks, (s + 1) * width_blocks, copy=False)

    first_rows = 2 * width if plan.gated else width
    u8 = TensorProto.UINT8
    groups: dict[str, list] = {
        "first": [((first_rows, quant.packed_width(plan.hidden, bits)), u8, lambda e, s: first_part("weights", e, s))],
        "down": [((plan.hidden, quant.packed_width(width, bits)), u8, lambda e, s: down_part("weights", e, s))],
        "first_scales": [((first_rows, hidden_blocks), scale_type, lambda e, s: first_part("scales", e, s))],
        "down_scales": [((plan.hidden, width_blocks), scale_type, lambda e, s: down_part("scales", e, s))],
    }
    if spec.has_zero_points:
        groups["first_zero_points"] = [
            ((first_rows, quant.packed_width(hidden_blocks, bits)), u8, lambda e, s: first_part("zero_points", e, s))
        ]
        groups["down_zero_points"] = [
            ((plan.hidden, quant.packed_width(width_blocks, bits)), u8, lambda e, s: down_part("zero_points", e, s))
        ]
    groups.update(_bias_producers(plan, store, spec, _ExpertCache(plan, store)))  # the biases alone
    return groups


def _shard_producers(
    plan: MoEBlockPlan, store: WeightStore, shards: int, audit: ShardAudit | None = None
) -> tuple[sharded_op.ShardedOpSpec, list]:
    """The node's spec and one :class:`LazyTensor` per weight input, in the contract's input order (``audit``: shown
    every shard as it is produced)."""
    spec = sharded_spec(plan, shards)
    groups = _quantized_producers(plan, store, spec) if plan.quantized else _float_producers(plan, store, spec)
    names = iter(spec.weight_names())
    tensors: list[LazyTensor] = []

    def watched(name: str, e: int, produce: Callable[[], np.ndarray | tuple]) -> Callable[[], np.ndarray | tuple]:
        if audit is None:
            return produce

        def produce_and_record():
            parts = produce()
            audit.record(name, e, parts)
            return parts

        return produce_and_record

    for group, _count in spec.input_groups():
        (dims, data_type, produce) = groups[group][0]
        for e in range(plan.num_experts):
            for s in range(1 if group == "down_bias" else shards):
                name = next(names)
                made = (lambda e=e, f=produce: f(e)) if group == "down_bias" else (lambda e=e, s=s, f=produce: f(e, s))
                tensors.append(LazyTensor(name, dims, watched(name, e, made), data_type))
    return spec, tensors


def shards_are_views(plan: MoEBlockPlan, store: WeightStore) -> bool:
    """Whether every byte of ``plan``'s expert tensors reaches its shards as a view of the tensor's data file (what
    :class:`ShardAudit` can check): all stacked in external data, and no layout the rewrite assembles by copying
    (a gated ``in_out`` first shard; a gate stored the other way round from its up projection)."""
    w = plan.weights
    matrices = [m for m in (w.up, w.gate, w.down) if m is not None]
    if any(m.per_expert for m in matrices):
        return False
    if any(store.tensors[n].data_location != TensorProto.EXTERNAL for n in expert_tensors(plan)):
        return False
    copied = not plan.quantized and plan.gated and (w.up.layout == "in_out" or w.gate.layout != w.up.layout)
    return not copied


def shard_audit(plan: MoEBlockPlan, store: WeightStore, shards: int) -> ShardAudit:
    """The audit of ``plan``'s shards against its own expert tensors' file ranges."""
    sources = {}
    for name in sorted(expert_tensors(plan)):
        path, offset, length = store.external_location(name)
        sources[name] = SourceRange(os.fspath(path), offset, length, plan.num_experts)
    tensors = len(sharded_spec(plan, shards).weight_names())
    return ShardAudit(plan.name, sources, tensors)


def sharded_node(plan: MoEBlockPlan, spec: sharded_op.ShardedOpSpec, weight_inputs: list[str]) -> onnx.NodeProto:
    """The ``ShardedMoEExperts`` node replacing ``plan``'s block."""
    return sharded_op.make_node(
        spec,
        plan.hidden_value,
        plan.expert_ids_value,
        plan.routing_weights_value,
        plan.output_value,
        weight_inputs,
        replaced_nodes=plan.replaced_nodes,
        summary=plan.summary(spec.shards),
    )


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
    model: onnx.ModelProto,
    plans: Iterable[MoEBlockPlan],
    shards: int | dict[str, int],
    store: WeightStore,
    audited: Iterable[str] = (),
) -> RewrittenModel:
    """Rewrite ``model`` (a copy is made) so every plan's block runs as one sharded expert op.

    ``shards`` is one count for every block or a count per block name. The blocks named in ``audited`` get a
    :class:`ShardAudit` (``RewrittenModel.audits``) that watches their shards as they are written.
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
        if plan.quantized and shards_of[plan.name] > 1 and (plan.ffn // shards_of[plan.name]) % plan.quant_block_size:
            raise GraphPassError(f"{plan.name}: shard width is not a multiple of block size {plan.quant_block_size}")
        replaced_by_plan[plan.name] = set(plan.replaced_nodes)
    all_replaced = set().union(*replaced_by_plan.values()) if plans else set()
    position_of_output = {}
    for position, node in enumerate(graph.node):
        for o in node.output:
            position_of_output[o] = position
    new_nodes: dict[int, list[onnx.NodeProto]] = {}
    audited = set(audited)
    audits = {p.name: shard_audit(p, store, shards_of[p.name]) for p in plans if p.name in audited}
    for plan in plans:
        spec, tensors = _shard_producers(plan, store, shards_of[plan.name], audits.get(plan.name))
        for tensor in tensors:
            lazy[tensor.name] = tensor
            header = graph.initializer.add()
            header.name, header.data_type = tensor.name, tensor.data_type
            header.dims.extend(tensor.dims)
        node = sharded_node(plan, spec, [t.name for t in tensors])
        new_nodes.setdefault(position_of_output[plan.output_value], []).extend([*plan.router_nodes, node])
    rebuilt: list[onnx.NodeProto] = []
    for position, node in enumerate(graph.node):
        if node.name not in all_replaced:
            rebuilt.append(node)
        rebuilt.extend(new_nodes.get(position, []))
    del graph.node[:]
    graph.node.extend(rebuilt)
    if plans and not any(o.domain == sharded_op.DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(sharded_op.DOMAIN, sharded_op.OPSET))
    if plans:
        helper.set_model_props(out, {**{p.key: p.value for p in out.metadata_props}, **sharded_op.model_metadata()})
    dead = set(_remove_dead_nodes(graph)) - all_replaced
    side_nodes = _side_nodes_by_block(model.graph, replaced_by_plan, dead)
    for node in graph.node:
        block = sharded_op.block_of_node_name(node.name) if sharded_op.is_sharded_node(node) else None
        if block in side_nodes:
            replaced = sharded_op.get_metadata(node, sharded_op.META_REPLACED_NODES, [])
            sharded_op.set_metadata(node, sharded_op.META_REPLACED_NODES, replaced + side_nodes[block])
    originals = {t.name: t for t in model.graph.initializer if t.name in stubbed}
    for tensor in graph.initializer:  # an expert weight still read elsewhere keeps its bytes
        if tensor.name in stubbed:
            tensor.CopyFrom(originals[tensor.name])
    kept = {t.name for t in graph.initializer}
    return RewrittenModel(out, {k: v for k, v in lazy.items() if k in kept}, store, audits)


def _copy_without_expert_bytes(model: onnx.ModelProto, plans: list[MoEBlockPlan]) -> tuple[onnx.ModelProto, set]:
    """A copy of ``model`` whose inline expert weights (about to be replaced by shards) are headers only.

    Copying them only to delete them would double the memory an embedded model holds. Returns the copy and
    the names of the tensors stubbed (the caller restores any that stay in use).
    """
    expert_names = set().union(*(expert_tensors(p) for p in plans)) if plans else set()
    stubbed = {
        t.name
        for t in model.graph.initializer
        if t.name in expert_names and t.data_location != TensorProto.EXTERNAL and element_count(t) > 1024
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
            tensor.raw_data = lazy.array().tobytes()
    return model


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
