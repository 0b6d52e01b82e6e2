"""Rule: MoE blocks whose experts are stacked weights gathered by the router's top-k expert ids.

This is the form PyTorch exporters give Hugging Face MoE blocks with ``experts_implementation=
"batched_mm"`` (Mixtral, Qwen2/3-MoE, OLMoE, GPT-OSS...) and the form of our samples. It is recognised by
data flow, not by an op sequence:

    router ... TopK ─ ids ─(layout ops)─┬─ Gather[ND](W1[E,..]) ─┐
                     values ─ ... ─ rw  │                        ▼
    x[T,H] ─(layout ops)────────────────┼───────────────► expert FFN (any ops) ◄─ Gather[ND](W2[E,..])
                                        │                        ▼                       ▲
                                        └────────────────────────┼───────────────────────┘
                                           rw ─(layout ops)──► combine ─► y  (single exit value)

1. anchor: every Gather/GatherND whose data is a stacked initializer ``[E, ...]`` and whose indices come
   from a TopK's indices through layout-only ops;
2. trace: the expert region is the set of nodes downstream of the anchors, in topological order, up to the
   first point where the region has exactly one value used outside it (the block output ``y``);
3. check: the region's other inputs are the hidden state ``x`` (not downstream of the TopK), one routing-
   weight tensor (downstream of the TopK) and shape computations; the matrices' roles follow from the data
   flow (the down projection consumes what the first projection produced) and their shapes;
4. plan: the readings compatible with the shapes (layouts, gate/up column split, activation), best
   structural guess first; the verifier keeps the one that reproduces ``y`` numerically.
Anything else (an intermediate used outside the block, more inputs, odd shapes) is a :class:`Skip`.
"""

from __future__ import annotations

import itertools
import math
import re

import onnx

from graph_passes.activations import PLAIN_ACTIVATIONS, SWIGLU_ALPHA, SWIGLU_LIMIT
from graph_passes.graph_index import GraphIndex
from graph_passes.plan import (
    BlockRegion,
    ExpertWeights,
    MoEBlockPlan,
    MoECandidate,
    Skip,
    StackedBias,
    StackedMatrix,
)
from graph_passes.rules import default_rule

LAYOUT_OPS = {"Unsqueeze", "Squeeze", "Reshape", "Expand", "Tile", "Flatten", "Cast", "Identity"}
MATMUL_OPS = {"MatMul", "Gemm", "Einsum"}
# ops whose inputs after the first are shape parameters (sizes, axes, repeats), not data
DATA_IN_FIRST_INPUT_OPS = LAYOUT_OPS | {"Slice", "Pad", "Split", "ConstantOfShape", "Resize"}
MAX_REGION_NODES = 400
FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
SMALL_INITIALIZER_ELEMENTS = 64  # scalars and shape vectors an expert region may read besides its weights
GATED_COLUMN_SPLITS = (("first_half", "second_half"), ("even", "odd"), ("second_half", "first_half"), ("odd", "even"))


def _is_std(node: onnx.NodeProto) -> bool:
    return node.domain in ("", "ai.onnx")


def layout_root(index: GraphIndex, value: str) -> tuple[str, list[str]]:
    """Follow ``value`` back through layout-only ops; return the root value and the nodes passed."""
    chain = layout_chain(index, value)
    return chain[-1][0], [op for _, op in chain[:-1]]


def layout_chain(index: GraphIndex, value: str) -> list[tuple[str, str]]:
    """``[(value, producing layout node's op type), ..., (root, "")]`` walking back through layout ops."""
    chain: list[tuple[str, str]] = []
    while True:
        node = index.producer.get(value)
        if node is None or node.op_type not in LAYOUT_OPS or not _is_std(node) or not node.input:
            chain.append((value, ""))
            return chain
        chain.append((value, node.op_type))
        value = node.input[0]


def unrepeated_hidden(index: GraphIndex, chain: list[tuple[str, str]]) -> str:
    """The hidden-state value of a chain feeding an expert product: upstream of any per-slot repetition
    (Tile/Expand), the first two-dimensional value ``[tokens, H]``; else the chain's root."""
    repeat_at = max((i for i, (_, op) in enumerate(chain) if op in ("Tile", "Expand")), default=-1)
    for value, _ in chain[repeat_at + 1 :]:
        shape = index.shape(value)
        if shape is not None and len(shape) == 2:
            return value
    return chain[-1][0]


def _block_name(index: GraphIndex, weight_names: list[str], region: list[onnx.NodeProto], used: set[str]) -> str:
    candidates: list[str] = []
    for weight in weight_names:
        match = re.match(r"(.+?)\.experts?\b", weight)
        if match:
            candidates.append(match.group(1))
    for node in region:
        for prop in node.metadata_props:
            if prop.key == "pkg.torch.onnx.name_scopes":
                scopes = re.findall(r"[\w.]+", prop.value)
                for scope in scopes:
                    match = re.match(r"(.+?)\.experts\b", scope)
                    if match:
                        candidates.append(match.group(1))
    prefixes = {n.name.split("/")[0] for n in region if "/" in n.name}
    if len(prefixes) == 1:
        candidates.append(prefixes.pop())
    for name in candidates:
        if name and name not in used:
            return name
    counter = 0
    while f"moe{counter}" in used:
        counter += 1
    return f"moe{counter}"


def _scalar_constants(index: GraphIndex, region: list[onnx.NodeProto], op_types: set[str]) -> set[float]:
    values: set[float] = set()
    for node in region:
        if node.op_type not in op_types:
            continue
        for inp in node.input:
            array = index.constant(inp) if inp else None
            if array is not None and array.size == 1 and array.dtype.kind == "f":
                values.add(round(float(array.reshape(())), 6))
    return values


@default_rule(order=30)
class GatheredExpertsRule:
    """Finds stacked-weight MoE blocks (see the module docstring)."""

    name = "gathered_experts"

    def find(self, index: GraphIndex) -> list[MoEBlockPlan | MoECandidate | Skip]:
        results: list[MoEBlockPlan | MoECandidate | Skip] = []
        used_names: set[str] = set()
        order = {node.name: position for position, node in enumerate(index.graph.node)}
        for ids_value, anchors in self._anchor_groups(index).items():
            outcome = self._find_block(index, ids_value, anchors, order, used_names)
            if isinstance(outcome, Skip):
                outcome = Skip(outcome.where, outcome.reason, tuple(a.name for a in anchors))
            if outcome is not None:
                results.append(outcome)
                used_names.add(outcome.name if not isinstance(outcome, Skip) else outcome.where)
        return results

    @staticmethod
    def _anchor_groups(index: GraphIndex) -> dict[str, list[onnx.NodeProto]]:
        """Gathers of stacked initializers ``[E, ...]`` grouped by the integer value that selects the rows."""
        groups: dict[str, list[onnx.NodeProto]] = {}
        for node in index.graph.node:
            if node.op_type not in ("Gather", "GatherND") or not _is_std(node) or len(node.input) < 2:
                continue
            data = node.input[0]
            if data not in index.initializers or len(index.initializers[data].dims) < 2:
                continue
            if node.op_type == "Gather" and index.attr(node, "axis", 0) != 0:
                continue
            if node.op_type == "GatherND" and index.attr(node, "batch_dims", 0) != 0:
                continue
            root, _ = layout_root(index, node.input[1])
            if index.elem_type(root) not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
                continue
            if root in index.initializers or index.constant(root) is not None:
                continue  # a fixed selection (an unrolled loop), not routing
            root_shape = index.shape(root)
            if root_shape is not None and len(root_shape) == 0:
                continue  # one expert picked by a scalar: an unrolled per-expert branch, not per-token routing
            groups.setdefault(root, []).append(node)
        # only groups that select stacked matrices are experts (a 2-D table gathered by ids is an embedding)
        return {
            root: nodes
            for root, nodes in groups.items()
            if any(len(index.initializers[n.input[0]].dims) == 3 for n in nodes)
        }

    @staticmethod
    def _router(index: GraphIndex, ids_value: str) -> onnx.NodeProto | None:
        """The router's projection: the nearest matrix product upstream of the expert ids."""
        frontier = [ids_value]
        seen: set[str] = set()
        while frontier:
            value = frontier.pop(0)
            node = index.producer.get(value)
            if node is None or node.name in seen:
                continue
            seen.add(node.name)
            if node.op_type in MATMUL_OPS:
                return node
            frontier.extend(i for i in node.input if i and i not in index.initializers)
        return None

    def _find_block(self, index, ids_value, anchors, order, used_names) -> MoEBlockPlan | MoECandidate | Skip | None:
        """anchor (done by the caller) → trace → check → roles → plan, each stage returning a value or a Skip."""
        selector = index.producer.get(ids_value)
        where = f"{selector.op_type} {selector.name}" if selector is not None else ids_value
        router = self._router(index, ids_value)
        if selector is None or router is None:
            return Skip(where, "expert weights are selected by ids that no router computes")
        routing = self._routing(index, where, selector, router, ids_value, anchors)
        if isinstance(routing, Skip):
            return routing
        num_experts, top_k = routing
        region = self._trace_and_check(index, where, router, ids_value, anchors, order, num_experts, top_k)
        if isinstance(region, Skip):
            return region
        roles = self._roles(index, region, anchors)
        if isinstance(roles, Skip):
            return roles
        first_layer, down_anchor, biases = roles
        nodes = [index.node_by_name[n] for n in region.nodes]
        name = _block_name(index, [a.input[0] for a in anchors], nodes, used_names)
        readings = self._readings(index, name, region, first_layer, down_anchor, biases)
        if isinstance(readings, Skip):
            return Skip(name, readings.reason)
        return MoECandidate(readings=tuple(readings))

    @staticmethod
    def _routing(index, where, selector, router, ids_value, anchors) -> tuple[int, int] | Skip:
        """``(num_experts, top_k)`` agreed on by the gathered weights, the router and the ids."""
        num_experts_set = {index.initializers[a.input[0]].dims[0] for a in anchors}
        if len(num_experts_set) != 1:
            return Skip(where, f"gathered expert weights disagree on the expert count: {sorted(num_experts_set)}")
        num_experts = int(num_experts_set.pop())
        logits_shape = index.shape(router.output[0])
        if logits_shape and isinstance(logits_shape[-1], int) and logits_shape[-1] != num_experts:
            return Skip(where, f"router has {logits_shape[-1]} outputs but expert weights stack {num_experts}")
        ids_shape = index.shape(ids_value)
        if selector.op_type == "TopK" and len(selector.input) > 1 and index.constant(selector.input[1]) is not None:
            top_k = int(index.constant(selector.input[1]).reshape(-1)[0])
        elif ids_shape and isinstance(ids_shape[-1], int):
            top_k = int(ids_shape[-1])
        else:
            return Skip(where, "number of experts per token is unknown")
        if ids_shape is not None and (len(ids_shape) != 2 or ids_shape[-1] != top_k):
            return Skip(where, f"expert ids have shape {list(ids_shape)}, expected [tokens, {top_k}]")
        if not 0 < top_k <= num_experts:
            return Skip(where, f"top-{top_k} routing over {num_experts} experts")
        return num_experts, top_k

    def _trace_and_check(
        self, index, where, router, ids_value, anchors, order, num_experts: int, top_k: int
    ) -> BlockRegion | Skip:
        """The region downstream of the anchors up to a single exit value whose inputs are x, rw and ids."""
        anchor_names = {a.name for a in anchors}
        descendants = index.downstream(o for a in anchors for o in a.output)
        routing_nodes = _routing_nodes(index, router, descendants | anchor_names)
        walk = sorted(anchor_names | descendants, key=order.__getitem__)
        exits = self._single_exit_points(index, walk, anchor_names, routing_nodes)
        if not exits:
            return Skip(where, "expert computation has no single output (an intermediate is used outside the block)")
        first_skip: Skip | None = None
        upstream_of: dict[str, set[str]] = {}  # every candidate exit's region reads the same roots: walk each once
        for region, exit_value in exits:
            checked = self._check_inputs(index, router, where, region, anchors, ids_value, exit_value, upstream_of)
            if not isinstance(checked, Skip):
                hidden_value, routing_value, hidden = checked
                return BlockRegion(
                    where=where,
                    nodes=tuple(n.name for n in region),
                    hidden_value=hidden_value,
                    expert_ids_value=ids_value,
                    routing_weights_value=routing_value,
                    output_value=exit_value,
                    num_experts=num_experts,
                    top_k=top_k,
                    hidden=hidden,
                )
            first_skip = first_skip or checked
        return first_skip

    @staticmethod
    def _roles(index, region: BlockRegion, anchors) -> tuple[list, onnx.NodeProto, list] | Skip:
        """First-projection matrices, the down projection (it consumes what another matrix produced), biases."""
        region_names = set(region.nodes)
        matrices = [a for a in anchors if len(index.initializers[a.input[0]].dims) == 3]
        matrix_names = {m.name for m in matrices}
        biases = [a for a in anchors if len(index.initializers[a.input[0]].dims) == 2]
        first_layer, down_layer = [], []
        for anchor in matrices:
            matmul = _first_matmul(index, anchor, region_names)
            if matmul is None:
                return Skip(region.where, f"gathered weight {anchor.input[0]} does not reach a matrix product")
            deps = _upstream_anchors(index, matmul.name, {a.name for a in anchors}, region_names) - {anchor.name}
            (down_layer if deps & matrix_names else first_layer).append(anchor)
        if len(down_layer) != 1 or len(first_layer) not in (1, 2):
            return Skip(
                region.where,
                f"expected 1-2 first-projection and 1 down-projection weights, found "
                f"{len(first_layer)} and {len(down_layer)}",
            )
        return first_layer, down_layer[0], biases

    @staticmethod
    def _single_exit_points(index, walk, anchor_names, routing_nodes, limit: int = 3):
        """Prefixes of the walk that contain every anchor, consume the routing weights and leave one value."""
        exits: list[tuple[list[onnx.NodeProto], str]] = []
        combined = False
        region: list[onnx.NodeProto] = []
        open_uses: dict[str, int] = {}
        remaining = set(anchor_names)
        for name in walk[:MAX_REGION_NODES]:
            node = index.node_by_name[name]
            region.append(node)
            remaining.discard(name)
            for inp in node.input:
                producer = index.producer.get(inp)
                floating = index.elem_type(inp) not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
                if floating and producer is not None and producer.name in routing_nodes:
                    combined = True
                if inp in open_uses:
                    open_uses[inp] -= 1
                    if open_uses[inp] == 0:
                        del open_uses[inp]
            for out in node.output:
                uses = len(index.consumers.get(out, [])) + (out in index.graph_outputs)
                if out and uses:
                    open_uses[out] = uses
            if combined and not remaining and len(open_uses) == 1:
                candidate = next(iter(open_uses))
                shape = index.shape(candidate)
                if shape is not None and len(shape) >= 2:
                    exits.append((list(region), candidate))
                    if len(exits) >= limit:
                        break
        return exits

    @staticmethod
    def _check_inputs(
        index, router, where, region, anchors, ids_value, exit_value, upstream_of: dict[str, set[str]]
    ) -> tuple[str, str, int] | Skip:
        """The region's external inputs must be x, the routing weights, ids and shape computations (``upstream_of``:
        the nodes upstream of each root already walked, filled in here)."""
        if router.name in {n.name for n in region}:
            return Skip(where, "router depends on expert weights")
        produced = {o for n in region for o in n.output}
        anchor_names = {a.name for a in anchors}
        routing_roots: set[str] = set()
        hidden_roots: set[str] = set()
        for node in region:
            for inp in node.input:
                if not inp or inp in produced:
                    continue
                if inp in index.initializers:
                    tensor = index.initializers[inp]
                    if node.name not in anchor_names and math.prod(tensor.dims) > SMALL_INITIALIZER_ELEMENTS:
                        return Skip(where, f"expert computation uses a weight {inp} that is not gathered by expert id")
                    continue
                if index.constant(inp) is not None:
                    continue
                chain = layout_chain(index, inp)
                root = chain[-1][0]
                if root == ids_value:
                    continue
                above = upstream_of.get(root)
                if above is None:
                    above = upstream_of[root] = index.upstream(root)
                elem = index.elem_type(root)
                if elem in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
                    producer = index.producer.get(root)
                    upstream_ops = {index.node_by_name[n].op_type for n in above}
                    if producer is not None and "Shape" in upstream_ops | {producer.op_type}:
                        continue  # a shape computation
                    return Skip(where, f"expert computation reads an unexpected integer tensor {root}")
                if router.name in above:
                    routing_roots.add(root)
                else:
                    hidden_roots.add(unrepeated_hidden(index, chain))
        routing_roots, hidden_roots = sorted(routing_roots), sorted(hidden_roots)
        if len(routing_roots) != 1:
            return Skip(where, f"expected one routing-weight input to the combine, found {len(routing_roots)}")
        if len(hidden_roots) != 1:
            return Skip(where, f"expected one hidden-state input to the experts, found {len(hidden_roots)}")
        routing_value, hidden_value = routing_roots[0], hidden_roots[0]
        hidden_shape = index.shape(hidden_value)
        exit_shape = index.shape(exit_value)
        hidden = hidden_shape[-1] if hidden_shape else None
        if not isinstance(hidden, int):
            hidden = exit_shape[-1] if exit_shape and isinstance(exit_shape[-1], int) else None
        if hidden is None:
            return Skip(where, "hidden size unknown (shape inference could not resolve it)")
        if exit_shape and isinstance(exit_shape[-1], int) and exit_shape[-1] != hidden:
            return Skip(where, f"block output width {exit_shape[-1]} differs from hidden size {hidden}")
        if hidden_shape and exit_shape and len(hidden_shape) != len(exit_shape):
            return Skip(
                where, f"block output rank {len(exit_shape)} differs from hidden-state rank {len(hidden_shape)}"
            )
        exit_size, hidden_size = index.concrete_size(exit_value), index.concrete_size(hidden_value)
        if exit_size is not None and hidden_size is not None and exit_size != hidden_size:
            return Skip(where, f"block output has {exit_size} elements where the hidden state has {hidden_size}")
        for value in (hidden_value, routing_value, exit_value):
            if index.elem_type(value) not in (None, *FLOAT_TYPES):
                return Skip(where, f"{value} is not a float tensor (float32, float16 or bfloat16)")
        return hidden_value, routing_value, hidden

    def _readings(
        self, index, name: str, region: BlockRegion, first_layer, down_anchor, biases
    ) -> list[MoEBlockPlan] | Skip:
        """Every reading of the expert weights compatible with the shapes, best structural guess first."""
        hidden = region.hidden
        bias_by_width = _biases_by_width(index, biases)
        down_bias_names = bias_by_width.get(hidden, [])
        if len(down_bias_names) > 1:
            return Skip(name, "several gathered biases could be the down-projection bias")
        down_bias = StackedBias(down_bias_names[0]) if down_bias_names else None
        gated_acts, plain_acts = _candidate_activations(index, [index.node_by_name[n] for n in region.nodes])
        down_name = down_anchor.input[0]
        if len(first_layer) == 1:
            found = _fused_first_readings(
                index, first_layer[0].input[0], down_name, hidden, bias_by_width, down_bias, gated_acts, plain_acts
            )
        else:
            names = [a.input[0] for a in first_layer]
            found = _separate_first_readings(index, names, down_name, hidden, down_bias, gated_acts)
        if not found:
            return Skip(name, f"expert weight shapes do not fit one FFN of hidden size {hidden}")
        common = dict(name=name, rule=self.name, **region.plan_fields())
        return [
            MoEBlockPlan(
                **common,
                ffn=ffn,
                activation=activation,
                weights=weights,
                activation_alpha=alpha,
                activation_limit=limit,
            )
            for ffn, activation, weights, alpha, limit in found
        ]


# ---------------------------------------------------------------------------------------------- weight readings

# an activation candidate: (name, alpha, limit); a reading: (ffn width, activation, weights, alpha, limit)
_Activation = tuple[str, float, float]
_Reading = tuple[int, str, ExpertWeights, float, float]


def _layouts(dims: tuple[int, ...], hidden: int, in_dim_is_hidden: bool) -> list[tuple[str, int]]:
    """The (layout, other width) readings of one expert's matrix of shape ``dims`` that reads (``in_dim_is_hidden``)
    or writes the hidden size."""
    a, b = dims
    options = []
    if in_dim_is_hidden:  # matrix reads H: in_out if a == H, out_in if b == H; the other is the width
        if a == hidden:
            options.append(("in_out", b))
        if b == hidden:
            options.append(("out_in", a))
    else:  # matrix writes H
        if b == hidden:
            options.append(("in_out", a))
        if a == hidden:
            options.append(("out_in", b))
    return options


def _down_layouts(index: GraphIndex, down_name: str, hidden: int) -> list[tuple[str, int]]:
    """The (layout, FFN width) readings of the stacked down projection ``down_name``."""
    return _layouts(tuple(index.initializers[down_name].dims[1:]), hidden, in_dim_is_hidden=False)


def _candidate_activations(index: GraphIndex, nodes: list[onnx.NodeProto]) -> tuple[list[_Activation], list[str]]:
    """The gated activations (with the region's clamp limits and scale constants) and the plain ones, those the
    region's op types hint at first."""
    op_types = {n.op_type for n in nodes}
    clamps = _scalar_constants(index, nodes, {"Clip", "Min", "Max"})
    limits = sorted({abs(v) for v in clamps if v != 0}) or [SWIGLU_LIMIT]
    alphas = sorted(_scalar_constants(index, nodes, {"Mul"}) - {1.0}) or [SWIGLU_ALPHA]
    if "Clip" in op_types or "Min" in op_types:
        gated_acts = [("swiglu_clamp", a, lim) for a in alphas for lim in limits]
        gated_acts.append(("silu_glu", SWIGLU_ALPHA, SWIGLU_LIMIT))
    else:
        gated_acts = [("silu_glu", SWIGLU_ALPHA, SWIGLU_LIMIT), ("gelu_glu", SWIGLU_ALPHA, SWIGLU_LIMIT)]
        gated_acts += [("swiglu_clamp", a, lim) for a in alphas for lim in limits]
    hinted = {"Relu": "relu", "Erf": "gelu", "Tanh": "gelu_tanh", "Sigmoid": "silu"}
    plain_acts = sorted(PLAIN_ACTIVATIONS, key=lambda a: 0 if a in {hinted.get(t) for t in op_types} else 1)
    return gated_acts, plain_acts


def _biases_by_width(index: GraphIndex, biases: list[onnx.NodeProto]) -> dict[int, list[str]]:
    """The gathered bias initializers by their per-expert width."""
    by_width: dict[int, list[str]] = {}
    for bias in biases:
        by_width.setdefault(int(index.initializers[bias.input[0]].dims[1]), []).append(bias.input[0])
    return by_width


def _fused_first_readings(
    index: GraphIndex,
    first_name: str,
    down_name: str,
    hidden: int,
    bias_by_width: dict[int, list[str]],
    down_bias: StackedBias | None,
    gated_acts: list[_Activation],
    plain_acts: list[str],
) -> list[_Reading]:
    """Readings with one first-layer matrix ``first_name``: gate and up fused (twice the FFN width, each column
    split) or a plain up projection (the FFN width)."""
    down_bias_names = bias_by_width.get(hidden, [])
    readings: list[_Reading] = []
    first_dims = tuple(index.initializers[first_name].dims[1:])
    for (first_layout, width), (down_layout, ffn) in itertools.product(
        _layouts(first_dims, hidden, in_dim_is_hidden=True), _down_layouts(index, down_name, hidden)
    ):
        first_bias_names = [b for b in bias_by_width.get(width, []) if b not in down_bias_names]
        first_bias = first_bias_names[0] if len(first_bias_names) == 1 else None
        down = StackedMatrix(down_name, down_layout)
        if width == 2 * ffn:
            for (gate_cols, up_cols), (act, alpha, limit) in itertools.product(GATED_COLUMN_SPLITS, gated_acts):
                weights = ExpertWeights(
                    up=StackedMatrix(first_name, first_layout, up_cols),
                    gate=StackedMatrix(first_name, first_layout, gate_cols),
                    down=down,
                    up_bias=StackedBias(first_bias, up_cols) if first_bias else None,
                    gate_bias=StackedBias(first_bias, gate_cols) if first_bias else None,
                    down_bias=down_bias,
                )
                readings.append((ffn, act, weights, alpha, limit))
        elif width == ffn:
            for act in plain_acts:
                weights = ExpertWeights(
                    up=StackedMatrix(first_name, first_layout),
                    down=down,
                    up_bias=StackedBias(first_bias) if first_bias else None,
                    down_bias=down_bias,
                )
                readings.append((ffn, act, weights, SWIGLU_ALPHA, SWIGLU_LIMIT))
    return readings


def _separate_first_readings(
    index: GraphIndex,
    names: list[str],
    down_name: str,
    hidden: int,
    down_bias: StackedBias | None,
    gated_acts: list[_Activation],
) -> list[_Reading]:
    """Readings with two first-layer matrices ``names``: either one the gate, the other the up projection."""
    readings: list[_Reading] = []
    dims = [tuple(index.initializers[n].dims[1:]) for n in names]
    for (gate_index, up_index), (down_layout, ffn) in itertools.product(
        ((0, 1), (1, 0)), _down_layouts(index, down_name, hidden)
    ):
        for gate_layout, gate_width in _layouts(dims[gate_index], hidden, True):
            for up_layout, up_width in _layouts(dims[up_index], hidden, True):
                if gate_width != ffn or up_width != ffn:
                    continue
                for act, alpha, limit in gated_acts:
                    weights = ExpertWeights(
                        up=StackedMatrix(names[up_index], up_layout),
                        gate=StackedMatrix(names[gate_index], gate_layout),
                        down=StackedMatrix(down_name, down_layout),
                        down_bias=down_bias,
                    )
                    readings.append((ffn, act, weights, alpha, limit))
    return readings


# ---------------------------------------------------------------------------------------------- graph walks


def _routing_nodes(index: GraphIndex, router: onnx.NodeProto, excluded: set[str]) -> set[str]:
    """Nodes carrying routing data (not shapes or ids derived from it) that are not expert computation."""
    found: set[str] = set()
    pending = list(router.output)
    while pending:
        value = pending.pop()
        if index.elem_type(value) in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            continue
        for user in index.consumers.get(value, []):
            if user.op_type in DATA_IN_FIRST_INPUT_OPS and user.input[0] != value:
                continue
            if user.name not in found and user.name not in excluded:
                found.add(user.name)
                pending.extend(user.output)
    return found


def _upstream_anchors(index: GraphIndex, node_name: str, anchor_names: set[str], region: set[str]) -> set[str]:
    """The anchors a region node depends on (stopping at each anchor)."""
    region_by_output = {o: n for n in region for o in index.node_by_name[n].output}
    seen, stack, found = set(), [node_name], set()
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if current in anchor_names and current != node_name:
            found.add(current)
            continue
        stack.extend(region_by_output[i] for i in index.node_by_name[current].input if i in region_by_output)
    return found


def _first_matmul(index: GraphIndex, anchor: onnx.NodeProto, region: set[str]) -> onnx.NodeProto | None:
    """The nearest matrix product downstream of ``anchor`` inside the region."""
    frontier = list(anchor.output)
    seen: set[str] = set()
    while frontier:
        value = frontier.pop(0)
        for user in index.consumers.get(value, []):
            if user.name not in region or user.name in seen:
                continue
            seen.add(user.name)
            if user.op_type in MATMUL_OPS:
                return user
            frontier.extend(user.output)
    return None
