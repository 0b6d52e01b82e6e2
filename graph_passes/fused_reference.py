"""A float64 reading of ONNX Runtime's fused ``com.microsoft.MoE`` / ``QMoE`` from the op schema's documented
semantics, for the nodes stock ONNX Runtime's CPU kernels refuse to run.

Gemma-4 MoE, as ONNX Runtime GenAI's builder exports it, uses ``activation_type="geglu"``, which onnxruntime 1.32
implements on CUDA only: its CPU kernels fail at session creation ("Unsupported MoE activation type: geglu"). A
block the converter cannot run through ONNX Runtime is proven against :func:`evaluate` instead (see
:mod:`graph_passes.verify`). The semantics, from the onnxruntime 1.32 op schema (``MoE`` / ``QMoE`` doc and
attributes) and its CPU kernels (routing, dequantization)::

    p = softmax(router_logits[t]);  experts = top-k of p (largest first);  w = p[experts]
    normalize_routing_weights=1:  w = w / sum(w)
    y[t] = sum_e w_e * (fc2[e] @ act(fc1[e] @ x[t] + fc1_bias[e]) + fc2_bias[e])
    QMoE: fc[e][r, c] = (q[r, c] - zero_point[r, c // block]) * scale[r, c // block]  (zero point 2**(bits-1)
          when absent, the last block partial when block does not divide the input width)

    relu, silu, identity: elementwise;  gelu: 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3)))
    swiglu / geglu: fc1 gives 2 * inter_size rows, gate g and up l interleaved (swiglu_fusion=1: g0, l0, g1, l1,
    ...) or concatenated (2: [g | l]);
      swiglu: G = min(g, limit);  L = clip(l, -limit, limit);  G * sigmoid(alpha G) * (L + beta)
      geglu:  gelu(g) * l   (gelu as above; activation_alpha, activation_beta and swiglu_limit do not apply)

Everything is computed in float64 from the stored bytes, independently of :mod:`graph_passes.expert_math` (the
readings being proven): only :func:`graph_passes.quant.unpack` (nibble order) is shared.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

from graph_passes import quant

MS_DOMAIN = "com.microsoft"
# activation types the onnxruntime 1.32 op schema documents for CUDA only: its CPU kernels refuse the node
CPU_REFUSED_ACTIVATIONS = ("geglu",)

# x, router_probs, fc1, fc1_scales, fc1_bias, fc2, fc2_scales, fc2_bias, fc3..., fc1_zero_points, fc2_zero_points
_QMOE_INPUTS = {"fc1": 2, "fc1_scales": 3, "fc1_bias": 4, "fc2": 5, "fc2_scales": 6, "fc2_bias": 7, "fc3": 8}
_QMOE_INPUTS |= {"fc1_zero_points": 11, "fc2_zero_points": 12}
_MOE_INPUTS = {"fc1": 2, "fc1_bias": 3, "fc2": 4, "fc2_bias": 5, "fc3": 6}


class FusedReferenceError(ValueError):
    """The node uses something this reading does not define (the message says what)."""


def needs_reference(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is a fused MoE / QMoE that stock ONNX Runtime's CPU kernels refuse to run."""
    if node.domain != MS_DOMAIN or node.op_type not in ("MoE", "QMoE"):
        return False
    return _attrs(node).get("activation_type", "relu") in CPU_REFUSED_ACTIVATIONS


def _attrs(node: onnx.NodeProto) -> dict:
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}


def _gelu_tanh(h: np.ndarray) -> np.ndarray:
    return 0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3)))


def _activate(h: np.ndarray, attrs: dict) -> np.ndarray:
    """The activation of ``h`` ``[tokens, fc1 rows]`` per the node's attributes."""
    kind = attrs.get("activation_type", "relu")
    if kind in ("swiglu", "geglu"):
        fusion = int(attrs.get("swiglu_fusion", 0))
        if fusion == 1:
            gate, up = h[:, 0::2], h[:, 1::2]
        elif fusion == 2:
            gate, up = np.split(h, 2, axis=1)
        else:
            raise FusedReferenceError(f"{kind} with swiglu_fusion={fusion} needs an fc3 input, which is not read here")
        if kind == "geglu":
            return _gelu_tanh(gate) * up
        limit = float(attrs.get("swiglu_limit", math.inf))
        alpha, beta = float(attrs.get("activation_alpha", 1.0)), float(attrs.get("activation_beta", 0.0))
        gate, up = np.minimum(gate, limit), np.clip(up, -limit, limit)
        with np.errstate(over="ignore"):  # exp overflows to inf for a very negative gate: the limit 0 is right
            return gate / (1.0 + np.exp(-alpha * gate)) * (up + beta)
    plain = {
        "relu": lambda v: np.maximum(v, 0.0),
        "gelu": _gelu_tanh,
        "silu": lambda v: v * (0.5 * (1.0 + np.tanh(0.5 * v))),  # the logistic function without overflow
        "identity": lambda v: v,
    }
    if kind not in plain:
        raise FusedReferenceError(f"activation_type={kind!r} is not defined by the op schema read here")
    return plain[kind](h)


def _matrix(values: Callable[[str], np.ndarray | None], name: str, e: int, cols: int, attrs: dict, quantized: bool):
    """Expert ``e``'s ``name`` matrix ``[rows, cols]`` in float64 (dequantized for QMoE)."""
    stored = values(name)
    if not quantized:
        return np.asarray(stored[e], dtype=np.float64)
    bits, block = int(attrs.get("expert_weight_bits", 4)), int(attrs.get("block_size", 0))
    q = quant.unpack(stored[e], bits, cols).astype(np.float64)
    scales = np.asarray(values(f"{name}_scales")[e], dtype=np.float64).reshape(q.shape[0], -1)
    block_of = np.arange(cols) // block if block else np.zeros(cols, np.int64)
    zero_points = values(f"{name}_zero_points")
    if zero_points is None:
        zp = np.full(scales.shape, float(2 ** (bits - 1)))
    elif block:
        zp = quant.unpack(zero_points[e], bits, scales.shape[1]).astype(np.float64)
    else:
        raise FusedReferenceError("per-row (block_size=0) zero points are not read here")
    return (q - zp[:, block_of]) * scales[:, block_of]


def evaluate(node: onnx.NodeProto, values: Callable[[str], np.ndarray | None]) -> np.ndarray:
    """The node's output in float64. ``values(input_name)`` returns an input's array by its label (``x``,
    ``router_probs``, ``fc1``, ``fc1_scales``, ``fc1_zero_points``, ...) or None when the node leaves it out."""
    attrs = _attrs(node)
    quantized = node.op_type == "QMoE"
    if int(attrs.get("use_sparse_mixer", 0)) or int(attrs.get("swiglu_limit_after_activation", 0)):
        raise FusedReferenceError("use_sparse_mixer / swiglu_limit_after_activation are not read here")
    if quantized and (attrs.get("quant_type", "int") != "int" or int(attrs.get("weights_prepacked", 0))):
        raise FusedReferenceError("only int quantization in the CPU layout is read here")
    if values("fc3") is not None:
        raise FusedReferenceError("fc3 inputs are not read here")
    x = np.asarray(values("x"), dtype=np.float64)
    hidden = x.shape[-1]
    x = x.reshape(-1, hidden)
    logits = np.asarray(values("router_probs"), dtype=np.float64).reshape(x.shape[0], -1)
    top_k = int(attrs.get("k", 1))
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    chosen = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(probs, chosen, axis=1)
    if int(attrs.get("normalize_routing_weights", 0)):
        weights /= weights.sum(axis=1, keepdims=True)
    fc1_bias, fc2_bias = values("fc1_bias"), values("fc2_bias")
    out = np.zeros_like(x)
    for e in np.unique(chosen):
        rows, slots = np.nonzero(chosen == e)
        w1 = _matrix(values, "fc1", int(e), hidden, attrs, quantized)
        h = x[rows] @ w1.T + (0.0 if fc1_bias is None else np.asarray(fc1_bias[e], dtype=np.float64))
        act = _activate(h, attrs)
        w2 = _matrix(values, "fc2", int(e), act.shape[1], attrs, quantized)
        y = act @ w2.T + (0.0 if fc2_bias is None else np.asarray(fc2_bias[e], dtype=np.float64))
        np.add.at(out, rows, weights[rows, slots][:, None] * y)
    return out.reshape(np.asarray(values("x")).shape)


def input_labels(node: onnx.NodeProto) -> dict[str, str]:
    """``label -> input name`` of a fused node's present inputs (the labels :func:`evaluate` asks for)."""
    positions = {"x": 0, "router_probs": 1, **(_QMOE_INPUTS if node.op_type == "QMoE" else _MOE_INPUTS)}
    return {label: node.input[p] for label, p in positions.items() if p < len(node.input) and node.input[p]}
