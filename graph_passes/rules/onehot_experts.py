"""Detection rule for the TorchScript exporter's MoE forms (``torch.onnx.export(..., dynamo=False)``).

1. ``experts_implementation="batched_mm"`` with dynamic axes. Stacked weights are selected with ``Gather``
   (not ``GatherND``), the hidden state is repeated per top-k slot with a ``Tile`` whose repeats are built at
   run time from a ``OneHot`` shape trick, and the gate/up chunk is two ``Slice`` nodes whose bounds are
   computed from ``Shape`` (so shape inference leaves them unknown)::

      ids[T,K] ─ Reshape[-1] ─ f[T*K] ─┬─ Gather(W1[E,..], f) ─┐            ┌─ Gather(W2[E,..], f)
      x[T,H] ─ Unsqueeze[1] ─ Tile(Reshape(OneHot([1],3,[1,K]))) ─ Flatten(2) ─ Unsqueeze ─ MatMul ─ Squeeze
             [─ Add(Gather(b1, f))] ─ act (Split | Slice pair ─ SiLU-GLU | clamped SwiGLU | Relu | ...) ─
             Unsqueeze ─ MatMul(W2 sel) ─ Squeeze [─ Add(Gather(b2, f))] ─ Mul(Unsqueeze(Reshape(rw[T,K], -1)))
             ─ Reshape[T,K,H] ─ ReduceSum(axis 1) ─ y[T,H] [─ Cast]

   Every step is checked structurally (the small shape computations are evaluated with
   :class:`ShapeEvaluator`): the selection indices are exactly the row-major flattening of one ``[T, K]``
   integer id tensor (from a TopK, or any other router: sparse-mixer ArgMax pairs, grouped top-k...), the
   repeat count and the combine's ``K`` equal that width, the selected weights reach their ``MatMul``
   unmodified, the activation is one of the plan's, and the combine is the routing-weighted sum over ``K``.
   The router itself is never matched: it stays as ordinary ops, and so does any shared expert added after.
   Only ``Gather`` selections are claimed by default; the dynamo exporter's ``GatherND(W, Unsqueeze(f, -1))``
   form is matched the same way when the rule is built with ``claim_gathernd=True``.

2. ``experts_implementation="eager"``: the Python loop over the experts hit is unrolled at trace time::

      ids ─ OneHot ─ Transpose ─ ReduceSum ─ Greater ─ NonZero ─ (per expert hit while tracing:
            Gather(mask, ·) ─ NonZero ─ Gather(x) ─ MatMul(W[e]) ─ ... ─ ScatterElements ─ Add)

   Such a graph is only right for inputs that hit the same number of experts as the tracing input, so it is
   reported as a :class:`Skip` with the number of unrolled expert branches, never rewritten.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import onnx

from graph_passes.activations import SWIGLU_ALPHA, SWIGLU_LIMIT, identify_gated, identify_plain
from graph_passes.elementwise import elementwise_function
from graph_passes.graph_index import GraphIndex, is_standard_op, scope_of, through
from graph_passes.plan import BlockRegion, ExpertWeights, MoEBlockPlan, Skip, StackedBias, StackedMatrix
from graph_passes.rules import default_rule
from graph_passes.rules.eager_unrolled import EAGER_REASON, find_eager_unrolled  # noqa: F401 (re-exported)
from graph_passes.shape_eval import ShapeEvaluator


def _fail(reason: str) -> Skip:
    """A stage's mismatch inside one candidate block; :meth:`OneHotExpertsRule.find` sets where and nodes."""
    return Skip("", reason)


@default_rule(order=20)
class OneHotExpertsRule:
    """TorchScript-exporter MoE blocks (``Gather``-selected stacked experts) and eager-unrolled blocks."""

    name = "onehot_experts"

    def __init__(self, claim_gathernd: bool = False, claim_gather: bool = True, report_eager: bool = True) -> None:
        # GatherND selections are the dynamo exporter's form, left to the general gathered-experts rule unless
        # asked for (this matcher handles them too; tests prove it on the dynamo fixtures).
        self.claim_gathernd = claim_gathernd
        self.claim_gather = claim_gather
        self.report_eager = report_eager

    def find(self, index: GraphIndex) -> list[MoEBlockPlan | Skip]:
        results: list[MoEBlockPlan | Skip] = list(find_eager_unrolled(index)) if self.report_eager else []
        evaluator = ShapeEvaluator(index)
        groups: dict[str, list[onnx.NodeProto]] = {}
        for node in _selections(index, evaluator, self.claim_gather, self.claim_gathernd):
            groups.setdefault(_flat_ids_of(index, node), []).append(node)
        for flat_ids, selections in groups.items():
            if not any(len(index.initializer_shape(s.input[0])) == 3 for s in selections):
                continue
            where = scope_of(selections[0].name) or selections[0].name
            outcome = _match_block(index, evaluator, flat_ids, selections, self.name)
            if isinstance(outcome, Skip):
                outcome = Skip(where, outcome.reason, tuple(s.name for s in selections))
            results.append(outcome)
        return results


def _selections(index: GraphIndex, ev: ShapeEvaluator, with_gather: bool, with_gathernd: bool) -> list[onnx.NodeProto]:
    """Gather(axis 0) / GatherND(batch_dims 0) of a stacked ``[E, ...]`` initializer by a dynamic id vector."""
    found = []
    for node in index.graph.node:
        if not is_standard_op(node) or len(node.input) < 2 or index.constant(node.input[1]) is not None:
            continue
        weight_shape = index.initializer_shape(node.input[0])
        if weight_shape is None or len(weight_shape) not in (2, 3):
            continue
        if with_gather and node.op_type == "Gather" and index.attr(node, "axis", 0) == 0:
            ids_shape = index.shape(node.input[1])
            if ids_shape is not None and len(ids_shape) == 1:
                found.append(node)
        elif with_gathernd and node.op_type == "GatherND" and index.attr(node, "batch_dims", 0) == 0:
            unsqueeze = index.producer.get(node.input[1])
            if unsqueeze is None or unsqueeze.op_type != "Unsqueeze":
                continue
            axes = ev.ints(unsqueeze.input[1]) if len(unsqueeze.input) > 1 else index.attr(unsqueeze, "axes")
            ids_shape = index.shape(unsqueeze.input[0])
            if axes in ([1], [-1]) and ids_shape is not None and len(ids_shape) == 1:
                found.append(node)
    return found


def _flat_ids_of(index: GraphIndex, selection: onnx.NodeProto) -> str:
    if selection.op_type == "GatherND":
        return index.producer[selection.input[1]].input[0]
    return selection.input[1]


def _single(index: GraphIndex, value: str, op_types: Iterable[str], what: str) -> onnx.NodeProto | Skip:
    users = index.consumers.get(value, [])
    single = len(users) == 1 and users[0].op_type in op_types and is_standard_op(users[0])
    if value in index.graph_outputs or not single:
        ops = ", ".join(u.op_type for u in users) or "nothing"
        return _fail(f"{what} ({value}) feeds {ops}, expected one {'/'.join(op_types)}")
    return users[0]


def _other_input(node: onnx.NodeProto, value: str) -> str | Skip:
    others = [i for i in node.input if i != value]
    if len(others) != 1:
        return _fail(f"{node.name}: expected a binary op with {value} on one side")
    return others[0]


def _match_block(
    index: GraphIndex, ev: ShapeEvaluator, flat_ids: str, selections: list[onnx.NodeProto], rule: str
) -> MoEBlockPlan | Skip:
    """anchor (the selections, grouped by the caller) → trace → check → plan, each stage a value or a Skip."""
    ids = _expert_ids(index, ev, flat_ids)
    if isinstance(ids, Skip):
        return ids
    ids_value, top_k = ids
    projections = _chained_projections(index, selections, top_k)
    if isinstance(projections, Skip):
        return projections
    first, second, num_experts = projections
    # -- the first projection's input is the hidden state repeated once per top-k slot
    hidden_value = _repeated_hidden(index, ev, first["x_source"], top_k)
    if isinstance(hidden_value, Skip):
        return hidden_value
    # -- the activation between the projections
    activation = _checked_activation(index, ev, first, second)
    if isinstance(activation, Skip):
        return activation
    # -- the combine: y_e * rw[:, :, None] summed over the K axis
    combine = _combine(index, ev, second["out"], top_k, first["in_dim"])
    if isinstance(combine, Skip):
        return combine
    output_value, routing_value = combine
    if routing_value == ids_value:
        return _fail("the combine weights the experts by their ids")
    stop = {hidden_value, ids_value, routing_value}
    region = index.upstream(output_value, stop=stop)
    region -= index.upstream(hidden_value) | index.upstream(ids_value) | index.upstream(routing_value)
    name = _block_name(index, selections, first)
    block = BlockRegion(
        where=name,
        nodes=tuple(sorted(_dead_after_rewrite(index, region, output_value))),
        hidden_value=hidden_value,
        expert_ids_value=ids_value,
        routing_weights_value=routing_value,
        output_value=output_value,
        num_experts=num_experts,
        top_k=top_k,
        hidden=first["in_dim"],
    )
    return _plan(block, rule, first, second, activation)


def _expert_ids(index: GraphIndex, ev: ShapeEvaluator, flat_ids: str) -> tuple[str, int] | Skip:
    """``(ids [T, K], K)`` when the selection indices are the row-major flattening of a ``[T, K]`` id tensor."""
    reshape = index.producer.get(flat_ids)
    if reshape is None or reshape.op_type != "Reshape" or ev.ints(reshape.input[1]) != [-1]:
        return _fail(f"expert weights are gathered by {flat_ids}, which is not a flattened [T, K] id tensor")
    ids_value = through(index, reshape.input[0], ("Cast",))
    ids_shape = index.shape(ids_value)
    if ids_shape is None or len(ids_shape) != 2:
        return _fail(f"expert ids {ids_value} are not a [tokens, top_k] tensor")
    # routers differ across families (TopK, sparse-mixer argmax pairs, grouped top-k...): any [T, K] integer
    # tensor will do; K comes from a TopK's constant k or else from the static shape
    topk = index.producer.get(ids_value)
    top_k = None
    if topk is not None and topk.op_type == "TopK" and len(topk.output) > 1 and topk.output[1] == ids_value:
        k_values = ev.ints(topk.input[1])
        if k_values is None or len(k_values) != 1 or index.attr(topk, "axis", -1) not in (-1, 1):
            return _fail("top-k count is not a constant")
        top_k = k_values[0]
    elif isinstance(ids_shape[1], int):
        top_k = ids_shape[1]
    if top_k is None:
        return _fail(f"the top-k width of expert ids {ids_value} is unknown")
    if isinstance(ids_shape[1], int) and ids_shape[1] != top_k:
        return _fail(f"expert ids {ids_value} have {ids_shape[1]} columns, but top-k is {top_k}")
    return ids_value, top_k


def _chained_projections(
    index: GraphIndex, selections: list[onnx.NodeProto], top_k: int
) -> tuple[dict, dict, int] | Skip:
    """``(first, second, num_experts)``: the two gathered matrices' projections, the second fed by the first."""
    weights = list({s.name: s for s in selections if len(index.initializer_shape(s.input[0])) == 3}.values())
    biases = {s.output[0]: s for s in selections if len(index.initializer_shape(s.input[0])) == 2}
    if len(weights) != 2:
        return _fail(f"expected 2 stacked expert matrices gathered by the expert ids, found {len(weights)}")
    projections = []
    for selection in weights:
        projection = _projection(index, selection, biases)
        if isinstance(projection, Skip):
            return projection
        projections.append(projection)
    # the down projection consumes what the first projection produced
    first, second = projections
    if _depends_on(index, first["x_source"], second["out_node"]):
        first, second = second, first
    if not _depends_on(index, second["x_source"], first["out_node"]):
        return _fail("the two gathered matrices are not chained (first projection -> activation -> second)")
    num_experts = index.initializer_shape(first["weight"])[0]
    if index.initializer_shape(second["weight"])[0] != num_experts:
        return _fail("gathered expert matrices disagree on the expert count")
    if not 0 < top_k <= num_experts:
        return _fail(f"top_k {top_k} is not in 1..{num_experts}")
    return first, second, num_experts


def _checked_activation(index: GraphIndex, ev: ShapeEvaluator, first: dict, second: dict) -> tuple | Skip:
    """The activation between the projections, whose widths must fit it: ``(name, columns, alpha, limit)``."""
    activation = _activation(index, ev, first["out"], second["x_source"], first)
    if isinstance(activation, Skip):
        return activation
    gate = activation[1]["gate"]
    hidden, ffn = first["in_dim"], second["in_dim"]
    if gate is None and first["out_dim"] != ffn:
        return _fail(f"first projection width {first['out_dim']} differs from the down projection's {ffn}")
    if gate is not None and first["out_dim"] != 2 * ffn:
        return _fail(f"gated first projection width {first['out_dim']} is not twice the ffn {ffn}")
    if second["out_dim"] != hidden:
        return _fail(f"down projection width {second['out_dim']} differs from the hidden size {hidden}")
    return activation


def _block_name(index: GraphIndex, selections: list[onnx.NodeProto], first: dict) -> str:
    """The exporter's module scope of the experts' parent, else a name read from the weights or the nodes."""
    weights = {s.name: s for s in selections if len(index.initializer_shape(s.input[0])) == 3}
    selection = next(iter(weights.values()))
    return (
        _torch_scope_block(index, selection)
        or _weightscope_of(first["weight"])
        or (scope_of(selection.name) if "/" in selection.name else "")
        or f"moe.{first['weight']}"
    )


def _plan(block: BlockRegion, rule: str, first: dict, second: dict, activation: tuple) -> MoEBlockPlan:
    """The plan stage: the region's fields plus the stacked weights read in the activation's columns."""
    name, columns, alpha, limit = activation

    def matrix(projection: dict, selected: str) -> StackedMatrix:
        return StackedMatrix(projection["weight"], projection["layout"], columns=selected)

    def bias(projection: dict, selected: str) -> StackedBias | None:
        return StackedBias(projection["bias"], selected) if projection["bias"] else None

    if columns["gate"] is None:
        expert_weights = ExpertWeights(
            up=matrix(first, "all"),
            down=matrix(second, "all"),
            up_bias=bias(first, "all"),
            down_bias=bias(second, "all"),
        )
    else:
        expert_weights = ExpertWeights(
            up=matrix(first, columns["up"]),
            gate=matrix(first, columns["gate"]),
            down=matrix(second, "all"),
            up_bias=bias(first, columns["up"]),
            gate_bias=bias(first, columns["gate"]),
            down_bias=bias(second, "all"),
        )
    return MoEBlockPlan(
        name=block.where,
        rule=rule,
        **block.plan_fields(),
        ffn=second["in_dim"],
        activation=name,
        weights=expert_weights,
        activation_alpha=alpha,
        activation_limit=limit,
        notes=("TorchScript batched_mm export (Gather-selected stacked experts)",),
    )


def _weightscope_of(weight: str) -> str:
    match = re.match(r"(.+?)\.experts\.", weight)
    return match.group(1) if match else ""


def _depends_on(index: GraphIndex, value: str, node: onnx.NodeProto) -> bool:
    return node.name in index.upstream(value)


def _projection(index: GraphIndex, selection: onnx.NodeProto, biases: dict[str, onnx.NodeProto]) -> dict | Skip:
    """``MatMul`` of a gathered ``[E, a, b]`` weight with the (un)squeezed activation, plus an optional bias."""
    weight = selection.input[0]
    _, rows, cols = index.initializer_shape(weight)
    matmul = _single(index, selection.output[0], ("MatMul",), f"gathered expert weight {weight}")
    if isinstance(matmul, Skip):
        return matmul
    other = _other_input(matmul, selection.output[0])
    if isinstance(other, Skip):
        return other
    unsqueeze = index.producer.get(other)
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze":
        return _fail(f"{matmul.name}: the activation operand is not an unsqueezed [N, features] tensor")
    if matmul.input[0] == selection.output[0]:  # W[e] @ x[:, None]: W is [out, in]
        layout, out_dim, in_dim, squeeze_axes = "out_in", rows, cols, (-1, 2)
    else:  # x[None, :] @ W[e]: W is [in, out]
        layout, out_dim, in_dim, squeeze_axes = "in_out", cols, rows, (-2, 1)
    evaluator = ShapeEvaluator(index)
    axes = evaluator.ints(unsqueeze.input[1]) if len(unsqueeze.input) > 1 else index.attr(unsqueeze, "axes")
    if axes is None or len(axes) != 1 or axes[0] not in squeeze_axes:
        return _fail(f"{matmul.name}: unexpected unsqueeze axes {axes} for a {layout} batched matmul")
    squeeze = _single(index, matmul.output[0], ("Squeeze",), f"{matmul.name} output")
    if isinstance(squeeze, Skip):
        return squeeze
    sq_axes = evaluator.ints(squeeze.input[1]) if len(squeeze.input) > 1 else index.attr(squeeze, "axes")
    if sq_axes is None or len(sq_axes) != 1 or sq_axes[0] not in squeeze_axes:
        return _fail(f"{squeeze.name}: unexpected squeeze axes {sq_axes}")
    biased = _projection_bias(index, squeeze, biases, out_dim)
    if isinstance(biased, Skip):
        return biased
    bias_name, out_node = biased
    out, out_node = _skip_noop_unsqueeze_squeeze(index, evaluator, out_node.output[0], out_node)
    return {
        "weight": weight,
        "layout": layout,
        "in_dim": in_dim,
        "out_dim": out_dim,
        "x_source": unsqueeze.input[0],
        "out": out,
        "out_node": out_node,
        "bias": bias_name,
        "matmul": matmul,
    }


def _projection_bias(
    index: GraphIndex, squeeze: onnx.NodeProto, biases: dict[str, onnx.NodeProto], out_dim: int
) -> tuple[str, onnx.NodeProto] | Skip:
    """``(bias initializer or "", node giving the projection's output)``: the ``Add`` of a gathered bias if any."""
    out = squeeze.output[0]
    users = index.consumers.get(out, [])
    if len(users) != 1 or users[0].op_type != "Add":
        return "", squeeze
    bias_value = _other_input(users[0], out)
    if isinstance(bias_value, Skip):
        return bias_value
    if bias_value not in biases:
        return "", squeeze
    bias_name = biases[bias_value].input[0]
    if index.initializer_shape(bias_name)[1] != out_dim:
        return _fail(f"bias {bias_name} width differs from the projection's {out_dim}")
    return bias_name, users[0]


def _skip_noop_unsqueeze_squeeze(
    index: GraphIndex, ev: ShapeEvaluator, value: str, node: onnx.NodeProto
) -> tuple[str, onnx.NodeProto]:
    """Follow ``Unsqueeze(axes=a) -> Squeeze(axes=a)`` pairs (exporter no-ops) downstream of ``value``."""
    while True:
        users = index.consumers.get(value, [])
        if len(users) != 1 or users[0].op_type != "Unsqueeze" or value in index.graph_outputs:
            return value, node
        unsqueeze = users[0]
        after = index.consumers.get(unsqueeze.output[0], [])
        if len(after) != 1 or after[0].op_type != "Squeeze":
            return value, node
        squeeze = after[0]
        axes_in = ev.ints(unsqueeze.input[1]) if len(unsqueeze.input) > 1 else index.attr(unsqueeze, "axes")
        axes_out = ev.ints(squeeze.input[1]) if len(squeeze.input) > 1 else index.attr(squeeze, "axes")
        if axes_in is None or axes_in != axes_out:
            return value, node
        value, node = squeeze.output[0], squeeze


def _torch_scope_block(index: GraphIndex, node: onnx.NodeProto) -> str:
    """``model.model.layers.0.mlp`` from the dynamo exporter's ``pkg.torch.onnx.name_scopes`` metadata."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            for scope in reversed(re.findall(r"[\w.]+", prop.value)):
                match = re.fullmatch(r"(.+)\.experts", scope)
                if match:
                    return match.group(1)
    return ""


def _repeated_hidden(index: GraphIndex, ev: ShapeEvaluator, value: str, top_k: int) -> str | Skip:
    """``Flatten(Tile(Unsqueeze(x, 1), [1, K, 1]), 2)`` or ``Reshape(Expand(Unsqueeze(x, 1), [.., K, ..]))``."""
    repeat = _repeat(index, ev, value, top_k)
    if isinstance(repeat, Skip):
        return repeat
    unsqueeze = index.producer.get(repeat.input[0])
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze":
        return _fail(f"{repeat.name}: input is not the unsqueezed hidden state")
    axes = ev.ints(unsqueeze.input[1]) if len(unsqueeze.input) > 1 else index.attr(unsqueeze, "axes")
    if axes != [1]:
        return _fail(f"{unsqueeze.name}: hidden state unsqueezed on axes {axes}, expected [1]")
    hidden_value = unsqueeze.input[0]
    shape = index.shape(hidden_value)
    if shape is None or len(shape) != 2:
        return _fail(f"hidden state {hidden_value} is not a [T, H] tensor")
    return hidden_value


def _repeat(index: GraphIndex, ev: ShapeEvaluator, value: str, top_k: int) -> onnx.NodeProto | Skip:
    """The ``Tile``/``Expand`` repeating ``[T, 1, H]`` ``top_k`` times whose ``[T*K, H]`` flattening is ``value``."""
    node = index.producer.get(value)
    if node is None or node.op_type not in ("Flatten", "Reshape"):
        return _fail(f"expert input {value} is not the hidden state repeated per top-k slot")
    if node.op_type == "Flatten" and index.attr(node, "axis", 1) != 2:
        return _fail(f"{node.name}: flatten axis is not 2")
    if node.op_type == "Reshape":
        target = ev.ints(node.input[1])
        if target is None or len(target) != 2 or target[0] not in (-1, 0):
            return _fail(f"{node.name}: does not flatten the [T, K, H] repeat")
    repeat = index.producer.get(node.input[0])
    if repeat is None or repeat.op_type not in ("Tile", "Expand"):
        return _fail(f"expert input {value} is not a Tile/Expand repeat of the hidden state")
    pattern = ev.ints(repeat.input[1])
    if repeat.op_type == "Tile":
        if pattern != [1, top_k, 1]:
            return _fail(f"{repeat.name}: repeats {pattern} are not [1, {top_k}, 1]")
    elif pattern is None or len(pattern) != 3 or pattern[1] != top_k:
        out_shape = index.shape(repeat.output[0])
        if out_shape is None or len(out_shape) != 3 or out_shape[1] != top_k:
            return _fail(f"{repeat.name}: does not repeat the hidden state {top_k} times")
    return repeat


def _slice_columns(
    index: GraphIndex, ev: ShapeEvaluator, node: onnx.NodeProto, width: int
) -> tuple[int, int, int] | Skip:
    """``(start, stop, step)`` of a last-axis Slice over a ``width``-wide tensor."""
    if node.op_type != "Slice" or len(node.input) < 3:
        return _fail(f"{node.name}: expected a Slice of the first projection")
    starts, ends = ev.ints(node.input[1]), ev.ints(node.input[2])
    axes = ev.ints(node.input[3]) if len(node.input) > 3 and node.input[3] else [0]
    steps = ev.ints(node.input[4]) if len(node.input) > 4 and node.input[4] else [1]
    if None in (starts, ends, axes, steps) or len(starts) != 1 or axes[0] not in (-1, 1):
        return _fail(f"{node.name}: slice bounds are not constant on the feature axis")
    return slice(starts[0], ends[0], steps[0]).indices(width)


def _split_halves(index: GraphIndex, ev: ShapeEvaluator, value: str, width: int) -> dict[str, str] | Skip:
    """Map each value that is a column selection of ``value`` to its plan column name."""
    halves: dict[str, str] = {}
    for user in index.consumers.get(value, []):
        if user.op_type == "Shape":  # the TorchScript chunk computes its slice bounds from the shape
            continue
        if user.op_type == "Split":
            axis = index.attr(user, "axis", 0)
            if axis not in (-1, 1) or len(user.output) != 2:
                return _fail(f"{user.name}: not a two-way split of the feature axis")
            sizes = ev.ints(user.input[1]) if len(user.input) > 1 and user.input[1] else [width // 2] * 2
            if sizes != [width // 2, width // 2] or width % 2:
                return _fail(f"{user.name}: split sizes {sizes} are not two halves of {width}")
            halves[user.output[0]] = "first_half"
            halves[user.output[1]] = "second_half"
        elif user.op_type == "Slice":
            reading = _slice_half(index, ev, user, width)
            if isinstance(reading, Skip):
                return reading
            halves[user.output[0]] = reading
        else:
            return _fail(f"first projection output feeds {user.op_type}, expected Split or Slice")
    return halves


def _slice_half(index: GraphIndex, ev: ShapeEvaluator, node: onnx.NodeProto, width: int) -> str | Skip:
    """The plan column name of a Slice reading one gate/up half of a ``width``-wide tensor."""
    columns = _slice_columns(index, ev, node, width)
    if isinstance(columns, Skip):
        return columns
    start, stop, step = columns
    half = width // 2
    reading = {
        (0, half, 1): "first_half",
        (half, width, 1): "second_half",
        (0, width, 2): "even",
        (1, width, 2): "odd",
    }.get((start, stop if step == 1 else width, step))
    if step == 2 and stop < width - 1:
        reading = None
    if reading is None:
        return _fail(f"{node.name}: slice {start}:{stop}:{step} is not a gate/up half of {width}")
    return reading


def _producer(index: GraphIndex, value: str, op_type: str) -> onnx.NodeProto | None:
    node = index.producer.get(value)
    return node if node is not None and node.op_type == op_type and is_standard_op(node) else None


def _scalar(index: GraphIndex, value: str) -> float | None:
    constant = index.constant(value) if value else None
    if constant is None or constant.size != 1:
        return None
    return float(constant.reshape(-1)[0])


def _silu_of(index: GraphIndex, value: str) -> str | None:
    """``x`` if ``value = x * sigmoid(x)``."""
    mul = _producer(index, value, "Mul")
    if mul is None:
        return None
    for a, b in ((mul.input[0], mul.input[1]), (mul.input[1], mul.input[0])):
        sig = _producer(index, b, "Sigmoid")
        if sig is not None and sig.input[0] == a:
            return a
    return None


def _activation(index: GraphIndex, ev: ShapeEvaluator, h: str, act: str, first: dict) -> tuple | Skip:
    """Recognise ``act = f(h)``; returns (activation, {"gate", "up"} columns, alpha, limit)."""
    plain = _plain_activation(index, h, act)
    if plain is not None:
        return plain
    return _gated_activation(index, ev, h, act, first["out_dim"])


def _plain_activation(index: GraphIndex, h: str, act: str) -> tuple | Skip | None:
    """``act = f(h)`` for an ungated activation ``f``; None when ``act`` is not a function of ``h`` alone."""
    plain = {"gate": None, "up": None}
    relu = _producer(index, act, "Relu")
    if relu is not None and relu.input[0] == h:
        return "relu", plain, SWIGLU_ALPHA, SWIGLU_LIMIT
    if _silu_of(index, act) == h:
        return "silu", plain, SWIGLU_ALPHA, SWIGLU_LIMIT
    gelu = _producer(index, act, "Gelu")
    if gelu is not None and gelu.input[0] == h:
        approximate = index.attr(gelu, "approximate", "none")
        approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
        return ("gelu_tanh" if approximate == "tanh" else "gelu"), plain, SWIGLU_ALPHA, SWIGLU_LIMIT
    # decomposed activations (erf / tanh GELU...): an elementwise subgraph of h alone, identified numerically
    function = elementwise_function(index, [h], act)
    if function is not None:
        name = identify_plain(function)
        if name is None:
            return _fail("unrecognised elementwise expert activation (not relu, silu, gelu or gelu_tanh)")
        return name, plain, SWIGLU_ALPHA, SWIGLU_LIMIT
    return None


def _gated_activation(index: GraphIndex, ev: ShapeEvaluator, h: str, act: str, width: int) -> tuple | Skip:
    """``act = f(gate, up)`` over two column halves of ``h``: silu/gelu GLU or the clamped SwiGLU."""
    halves = _split_halves(index, ev, h, width)
    if isinstance(halves, Skip):
        return halves
    if len(halves) != 2:
        return _fail("unrecognised expert activation (neither a plain activation nor a gate/up pair)")
    mul = _producer(index, act, "Mul")
    if mul is None:
        return _fail(f"expert activation output {act} is not a gated product")
    for a, b in ((mul.input[0], mul.input[1]), (mul.input[1], mul.input[0])):
        gate = _silu_of(index, a)
        if gate in halves and b in halves and gate != b:  # silu(g) * u
            return "silu_glu", {"gate": halves[gate], "up": halves[b]}, SWIGLU_ALPHA, SWIGLU_LIMIT
        swiglu = _clamped_swiglu(index, a, b, halves)
        if isinstance(swiglu, Skip):
            return swiglu
        if swiglu is not None:
            return "swiglu_clamp", swiglu[0], swiglu[1], swiglu[2]
    first_half, second_half = sorted(halves, key=lambda v: halves[v])
    for gate, up in ((first_half, second_half), (second_half, first_half)):
        function = elementwise_function(index, [gate, up], act)
        if function is not None and identify_gated(function) is not None:
            return identify_gated(function), {"gate": halves[gate], "up": halves[up]}, SWIGLU_ALPHA, SWIGLU_LIMIT
    return _fail("unrecognised gated expert activation (expected silu(g)*u, gelu(g)*u or clamped SwiGLU)")


def _clamped_swiglu(index: GraphIndex, glu: str, up_plus_one: str, halves: dict[str, str]) -> tuple | Skip | None:
    """``(clip(u, -L, L) + 1) * (g' * sigmoid(alpha * g'))`` with ``g' = clip(g, max=L)``."""
    add = _producer(index, up_plus_one, "Add")
    glu_mul = _producer(index, glu, "Mul")
    if add is None or glu_mul is None:
        return None
    clip_u_value = next((i for i in add.input if _producer(index, i, "Clip") is not None), None)
    one = _scalar(index, next((i for i in add.input if i != clip_u_value), ""))
    if clip_u_value is None or one != 1.0:
        return None
    clip_u = _producer(index, clip_u_value, "Clip")
    u_low = _scalar(index, clip_u.input[1] if len(clip_u.input) > 1 else "")
    u_high = _scalar(index, clip_u.input[2] if len(clip_u.input) > 2 else "")
    for g_clipped, sig_value in ((glu_mul.input[0], glu_mul.input[1]), (glu_mul.input[1], glu_mul.input[0])):
        sig = _producer(index, sig_value, "Sigmoid")
        clip_g = _producer(index, g_clipped, "Clip")
        if sig is None or clip_g is None:
            continue
        scaled = _producer(index, sig.input[0], "Mul")
        if scaled is None or g_clipped not in scaled.input:
            continue
        alpha_value = _other_input(scaled, g_clipped)
        if isinstance(alpha_value, Skip):
            return alpha_value
        alpha = _scalar(index, alpha_value)
        g_low = clip_g.input[1] if len(clip_g.input) > 1 else ""
        g_high = _scalar(index, clip_g.input[2] if len(clip_g.input) > 2 else "")
        if alpha is None or g_low or g_high is None:
            continue
        if u_low != -g_high or u_high != g_high:
            return None
        g_half, u_half = halves.get(clip_g.input[0]), halves.get(clip_u.input[0])
        if g_half is None or u_half is None or g_half == u_half:
            return None
        return {"gate": g_half, "up": u_half}, alpha, g_high
    return None


def _combine(index: GraphIndex, ev: ShapeEvaluator, expert_out: str, top_k: int, hidden: int) -> tuple[str, str] | Skip:
    """``ReduceSum_k(Reshape(expert_out * rw_col, [T, K, H]))``; returns (output value, routing weights [T,K])."""
    mul = _single(index, expert_out, ("Mul",), "expert output")
    if isinstance(mul, Skip):
        return _fail(f"combine is not the routing-weighted sum over the top-k slots: {mul.reason}")
    rw_col = _other_input(mul, expert_out)
    if isinstance(rw_col, Skip):
        return rw_col
    unsqueeze = _producer(index, rw_col, "Unsqueeze")
    flat = _producer(index, unsqueeze.input[0], "Reshape") if unsqueeze is not None else None
    if flat is None or ev.ints(flat.input[1]) != [-1]:
        return _fail(
            "combine is not the routing-weighted sum: the expert outputs are not multiplied by the "
            "flattened [T, K] routing weights"
        )
    routing_value = through(index, flat.input[0], ("Cast",))
    rw_shape = index.shape(routing_value)
    if rw_shape is None or len(rw_shape) != 2 or rw_shape[-1] not in (top_k, None) and isinstance(rw_shape[-1], int):
        return _fail(f"routing weights {routing_value} are not a [T, {top_k}] tensor")
    reshape = _single(index, mul.output[0], ("Reshape",), "weighted expert output")
    if isinstance(reshape, Skip):
        return reshape
    target = ev.ints(reshape.input[1])
    out_shape = index.shape(reshape.output[0])
    k_dim = (
        target[1]
        if target is not None and len(target) == 3
        else (out_shape[1] if out_shape is not None and len(out_shape) == 3 else None)
    )
    if k_dim != top_k:
        return _fail(f"{reshape.name}: weighted outputs are not regrouped as [T, {top_k}, H]")
    reduce = _single(index, reshape.output[0], ("ReduceSum",), "regrouped expert outputs")
    if isinstance(reduce, Skip):
        return reduce
    axes = ev.ints(reduce.input[1]) if len(reduce.input) > 1 and reduce.input[1] else index.attr(reduce, "axes")
    if axes not in ([1], [-2]) or index.attr(reduce, "keepdims", 1) != 0:
        return _fail(f"{reduce.name}: does not sum over the top-k axis")
    # the block output is the sum itself: a following float->float Cast (TorchScript's ``.to(dtype)``) stays,
    # so that every rule names the same output value for the same block
    output_value = reduce.output[0]
    return output_value, routing_value


def _dead_after_rewrite(index: GraphIndex, region: set[str], output_value: str) -> set[str]:
    """Nodes of ``region`` whose every output is consumed only inside the region (or is the block output)."""
    alive = set(region)
    changed = True
    while changed:
        changed = False
        for name in list(alive):
            node = index.node_by_name[name]
            for out in node.output:
                if out == output_value or not out:
                    continue
                if out in index.graph_outputs or any(u.name not in alive for u in index.consumers.get(out, [])):
                    alive.discard(name)
                    changed = True
                    break
    return alive
