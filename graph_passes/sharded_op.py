"""The ``ndp_ep::ShardedMoEExperts`` operator contract: the one place that builds and parses the node.

Everything that writes or reads a sharded expert node — the rewriter, the provider's claim step and native
kernels (``native/``, which mirror this docstring in C++), the report's costing and the graph diff — goes
through this module. Nothing else spells the domain, the op type, the attribute names, the metadata keys or
the shard names.

Node
----
Domain ``ndp_ep`` (opset 1), op type ``ShardedMoEExperts``. One node computes, for a block of ``E`` experts
with hidden width ``H``, FFN width ``I`` and ``S`` tensor-parallel shards::

    y[t] = sum_k routing_weights[t, k] * sum_s  Down_{e,s}( act( First_{e,s}(x[t]) ) ),  e = expert_ids[t, k]

Inputs, in order:

    0  hidden           [..., H]  T (float32 | float16 | bfloat16); leading dims are flattened to tokens
    1  expert_ids       [tokens, K] int64 or int32
    2  routing_weights  [tokens, K] T or float32
    3… weight groups, each listed expert-major then shard (``e * S + s``), in this order:
       first             E*S   float, first_layout in_out: [H, F/S]  gate columns of shard s then up columns
                               (F = 2I gated, I plain); first_layout out_in: [F/S, H], gate rows then up rows
                               quantized: [F/S, H*bits/8] uint8, rows = output features (gate rows then up rows),
                               the input dim packed along the last axis, low nibble first for 4 bits
       down              E*S   float, down_layout in_out: [I/S, H]  rows s*I/S..(s+1)*I/S of the down projection
                               (x @ W); down_layout out_in: [H, I/S], columns s*I/S.. of the [H, I] matrix
                               quantized: [H, (I/S)*bits/8] uint8, rows = output features
       first_scales      E*S   quantized only: [F/S, ceil(H/block)]  T (or float32)
       down_scales       E*S   quantized only: [H, ceil((I/S)/block)] T (or float32)
       first_zero_points E*S   quantized with zero points: uint8 [F/S, ceil(ceil(H/block)*bits/8)] (packed like
                               weights)
       down_zero_points  E*S   quantized with zero points: uint8 [H, ceil(ceil((I/S)/block)*bits/8)]
       first_bias        E*S   has_first_bias only: [F/S] (gate part then up part), dtype of the source bias
       down_bias         E     has_down_bias only: [H] (added once per expert, not per shard)

Output 0: ``[..., H]`` of the hidden state's dtype (and shape).

A quantized value dequantizes as ``(q - zero_point) * scale`` with ``q`` unsigned; without a zero-point
tensor the zero point is ``2**(bits-1)`` (8 for int4, 128 for int8), as ONNX Runtime's ``com.microsoft.QMoE``
does. ``quant_block_size`` is the number of consecutive input elements sharing one scale; a per-channel
quantized source is written with ``quant_block_size`` equal to the shard's input width. ``H`` need not be a
multiple of the block (the last block of a row is then partial, as ONNX Runtime's QMoE allows); the shard width
must be, unless there is one shard. The provider multiplies
quantized shards as the ONNX Runtime it runs in multiplies ``QMoE`` experts, so a converted model gives what
stock ONNX Runtime gives on the original: from onnxruntime 1.31 that means activations quantized to int8 per
block for 8-bit weights (4-bit too under ``ORT_QMOE_CPU_QNBIT_GEMM=int8``) of every projection whose input
width is a whole number of blocks, the others in float, see native/src/moe_kernel.h
(``QuantComputeFor``) and docs/genai.md.

Attributes (:data:`ATTRIBUTES` lists them with their types): ``layer``, ``num_experts``, ``top_k``, ``hidden``,
``ffn`` (I), ``shards`` (S), ``activation`` (a name in :mod:`graph_passes.activations`' catalog),
``activation_alpha``, ``activation_limit``, ``activation_beta`` (``swiglu_clamp`` only:
``g = min(gate, limit); u = clip(up, -limit, limit); act = (u + beta) * g * sigmoid(alpha * g)``, beta absent
means 1), ``has_first_bias``, ``has_down_bias``,
``weight_dtype`` (``float32``, ``float16``, ``bfloat16``, ``int8``, ``int4``; absent means ``float32``),
``quant_block_size`` (quantized only), ``has_zero_points`` (quantized only), ``first_layout`` and
``down_layout`` (float only: ``in_out``, the ``x @ W`` form, or ``out_in``, its transpose; absent means
``in_out``, the only layout of models converted before the attributes existed).

Float layouts follow the source model, so converting never transposes a matrix: a source stored ``[out, in]``
(PyTorch ``Linear`` weights, the dynamo ``[E, 2I, H]`` / ``[E, H, I]`` stacks) gives ``out_in`` shards, whose
first shard is two row blocks of the source and whose down shard is a column block; a source stored
``[in, out]`` gives ``in_out`` shards. The two projections choose independently (their sources may differ);
gate and up share ``first_layout``, taken from the up projection (a gate stored the other way round, which no
known exporter does, is transposed while it is copied). Quantized shards have one layout, rows = output features.

Metadata (node ``metadata_props``): ``ndp_ep.replaced_nodes`` (JSON list of the original node names),
``ndp_ep.block`` (JSON summary of the block, :meth:`MoEBlockPlan.summary`), ``ndp_ep.placement`` (JSON,
written by the claim step: shard → NDP unit and the per-invocation GPU/NDP choice).

Weight names: ``{block}.experts.{e}.shard{s}.{kind}`` with ``kind`` one of ``gate_up`` (``up`` for plain
experts), ``down``, ``gate_up_scales`` …, and ``{block}.experts.{e}.down_bias``.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from graph_passes.activations import ACTIVATIONS, GATED_ACTIVATIONS, SWIGLU_ALPHA, SWIGLU_BETA, SWIGLU_LIMIT

DOMAIN = "ndp_ep"
OPSET = 1
OP_TYPE = "ShardedMoEExperts"
NODE_SUFFIX = "/" + OP_TYPE

META_REPLACED_NODES = "ndp_ep.replaced_nodes"
META_BLOCK = "ndp_ep.block"
META_PLACEMENT = "ndp_ep.placement"
# Model-level metadata naming what a model needs to run, for tools that open it without the provider.
MODEL_META_REQUIRES = "ndp_ep.requires"
REQUIRES_TEXT = (
    "ndp-ep: register the NdpExecutionProvider plugin (pip install ndp-ep; ndp_ep.register()) to run this model"
)

FLOAT_WEIGHT_DTYPES = ("float32", "float16", "bfloat16")
QUANTIZED_WEIGHT_DTYPES = ("int8", "int4")
WEIGHT_DTYPES = FLOAT_WEIGHT_DTYPES + QUANTIZED_WEIGHT_DTYPES
QUANT_BITS = {"int8": 8, "int4": 4}
# float matrix layouts: "in_out" is x @ W ([in, out]), "out_in" its transpose ([out, in], PyTorch Linear)
LAYOUTS = ("in_out", "out_in")
DEFAULT_LAYOUT = "in_out"
# onnx.TensorProto data types of float weights (FLOAT, FLOAT16, BFLOAT16) and their weight_dtype names
FLOAT_WEIGHT_DTYPE_OF_ONNX = {1: "float32", 10: "float16", 16: "bfloat16"}

ATTRIBUTES: dict[str, type] = {
    "layer": str,
    "num_experts": int,
    "top_k": int,
    "hidden": int,
    "ffn": int,
    "shards": int,
    "activation": str,
    "activation_alpha": float,
    "activation_limit": float,
    "activation_beta": float,
    "has_first_bias": int,
    "has_down_bias": int,
    "weight_dtype": str,
    "quant_block_size": int,
    "has_zero_points": int,
    "first_layout": str,
    "down_layout": str,
}


class ShardedOpError(ValueError):
    """A node claims to be a sharded expert op but breaks the contract (tampered attributes or inputs)."""


class ExpertForm:
    """What an ``activation`` and a ``weight_dtype`` say about the experts (a block plan's, a node's)."""

    activation: str
    weight_dtype: str

    @property
    def gated(self) -> bool:
        return self.activation in GATED_ACTIVATIONS

    @property
    def quantized(self) -> bool:
        return self.weight_dtype in QUANTIZED_WEIGHT_DTYPES

    @property
    def bits(self) -> int:
        return QUANT_BITS.get(self.weight_dtype, 0)


@dataclass(frozen=True)
class ShardedOpSpec(ExpertForm):
    """The attributes of one sharded expert node, validated."""

    layer: str
    num_experts: int
    top_k: int
    hidden: int
    ffn: int
    shards: int
    activation: str
    activation_alpha: float = SWIGLU_ALPHA
    activation_limit: float = SWIGLU_LIMIT
    activation_beta: float = SWIGLU_BETA
    has_first_bias: bool = False
    has_down_bias: bool = False
    weight_dtype: str = "float32"
    quant_block_size: int = 0
    has_zero_points: bool = False
    first_layout: str = DEFAULT_LAYOUT
    down_layout: str = DEFAULT_LAYOUT

    def __post_init__(self) -> None:
        for field_name in ("activation_alpha", "activation_limit", "activation_beta"):
            # ONNX float attributes are float32: hold what the node will hold, so build and parse agree
            value = getattr(self, field_name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ShardedOpError(f"{self.layer}: attribute {field_name} must be a number, got {value!r}")
            object.__setattr__(self, field_name, struct.unpack("f", struct.pack("f", float(value)))[0])
        for field_name in ("num_experts", "top_k", "hidden", "ffn", "shards"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or value < 1:
                raise ShardedOpError(f"{self.layer}: attribute {field_name} must be a positive integer, got {value!r}")
        if self.top_k > self.num_experts:
            raise ShardedOpError(f"{self.layer}: top_k {self.top_k} exceeds num_experts {self.num_experts}")
        if self.ffn % self.shards:
            raise ShardedOpError(f"{self.layer}: ffn {self.ffn} is not divisible by {self.shards} shards")
        if self.activation not in ACTIVATIONS:
            raise ShardedOpError(f"{self.layer}: unknown activation {self.activation!r}")
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise ShardedOpError(f"{self.layer}: unknown weight_dtype {self.weight_dtype!r}")
        if self.quantized:
            block = self.quant_block_size
            if block < 1 or (self.shards > 1 and self.shard_width % block):
                raise ShardedOpError(
                    f"{self.layer}: quant_block_size {block} must be positive and divide the shard width "
                    f"{self.shard_width} of {self.shards} shards"
                )
            if QUANT_BITS[self.weight_dtype] == 4 and (self.hidden % 2 or self.shard_width % 2):
                raise ShardedOpError(
                    f"{self.layer}: int4 weights pack two values per byte: hidden {self.hidden} and the shard width "
                    f"{self.shard_width} must be even"
                )
        elif self.quant_block_size or self.has_zero_points:
            raise ShardedOpError(f"{self.layer}: quantization attributes on {self.weight_dtype} weights")
        for field_name in ("first_layout", "down_layout"):
            layout = getattr(self, field_name)
            if layout not in LAYOUTS:
                raise ShardedOpError(f"{self.layer}: {field_name} must be one of {', '.join(LAYOUTS)}, got {layout!r}")
            if self.quantized and layout != DEFAULT_LAYOUT:
                raise ShardedOpError(f"{self.layer}: {field_name} on {self.weight_dtype} weights (float only)")

    @property
    def shard_width(self) -> int:
        """I/S: the FFN columns one shard computes."""
        return self.ffn // self.shards

    @property
    def first_width(self) -> int:
        """F/S: the first projection's outputs one shard computes (gate then up for gated experts)."""
        return (2 if self.gated else 1) * self.shard_width

    def float_shape(self, group: str) -> tuple[int, ...]:
        """The shape of one float weight of ``group`` (``first``, ``down``, ``first_bias``, ``down_bias``)."""
        shapes = {
            "first": (self.hidden, self.first_width),
            "down": (self.shard_width, self.hidden),
            "first_bias": (self.first_width,),
            "down_bias": (self.hidden,),
        }
        shape = shapes[group]
        layout = {"first": self.first_layout, "down": self.down_layout}.get(group, DEFAULT_LAYOUT)
        return shape[::-1] if layout == "out_in" else shape

    @property
    def first_kind(self) -> str:
        return "gate_up" if self.gated else "up"

    def input_groups(self) -> list[tuple[str, int]]:
        """``(group, count)`` for the weight inputs after the three activations, in input order."""
        per_shard = self.num_experts * self.shards
        groups = [("first", per_shard), ("down", per_shard)]
        if self.quantized:
            groups += [("first_scales", per_shard), ("down_scales", per_shard)]
            if self.has_zero_points:
                groups += [("first_zero_points", per_shard), ("down_zero_points", per_shard)]
        if self.has_first_bias:
            groups.append(("first_bias", per_shard))
        if self.has_down_bias:
            groups.append(("down_bias", self.num_experts))
        return groups

    def weight_names(self, block: str | None = None) -> list[str]:
        """Every weight input's name, in input order, for a block named ``block`` (default: ``layer``)."""
        block = self.layer if block is None else block
        names: list[str] = []
        for group, _count in self.input_groups():
            if group == "down_bias":
                names += [f"{block}.experts.{e}.down_bias" for e in range(self.num_experts)]
                continue
            kind = _group_kind(group, self.first_kind)
            names += [
                f"{block}.experts.{e}.shard{s}.{kind}" for e in range(self.num_experts) for s in range(self.shards)
            ]
        return names

    def split_inputs(self, weight_inputs: Sequence[str]) -> dict[str, list[str]]:
        """The node's weight inputs (``node.input[3:]``) grouped by :meth:`input_groups`."""
        expected = sum(count for _, count in self.input_groups())
        if len(weight_inputs) != expected:
            raise ShardedOpError(f"{self.layer}: expected {expected} weight inputs, found {len(weight_inputs)}")
        out: dict[str, list[str]] = {}
        position = 0
        for group, count in self.input_groups():
            out[group] = list(weight_inputs[position : position + count])
            position += count
        return out

    def attributes(self) -> dict[str, object]:
        """Keyword arguments for ``onnx.helper.make_node`` (quantization attributes only when quantized, layouts
        only when not ``in_out``)."""
        attrs: dict[str, object] = {
            "layer": self.layer,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "hidden": self.hidden,
            "ffn": self.ffn,
            "shards": self.shards,
            "activation": self.activation,
            "activation_alpha": float(self.activation_alpha),
            "activation_limit": float(self.activation_limit),
            "has_first_bias": int(self.has_first_bias),
            "has_down_bias": int(self.has_down_bias),
            "weight_dtype": self.weight_dtype,
        }
        if self.activation_beta != SWIGLU_BETA:
            attrs["activation_beta"] = float(self.activation_beta)
        if self.quantized:
            attrs["quant_block_size"] = self.quant_block_size
            attrs["has_zero_points"] = int(self.has_zero_points)
        for field_name in ("first_layout", "down_layout"):  # written when not the default, as old models are
            if getattr(self, field_name) != DEFAULT_LAYOUT:
                attrs[field_name] = getattr(self, field_name)
        return attrs


def _group_kind(group: str, first_kind: str) -> str:
    return group.replace("first", first_kind, 1) if group.startswith("first") else group


_SHARD_NAME = re.compile(r"^(?P<block>.+)\.experts\.(?P<expert>\d+)\.shard(?P<shard>\d+)\.(?P<kind>[a-z_]+)$")
_DOWN_BIAS_NAME = re.compile(r"^(?P<block>.+)\.experts\.(?P<expert>\d+)\.down_bias$")


class ShardName(NamedTuple):
    """A parsed weight name: ``shard`` is None for the per-expert down bias (a named tuple, defined at a fraction of
    a frozen dataclass's import cost)."""

    block: str
    expert: int
    shard: int | None
    kind: str


def parse_shard_name(name: str) -> ShardName | None:
    """Split a sharded weight's name into its parts, or None when ``name`` is not one."""
    match = _SHARD_NAME.match(name)
    if match:
        return ShardName(match["block"], int(match["expert"]), int(match["shard"]), match["kind"])
    match = _DOWN_BIAS_NAME.match(name)
    if match:
        return ShardName(match["block"], int(match["expert"]), None, "down_bias")
    return None


def is_sharded_node(node) -> bool:
    """True for an ``onnx.NodeProto`` (or anything with ``domain``/``op_type``) of this op."""
    return node.domain == DOMAIN and node.op_type == OP_TYPE


def node_name(block: str) -> str:
    return block + NODE_SUFFIX


def block_of_node_name(name: str) -> str | None:
    return name[: -len(NODE_SUFFIX)] if name.endswith(NODE_SUFFIX) else None


def parse_node(node) -> ShardedOpSpec:
    """The validated spec of an ``onnx.NodeProto`` of this op; :class:`ShardedOpError` names what is wrong."""
    from onnx import helper

    if not is_sharded_node(node):
        raise ShardedOpError(f"{node.name}: not a {DOMAIN}::{OP_TYPE} node")
    values: dict[str, object] = {}
    for attribute in node.attribute:
        if attribute.name not in ATTRIBUTES:
            raise ShardedOpError(f"{node.name}: unknown attribute {attribute.name!r}")
        value = helper.get_attribute_value(attribute)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        expected = ATTRIBUTES[attribute.name]
        if expected is float and isinstance(value, int):
            value = float(value)
        if not isinstance(value, expected):
            raise ShardedOpError(f"{node.name}: attribute {attribute.name} must be {expected.__name__}")
        values[attribute.name] = value
    missing = [n for n in ("layer", "num_experts", "top_k", "hidden", "ffn", "shards", "activation") if n not in values]
    if missing:
        raise ShardedOpError(f"{node.name}: missing attribute(s) {', '.join(missing)}")
    for flag in ("has_first_bias", "has_down_bias", "has_zero_points"):
        if flag in values:
            if values[flag] not in (0, 1):
                raise ShardedOpError(f"{node.name}: attribute {flag} must be 0 or 1")
            values[flag] = bool(values[flag])
    spec = ShardedOpSpec(**values)  # type: ignore[arg-type]
    if len(node.input) < 3 or len(node.output) != 1:
        raise ShardedOpError(f"{node.name}: needs hidden, expert_ids, routing_weights inputs and one output")
    spec.split_inputs(list(node.input[3:]))
    return spec


def make_node(
    spec: ShardedOpSpec,
    hidden: str,
    expert_ids: str,
    routing_weights: str,
    output: str,
    weight_inputs: Sequence[str],
    *,
    block: str | None = None,
    replaced_nodes: Iterable[str] = (),
    summary: dict | None = None,
):
    """An ``onnx.NodeProto`` of this op with its metadata (``weight_inputs`` as :meth:`ShardedOpSpec.weight_names`)."""
    from onnx import helper

    spec.split_inputs(list(weight_inputs))
    block = spec.layer if block is None else block
    node = helper.make_node(
        OP_TYPE,
        [hidden, expert_ids, routing_weights, *weight_inputs],
        [output],
        name=node_name(block),
        domain=DOMAIN,
        **spec.attributes(),
    )
    set_metadata(node, META_REPLACED_NODES, list(replaced_nodes))
    if summary is not None:
        set_metadata(node, META_BLOCK, summary)
    return node


def model_metadata() -> dict[str, str]:
    """The model-level ``metadata_props`` every converted model carries."""
    return {MODEL_META_REQUIRES: REQUIRES_TEXT}


def set_metadata(node, key: str, value) -> None:
    """Set (or replace) one JSON metadata entry on a node."""
    for entry in node.metadata_props:
        if entry.key == key:
            entry.value = json.dumps(value)
            return
    entry = node.metadata_props.add()
    entry.key, entry.value = key, json.dumps(value)


def get_metadata(node, key: str, default=None):
    """One JSON metadata entry of a node (``default`` when absent or not valid JSON)."""
    for entry in node.metadata_props:
        if entry.key == key:
            try:
                return json.loads(entry.value)
            except ValueError:
                return default
    return default
