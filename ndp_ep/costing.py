"""FLOPs and bytes of the graph's non-expert nodes for given input shapes, costed on the GPU.

Shapes come from ONNX shape inference on a weightless skeleton of the model with the run's concrete input
shapes; each claimed expert node is stood in for by an ``Identity`` of its hidden input (same shape). ONNX infers
only its standard operators: for the inference, each node of the ONNX Runtime operators decoders are built from
(attention, quantized products, fused norms: the keys of :data:`ndp_ep.stand_ins.STAND_INS`) is replaced by
standard nodes that give its outputs the same shapes and element types, and the node itself is costed from its own
formula (:data:`ndp_ep.contrib_costs.CONTRIB_COSTS`). Nodes whose shapes stay unknown are not costed:
:attr:`GpuCost.uncosted` names them.
Results are cached per input-shape signature (the oldest of ``MAX_COSTED_SHAPES`` forgotten first). A KV-cache
decoder's input shapes change at every decode step; its steps are costed from each node's figures as affine
functions of the past length, fitted by inference at a few past lengths and checked (:class:`_PastLengths`),
so a step costs no inference.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import onnx
from onnx import TensorProto, helper

from graph_passes.graph_index import copy_fields, copy_without_initializers
from hw_model.cost import kernel_time_s
from hw_model.hardware import DTYPE_BYTES, SystemSpec
from ndp_ep.contrib_costs import CONTRIB, CONTRIB_COSTS, CostFormula, NodeIo, Shape, element_bytes, never_costed
from ndp_ep.partition import is_ndp_supported
from ndp_ep.stand_ins import STAND_IN_OPSET, STAND_INS, StandInGraph, StandInNodes

MAX_COSTED_SHAPES = 4096  # input shapes whose non-expert GPU seconds are remembered (oldest forgotten first)

FREE_OPS = {
    "Shape",
    "Constant",
    "ConstantOfShape",
    "Reshape",
    "Unsqueeze",
    "Squeeze",
    "Flatten",
    "Identity",
    "Size",
    "Range",
    "Cast",
}
SMALL_INITIALIZER_BYTES = 4096
# ndp_ep.reporter.UnconvertedMoE costs the fused MoE ops the conversion skipped; here they only pass shapes on
COSTED_BY_THE_REPORTER = frozenset({(CONTRIB, "MoE"), (CONTRIB, "QMoE")})
FIT_SPAN = 4096  # past tokens a decode-step fit covers from its first step, at most
FIT_SHRINK = 8  # a range that does not fit is tried again this many times shorter
MIN_FIT_SPAN = 8  # down to this many past tokens
MAX_FITTED_FAMILIES = 64  # shape families (a batch and sequence length) whose decode-step fits are kept
_WEIGHT_BYTE_FIELDS = ("raw_data", "external_data")
# a node missing a required attribute, or with shapes its op does not allow: not costed (and named), not an error
_MALFORMED = (KeyError, IndexError, ValueError, TypeError, ZeroDivisionError)


class GpuCost(NamedTuple):
    """Non-expert work of one run on the GPU (a named tuple: a frozen dataclass costs ~0.4 ms to define at import,
    in every ``ndp-ep run``), and the node whose inputs and outputs together are the largest, at their element
    types, among those shape inference sizes: ``working_set_bytes`` (a lower bound on the memory the run needs
    where it is computed: a node's inputs and outputs are all held while it runs) and ``working_set_node`` naming
    it (empty when no node is sized). ``uncosted`` names the nodes, ``name (op type)``, left out of the figures
    because their shapes stayed unknown (an operator shape inference does not know, or one downstream of it)."""

    flops: float
    bytes_moved: float
    kernels: int
    time_s: float
    working_set_bytes: float = 0.0
    working_set_node: str = ""
    uncosted: tuple[str, ...] = ()


class _Costed(NamedTuple):
    """A node to cost: its label, its formula (None: a standard op's, :meth:`NonExpertCoster._standard_work`),
    attributes and which inputs it has."""

    node: onnx.NodeProto
    label: str
    formula: CostFormula | None
    attributes: dict[str, Any]
    given: tuple[bool, ...]
    probe: str


class _Work(NamedTuple):
    """Each costed node's (FLOPs, bytes moved), None when not costed, and each skeleton node's working set bytes
    (its inputs and outputs sized), in graph order: what a :class:`GpuCost` is summed from."""

    nodes: list[tuple[int, int] | None]
    working: list[int]


class NonExpertCoster:
    def __init__(self, model: onnx.ModelProto, system: SystemSpec, dtype: str) -> None:
        self.system = system
        self.dtype = dtype
        self.dtype_bytes = DTYPE_BYTES[dtype]
        self.skeleton = self._skeleton(model)
        self._versions = {o.domain: o.version for o in model.opset_import}  # the skeleton imports standard ones only
        self._inference: onnx.ModelProto | None = None  # the skeleton with stand-ins, built at the first cost
        self._costed: list[_Costed] = []
        self._past: _PastLengths | None = None
        self._cache: dict[tuple, GpuCost] = {}

    @staticmethod
    def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
        """The model without weight bytes: claimed nodes become ``Identity`` of their hidden input; the
        initializers no node reads are dropped, the large or external ones keep everything but their bytes; only
        the standard opsets stay imported. Built from a copy without initializers, to which the
        used ones are added, so the expert weights are never copied."""
        skeleton = copy_without_initializers(model)
        graph = skeleton.graph
        for position, node in enumerate(graph.node):
            if is_ndp_supported(node):
                stand_in = onnx.helper.make_node("Identity", [node.input[0]], [node.output[0]], name=node.name)
                graph.node[position].CopyFrom(stand_in)
        used = {i for n in graph.node for i in n.input}
        for tensor in model.graph.initializer:
            if tensor.name not in used:
                continue
            if len(tensor.raw_data) > SMALL_INITIALIZER_BYTES or tensor.data_location == TensorProto.EXTERNAL:
                _copy_header(tensor, graph.initializer.add())
            else:
                graph.initializer.add().CopyFrom(tensor)
        standard = [o for o in skeleton.opset_import if o.domain in ("", "ai.onnx")]
        del skeleton.opset_import[:]
        skeleton.opset_import.extend(standard or [onnx.helper.make_opsetid("", 17)])
        return skeleton

    def cost(self, input_shapes: dict[str, tuple[int, ...]]) -> GpuCost:
        key = tuple(sorted(input_shapes.items()))
        cached = self._cache.get(key)
        if cached is None:
            self._prepare()
            assert self._past is not None
            step = self._past.step_of(input_shapes)
            cached = self._compute(input_shapes) if step is None else self._step_cost(self._past, step, input_shapes)
            _bounded_put(self._cache, key, cached, MAX_COSTED_SHAPES)
        return cached

    def _prepare(self) -> onnx.ModelProto:
        """The inference model, the nodes to cost and the past-length dims, from the skeleton (once)."""
        if self._inference is None:
            self._inference, self._costed = _with_stand_ins(self.skeleton, self._versions)
            self._past = _PastLengths(self.skeleton.graph.input)
        return self._inference

    def _compute(self, input_shapes: dict[str, tuple[int, ...]]) -> GpuCost:
        """The cost of a run with these input shapes, by shape inference."""
        return self._total(self._work(input_shapes))

    def _step_cost(self, past: _PastLengths, step: _Step, input_shapes: dict[str, tuple[int, ...]]) -> GpuCost:
        """A decode step's cost: from its family's fit when one covers it, else by shape inference (after which
        the family may be fitted)."""
        work = past.work_at(step)
        if work is None:
            work = self._work(input_shapes)
            past.add_sample(step, work, self._work)
        return self._total(work)

    def _work(self, input_shapes: dict[str, tuple[int, ...]]) -> _Work:
        """Each node's work, from shape inference on the skeleton (with stand-ins) at these input shapes."""
        model = onnx.ModelProto()
        model.CopyFrom(self._prepare())
        for value in model.graph.input:
            if value.name in input_shapes:
                dims = value.type.tensor_type.shape.dim
                for d, size in zip(dims, input_shapes[value.name], strict=False):
                    d.Clear()
                    d.dim_value = int(size)
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        except Exception:
            inferred = model
        shapes: dict[str, Shape] = {}
        types: dict[str, int] = {}
        sizes: dict[str, int] = {}  # bytes of each tensor shape inference sized
        for value in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
            tensor_type = value.type.tensor_type
            types[value.name] = tensor_type.elem_type
            dims = tensor_type.shape.dim
            if tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
                shape = shapes[value.name] = tuple(d.dim_value for d in dims)
                sizes[value.name] = math.prod(shape) * element_bytes(tensor_type.elem_type)
        for tensor in inferred.graph.initializer:
            shapes[tensor.name] = tuple(tensor.dims)
            types[tensor.name] = tensor.data_type
            sizes[tensor.name] = math.prod(tensor.dims) * element_bytes(tensor.data_type)
        working = [
            sum(sizes.get(name, 0) for name in (*node.input, *node.output) if name) for node in self.skeleton.graph.node
        ]
        nodes: list[tuple[int, int] | None] = []
        for node, _, formula, attributes, given, probe in self._costed:
            if formula is None:
                nodes.append(self._standard_work(node, attributes, shapes))
                continue
            io = NodeIo(
                attributes,
                given,
                [shapes.get(name) if name else None for name in node.input],
                [shapes.get(name) if name else None for name in node.output],
                [types.get(name, 0) for name in node.input],
                shapes.get(probe),
            )
            try:
                nodes.append(formula(io, self.dtype_bytes))
            except _MALFORMED:
                nodes.append(None)
        return _Work(nodes, working)

    def _total(self, work: _Work) -> GpuCost:
        """The cost of the nodes' work: their roofline seconds summed in graph order, and the largest working set."""
        working_set_bytes, working_set_node = 0, ""
        for node, working in zip(self.skeleton.graph.node, work.working, strict=True):
            if working > working_set_bytes:
                working_set_bytes, working_set_node = working, _label(node)
        flops = bytes_moved = time_s = 0.0
        kernels = 0
        uncosted: list[str] = []
        gpu = self.system.gpu
        for costed, node_work in zip(self._costed, work.nodes, strict=True):
            if node_work is None:
                uncosted.append(costed.label)
                continue
            node_flops, node_bytes = float(node_work[0]), float(node_work[1])
            flops += node_flops
            bytes_moved += node_bytes
            kernels += 1
            time_s += kernel_time_s(gpu, node_flops, node_bytes, self.dtype, kernels=1)
        return GpuCost(flops, bytes_moved, kernels, time_s, float(working_set_bytes), working_set_node, tuple(uncosted))

    def _standard_work(
        self, node: onnx.NodeProto, attributes: dict[str, Any], shapes: dict[str, Shape]
    ) -> tuple[int, int] | None:
        """A standard op: one operation per output element (``2 * inner`` for a product), reading its inputs and
        writing its first output; None when its output's shape is unknown."""
        out_shape = shapes.get(node.output[0]) if node.output else None
        if out_shape is None:
            return None
        in_shapes = [shapes.get(i) for i in node.input if i]
        # math.prod, not np.prod: a Python product of a few ints is 20x quicker than building an array
        out_elems = math.prod(out_shape)
        node_bytes = (out_elems + sum(math.prod(s) for s in in_shapes if s is not None)) * self.dtype_bytes
        if node.op_type in ("MatMul", "Gemm") and in_shapes and in_shapes[0]:
            inner = in_shapes[0][-1] if not attributes.get("transA", 0) else in_shapes[0][-2]
            return 2 * out_elems * inner, node_bytes
        return out_elems, node_bytes


# -- decode steps: each node's work is affine in the past length, so a family of steps is costed from a fit --------


class _Step(NamedTuple):
    """A run's shapes as a decode step: its family (the shapes with their length dims left out), its past length
    and the values of its length dims (in the family's order)."""

    family: tuple
    past: int
    lengths: tuple[int, ...]


class _Fit(NamedTuple):
    """Each node's work at past length ``low`` and its slope per past token, valid for ``low <= past <= high`` at
    the length dims ``pattern`` gives (per dim: ``(True, offset)``, the past length plus ``offset``, or ``(False,
    value)``); ``work`` None: the figures were not affine over the range, and its steps are inferred."""

    low: int
    high: int
    pattern: tuple[tuple[bool, int], ...]
    work: _Work | None
    slope: _Work | None

    def lengths_at(self, past: int) -> tuple[int, ...]:
        return tuple(past + value if relative else value for relative, value in self.pattern)


class _PastLengths:
    """Steps of a KV-cache decoder at a fixed batch and sequence length differ only by their past length ``P``
    and the input dims named like one (:data:`graph_passes.feeds.PAST_LENGTH_DIMS`, sliding and total lengths
    alike), each ``P`` plus an offset or a constant (a window cache's capacity). Each node's FLOPs, bytes and
    working set are integers, affine in ``P`` wherever its shapes are. Once a family of steps has been inferred at
    two past lengths ``P0 < P1``, it is inferred at ``high = P0 + FIT_SPAN`` and midway; where every node's
    figures at the four lengths lie on one line with an integer slope (and the same nodes are costed), each step
    with ``P0 <= P <= high`` whose length dims follow the two steps' pattern is evaluated from the line, in
    integers: the figures inference gives. The min/max clamps and products shapes are built of bend one way only,
    so a bend between the points breaks the line; the range is then tried ``FIT_SHRINK`` times shorter, down to
    ``MIN_FIT_SPAN``, and the steps of a range that does not fit are inferred one by one."""

    def __init__(self, inputs: Sequence[onnx.ValueInfoProto]) -> None:
        from graph_passes.feeds import PAST_LENGTH_DIMS, SLIDING_DIMS, TOTAL_LENGTH_DIMS

        lengths = {*PAST_LENGTH_DIMS, *SLIDING_DIMS, *TOTAL_LENGTH_DIMS}
        self.dims: dict[str, tuple[int, ...]] = {}  # input -> positions of its length dims
        self.past: tuple[str, int] | None = None  # the input and position of a past length
        for value in inputs:
            params = [d.dim_param for d in value.type.tensor_type.shape.dim]
            positions = tuple(i for i, name in enumerate(params) if name in lengths)
            if positions:
                self.dims[value.name] = positions
            if self.past is None:
                self.past = next(((value.name, i) for i, name in enumerate(params) if name in PAST_LENGTH_DIMS), None)
        self._fits: dict[tuple, _Fit] = {}  # family -> its last fit
        self._samples: dict[tuple, tuple[_Step, _Work]] = {}  # family -> its last inferred step

    def step_of(self, input_shapes: dict[str, tuple[int, ...]]) -> _Step | None:
        """These input shapes as a decode step, or None when they give no past length."""
        if self.past is None or len(input_shapes.get(self.past[0], ())) <= self.past[1]:
            return None
        family, lengths = [], []
        for name, shape in sorted(input_shapes.items()):
            positions = self.dims.get(name, ())
            family.append((name, tuple(None if i in positions else d for i, d in enumerate(shape))))
            lengths.extend(int(shape[i]) for i in positions if i < len(shape))
        return _Step(tuple(family), int(input_shapes[self.past[0]][self.past[1]]), tuple(lengths))

    @staticmethod
    def shapes_at(family: tuple, lengths: Sequence[int]) -> dict[str, tuple[int, ...]]:
        """The input shapes of the family's step with these length dims."""
        values = iter(lengths)
        return {name: tuple(next(values) if d is None else d for d in shape) for name, shape in family}

    def work_at(self, step: _Step) -> _Work | None:
        """The step's work from its family's fit, when one covers it."""
        fit = self._fits.get(step.family)
        if fit is None or fit.work is None or fit.slope is None or not fit.low <= step.past <= fit.high:
            return None
        if fit.lengths_at(step.past) != step.lengths:
            return None
        return _along(fit.work, fit.slope, step.past - fit.low)

    def add_sample(self, step: _Step, work: _Work, infer: Callable[[dict[str, tuple[int, ...]]], _Work]) -> None:
        """Remember an inferred step; with an earlier one of its family at another past length outside the
        family's last fit, fit the family anew (``infer``: the work of input shapes, by inference)."""
        earlier = self._samples.pop(step.family, None)
        _bounded_put(self._samples, step.family, (step, work))
        fit = self._fits.get(step.family)
        if fit is not None and fit.low <= step.past <= fit.high and fit.lengths_at(step.past) == step.lengths:
            return  # a range found not to fit
        if earlier is None or earlier[0].past == step.past:
            return  # nothing to fit with
        (first, low_work), (second, inner_work) = sorted([earlier, (step, work)], key=lambda sample: sample[0].past)
        low, inner = first.past, second.past
        pattern = []
        for a, b in zip(first.lengths, second.lengths, strict=True):
            if a != b and b - a != inner - low:
                return  # a length dim neither constant nor following the past length
            pattern.append((True, a - low) if a != b else (False, a))
        # the longest range that fits: a bend (a window filling up, a slice clamped) cuts a range short
        span = max(FIT_SPAN, 2 * (inner - low))
        while True:
            line = _Fit(low, low + span, tuple(pattern), low_work, None)
            slope = self._affine_slope(line, step.family, (inner, inner_work), infer)
            if slope is not None or span // FIT_SHRINK <= max(inner - low, MIN_FIT_SPAN - 1):
                break
            span //= FIT_SHRINK
        self._fits.pop(step.family, None)
        _bounded_put(
            self._fits, step.family, line._replace(slope=slope) if slope is not None else line._replace(work=None)
        )

    def _affine_slope(
        self, line: _Fit, family: tuple, inner: tuple[int, _Work], infer: Callable[[dict[str, tuple[int, ...]]], _Work]
    ) -> _Work | None:
        """The slope of every figure from ``line.low`` to ``line.high`` (inferred) when the figures at ``inner``
        and midway (inferred) lie on it; None when they do not."""
        assert line.work is not None
        low, high = line.low, line.high
        slope = _slope(line.work, infer(self.shapes_at(family, line.lengths_at(high))), high - low)
        if slope is None or _along(line.work, slope, inner[0] - low) != inner[1]:
            return None
        middle = (low + high) // 2 + ((low + high) // 2 == inner[0])
        middle_work = infer(self.shapes_at(family, line.lengths_at(middle)))
        return slope if _along(line.work, slope, middle - low) == middle_work else None


def _bounded_put(table: dict, key: Any, value: Any, bound: int = MAX_FITTED_FAMILIES) -> None:
    """``table[key] = value``, the oldest entry forgotten first beyond ``bound`` entries."""
    if len(table) >= bound:
        del table[next(iter(table))]
    table[key] = value


def _slope(low: _Work, high: _Work, span: int) -> _Work | None:
    """Each figure's integer slope from ``low`` to ``high`` over ``span`` past tokens; None when a node is costed
    at one end only or a slope is not an integer."""
    nodes: list[tuple[int, int] | None] = []
    for a, b in zip(low.nodes, high.nodes, strict=True):
        if (a is None) != (b is None):
            return None
        if a is None or b is None:
            nodes.append(None)
            continue
        if (b[0] - a[0]) % span or (b[1] - a[1]) % span:
            return None
        nodes.append(((b[0] - a[0]) // span, (b[1] - a[1]) // span))
    if any((b - a) % span for a, b in zip(low.working, high.working, strict=True)):
        return None
    return _Work(nodes, [(b - a) // span for a, b in zip(low.working, high.working, strict=True)])


def _along(base: _Work, slope: _Work, steps: int) -> _Work:
    """``base`` moved ``steps`` past tokens along ``slope``."""
    nodes = [
        None if a is None or s is None else (a[0] + s[0] * steps, a[1] + s[1] * steps)
        for a, s in zip(base.nodes, slope.nodes, strict=True)
    ]
    return _Work(nodes, [a + s * steps for a, s in zip(base.working, slope.working, strict=True)])


def _with_stand_ins(skeleton: onnx.ModelProto, versions: dict[str, int]) -> tuple[onnx.ModelProto, list[_Costed]]:
    """The skeleton with each node of :data:`STAND_INS` replaced by its stand-ins (when its standard opset has the
    ops they use) and the domains of the nodes left imported (at their ``versions`` in the model): shape inference
    passes over a node it has no schema for, but stops at one whose domain is not imported. And the nodes to cost:
    every node but the free ones and those the reporter costs."""
    graph = skeleton.graph
    opset = next((o.version for o in skeleton.opset_import if o.domain in ("", "ai.onnx")), 0)
    context = StandInGraph(
        {t.name: t for t in graph.initializer},
        {name: node for node in graph.node for name in node.output if name},
        {v.name: v.type.tensor_type.elem_type for v in graph.input},
    )
    inference = copy_without_initializers(skeleton)
    inference.graph.initializer.extend(graph.initializer)
    del inference.graph.node[:]
    # shapes declared by the exporter go: they can be wrong (GenAI's model builder declares its 1-D constants as
    # scalars) and one that contradicts an inferred shape stops the inference downstream
    del inference.graph.value_info[:]
    costed: list[_Costed] = []
    for position, node in enumerate(graph.node):
        key = (_domain(node), node.op_type)
        attributes = {a.name: _attribute_value(a) for a in node.attribute}
        stand_in = STAND_INS.get(key) if opset >= STAND_IN_OPSET else None
        probe = ""
        if stand_in is None:
            inference.graph.node.append(node)
        else:
            builder = StandInNodes(node, f"ndp_ep.stand_in/{position}/")
            try:
                stand_in(builder, attributes, context)
            except _MALFORMED:  # the node stays unsized, and uncosted
                builder.nodes.clear()
                builder.probe = ""
            inference.graph.node.extend(builder.nodes)
            probe = builder.probe
        if key in COSTED_BY_THE_REPORTER or (key[0] == "" and node.op_type in FREE_OPS):
            continue
        formula = CONTRIB_COSTS.get(key) or (None if key[0] == "" else never_costed)
        given = tuple(bool(name) for name in node.input)
        costed.append(_Costed(node, _label(node), formula, attributes, given, probe))
    imported = {o.domain for o in inference.opset_import} | {"", "ai.onnx"}
    for domain in sorted({node.domain for node in inference.graph.node} - imported):
        inference.opset_import.append(helper.make_opsetid(domain, versions.get(domain, 1)))
    return inference, costed


def _domain(node: onnx.NodeProto) -> str:
    return "" if node.domain == "ai.onnx" else node.domain


def _label(node: onnx.NodeProto) -> str:
    """``name (op type)``, the op type with its domain outside the standard one."""
    op = node.op_type if _domain(node) == "" else f"{node.domain}.{node.op_type}"
    return f"{node.name or node.output[0]} ({op})"


def _attribute_value(attribute: onnx.AttributeProto) -> Any:
    value = helper.get_attribute_value(attribute)
    return value.decode() if isinstance(value, bytes) else value


def _copy_header(tensor: onnx.TensorProto, target: onnx.TensorProto) -> None:
    """``tensor`` into ``target`` without its bytes: every field but ``raw_data`` and ``external_data``, with
    ``data_location`` set to inline."""
    copy_fields(tensor, target, _WEIGHT_BYTE_FIELDS)
    target.data_location = TensorProto.DEFAULT
