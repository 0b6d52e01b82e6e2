"""The normalised description of one MoE block that a detection rule hands to the rewriter.

A rule (graph_passes/rules/*.py) looks at an ONNX graph, proves that some nodes compute

    y[t] = sum_k  routing_weights[t, k] * Expert_{expert_ids[t, k]}(hidden[t])      (+ nothing else)

and describes it with an :class:`MoEBlockPlan`: which existing values carry ``hidden``, ``expert_ids`` and
``routing_weights``, which value the block's output replaces, which nodes become dead, and where each
expert's weights live (:class:`ExpertWeights`). The rewriter then emits sharded expert ops from the plan
without knowing which exporter produced the graph. Every plan is built before any mutation.

Expert FFN forms (``activation``):

    gated (silu_glu, swiglu_clamp, gelu_glu)   act = f(x @ Wg + bg, x @ Wu + bu)   y = act @ Wd + bd
    plain (relu, gelu, gelu_tanh, silu)        act = f(x @ W1 + b1)                y = act @ W2 + b2

with ``f`` from :mod:`graph_passes.activations` (the catalog defines each one and its constants).

Precision: ``weight_dtype`` is what the expert matrices hold on disk (``float32``, ``float16``, ``bfloat16``,
or block-quantized ``int8``/``int4`` as :mod:`graph_passes.quant` describes, with ``quant_block_size``); the
rewriter keeps it, the verifier computes in float32 from the dequantized values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graph_passes.activations import ACTIVATIONS, SWIGLU_ALPHA, SWIGLU_BETA, SWIGLU_LIMIT
from graph_passes.sharded_op import LAYOUTS, WEIGHT_DTYPES, ExpertForm


@dataclass(frozen=True)
class StackedMatrix:
    """Where one kind of expert matrix lives: one initializer holding all experts, or one per expert.

    ``layout`` says how to read expert ``e``'s matrix as ``W_e`` with ``x @ W_e`` semantics:
    ``"in_out"``: ``W[e]`` is ``[in, out]``; ``"out_in"``: ``W[e]`` is ``[out, in]`` (PyTorch Linear, needs a
    transpose). ``columns`` selects output columns of the gated pair: ``"all"``, ``"first_half"``,
    ``"second_half"``, ``"even"`` or ``"odd"`` (interleaved gate/up rows as in ``swiglu_fusion=1``).
    ``per_expert`` lists one initializer per expert instead of one stacked initializer (then
    ``initializer`` is empty). A block-quantized matrix (``[E, out, in*bits/8]`` uint8, layout ``out_in``) names
    its ``scales`` ``[E, out, in/block]`` and optional ``zero_points`` initializers.
    """

    initializer: str
    layout: str
    columns: str = "all"
    per_expert: tuple[str, ...] = ()
    scales: str = ""
    zero_points: str = ""

    def __post_init__(self) -> None:
        if self.zero_points and not self.scales:
            raise ValueError("StackedMatrix: zero_points without scales")
        if self.scales and (self.layout != "out_in" or self.per_expert):
            raise ValueError("StackedMatrix: a quantized matrix must be one stacked [E, out, in] initializer")
        if self.layout not in LAYOUTS:
            raise ValueError(f"StackedMatrix.layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.columns not in ("all", "first_half", "second_half", "even", "odd"):
            raise ValueError(f"StackedMatrix.columns: unknown selection {self.columns!r}")
        if bool(self.initializer) == bool(self.per_expert):
            raise ValueError("StackedMatrix needs exactly one of initializer or per_expert")


@dataclass(frozen=True)
class StackedBias:
    """An expert bias: initializer ``[E, out]`` (``columns`` as in :class:`StackedMatrix`)."""

    initializer: str
    columns: str = "all"


@dataclass(frozen=True)
class ExpertWeights:
    """Every matrix of the experts of one block. ``gate`` is None for plain (non-GLU) experts."""

    up: StackedMatrix  # the first projection of a plain FFN (fc1/w1); the "up" half of a GLU
    down: StackedMatrix
    gate: StackedMatrix | None = None
    up_bias: StackedBias | None = None
    gate_bias: StackedBias | None = None
    down_bias: StackedBias | None = None


@dataclass(frozen=True)
class MoEBlockPlan(ExpertForm):
    """One provable MoE block, ready to be rewritten."""

    name: str  # human name, e.g. "model.layers.0.mlp" (from metadata) or "moe0"
    rule: str  # the rule that proved it
    hidden_value: str  # [T, H] (or [..., H]: the rewriter flattens leading dims)
    expert_ids_value: str  # [T, K] integer expert ids
    routing_weights_value: str  # [T, K] weights applied to each selected expert's output
    output_value: str  # the value the block's combined expert output currently has
    num_experts: int
    top_k: int
    hidden: int
    ffn: int
    activation: str
    weights: ExpertWeights
    replaced_nodes: tuple[str, ...]  # nodes computing experts+combine that become dead
    activation_alpha: float = SWIGLU_ALPHA  # swiglu_clamp only
    activation_limit: float = SWIGLU_LIMIT  # swiglu_clamp only
    notes: tuple[str, ...] = field(default_factory=tuple)
    # ONNX nodes to insert before the sharded op that produce expert_ids_value / routing_weights_value when
    # the original graph computed the router inside a fused op (they read only existing values)
    router_nodes: tuple = ()
    activation_beta: float = SWIGLU_BETA  # swiglu_clamp only
    weight_dtype: str = "float32"
    quant_block_size: int = 0  # quantized only: inputs sharing one scale

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.activation!r}")
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"{self.name}: unknown weight_dtype {self.weight_dtype!r}")
        quantized_matrices = [bool(m.scales) for m in (self.weights.up, self.weights.down, self.weights.gate) if m]
        if self.quantized != all(quantized_matrices) or (self.quantized and self.quant_block_size < 1):
            raise ValueError(f"{self.name}: weight_dtype {self.weight_dtype} and the matrices' scales disagree")
        if self.gated != (self.weights.gate is not None):
            raise ValueError(f"{self.name}: activation {self.activation} and gate weights disagree")
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"{self.name}: top_k {self.top_k} not in 1..{self.num_experts}")

    def summary(self, shards: int) -> dict:
        """What the conversion report and the sharded node's ``ndp_ep.block`` metadata say about the block."""
        return {
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "hidden": self.hidden,
            "ffn": self.ffn,
            "shards": shards,
            "activation": self.activation,
            "rule": self.rule,
            "weight_dtype": self.weight_dtype,
            "quant_block_size": self.quant_block_size,
        }


@dataclass(frozen=True)
class BlockRegion:
    """What a rule's trace and check stages established about one candidate block, handed to its plan stage.

    ``nodes`` are the region's node names (the expert computation and the combine, in graph order); the
    values are the block's three inputs and its single output.
    """

    where: str
    nodes: tuple[str, ...]
    hidden_value: str
    expert_ids_value: str
    routing_weights_value: str
    output_value: str
    num_experts: int
    top_k: int
    hidden: int

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError(f"{self.where}: a block region needs nodes")
        if not 0 < self.top_k <= self.num_experts or self.hidden < 1:
            shape = f"top-{self.top_k} of {self.num_experts}, hidden {self.hidden}"
            raise ValueError(f"{self.where}: inconsistent region ({shape})")

    def plan_fields(self) -> dict:
        """The :class:`MoEBlockPlan` fields the region fixes."""
        return {
            "hidden_value": self.hidden_value,
            "expert_ids_value": self.expert_ids_value,
            "routing_weights_value": self.routing_weights_value,
            "output_value": self.output_value,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "hidden": self.hidden,
            "replaced_nodes": self.nodes,
        }


@dataclass(frozen=True)
class Skip:
    """A candidate block a rule found but could not prove equivalent: left untouched, reported."""

    where: str
    reason: str
    nodes: tuple[str, ...] = ()  # nodes of the candidate, so a block another rule claimed is not reported twice

    def __post_init__(self) -> None:
        if not self.reason:
            raise ValueError(f"Skip at {self.where!r} needs a reason")
        object.__setattr__(self, "nodes", tuple(self.nodes))


@dataclass(frozen=True)
class MoECandidate:
    """A block whose data flow is proven but whose expert form has several readings (layouts, activation).

    The verifier keeps the first reading that reproduces the block's output numerically; when none does,
    the block is skipped with the reason.
    """

    readings: tuple[MoEBlockPlan, ...]
    structural_choice: int = 0  # the reading to use when a numeric check is impossible (weights too large)

    def __post_init__(self) -> None:
        if not self.readings:
            raise ValueError("MoECandidate needs at least one reading")
        outputs = {r.output_value for r in self.readings}
        if len(outputs) != 1:
            raise ValueError("all readings of a candidate must replace the same output value")

    @property
    def name(self) -> str:
        return self.readings[0].name

    @property
    def output_value(self) -> str:
        return self.readings[0].output_value
