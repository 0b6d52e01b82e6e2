"""Cost formulas of the ONNX Runtime operators decoders are built from that ONNX does not define (attention, quantized
products, fused norms, rotary embeddings, causal convolutions): integer (FLOPs, bytes moved) of one node from what
:class:`NodeIo` shows of it, float tensors at the costed dtype's bytes (:data:`CONTRIB_COSTS`, read by
:mod:`ndp_ep.costing`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import onnx
from onnx import TensorProto

CONTRIB = "com.microsoft"


LOGICAL_QUANTIZED_TYPES = frozenset(
    getattr(TensorProto, name)
    for name in ("INT4", "UINT4", "INT2", "UINT2", "FLOAT4E2M1", "FLOAT8E4M3FN", "FLOAT8E5M2")
    if hasattr(TensorProto, name)
)


Shape = tuple[int, ...]


class NodeIo(NamedTuple):
    """What a cost formula sees of one node: its attributes, which inputs it has, the shapes (None: unknown or
    absent) of its inputs and outputs, position for position, its inputs' ONNX element types (0: unknown) and the
    shape of its stand-in's probe (a value inference propagated, as a shape), when it has one."""

    attributes: dict[str, Any]
    given: tuple[bool, ...]
    inputs: list[Shape | None]
    outputs: list[Shape | None]
    input_types: list[int]
    probe: Shape | None = None


def _elements(shape: Shape) -> int:
    return math.prod(shape)


def _all_elements(io: NodeIo) -> int:
    """Elements of every sized input and output."""
    return sum(_elements(s) for s in (*io.inputs, *io.outputs) if s is not None)


def _given(io: NodeIo, index: int) -> bool:
    """Whether the node has input ``index`` (sized or not)."""
    return index < len(io.given) and io.given[index]


def _norm_work(io: NodeIo, dtype_bytes: int, per_element: int) -> tuple[int, int] | None:
    """A norm doing ``per_element`` operations per input element, reading its inputs and writing its outputs."""
    x = io.inputs[0]
    if x is None or io.outputs[0] is None:
        return None
    return per_element * _elements(x), _all_elements(io) * dtype_bytes


# per element, an RMS norm squares and sums (2) and scales by 1/rms (1) and by gamma (1); a LayerNorm also takes the
# mean (1), centers (1) and adds beta (1, when given); a Skip norm first adds the skip (1) and the bias (1, when given)
def _rms_norm_cost(io: NodeIo, dtype_bytes: int) -> tuple[int, int] | None:
    return _norm_work(io, dtype_bytes, 4)


def _skip_rms_norm_cost(io: NodeIo, dtype_bytes: int) -> tuple[int, int] | None:
    return _norm_work(io, dtype_bytes, 4 + 1 + _given(io, 3))


def _skip_layer_norm_cost(io: NodeIo, dtype_bytes: int) -> tuple[int, int] | None:
    return _norm_work(io, dtype_bytes, 4 + 2 + _given(io, 3) + 1 + _given(io, 4))


def _rotary_cost(io: NodeIo, dtype_bytes: int) -> tuple[int, int] | None:
    """Each rotated element: two products and a sum (3); reads the input, the position ids and each token's cos and
    sin rows, writes the output."""
    x, positions = io.inputs[0], io.inputs[1]
    cos = io.inputs[2] if len(io.inputs) > 2 else None
    if x is None or cos is None or positions is None:
        return None
    heads = int(io.attributes.get("num_heads", 0)) or 1
    tokens, head_size = (x[0] * x[2], x[3]) if len(x) == 4 else (_elements(x[:-1]), x[-1] // heads)
    rotated = _elements(x) // head_size * (int(io.attributes.get("rotary_embedding_dim", 0)) or head_size)
    moved = (2 * _elements(x) + 2 * tokens * cos[-1]) * dtype_bytes
    moved += _elements(positions) * element_bytes(io.input_types[1])
    return 3 * rotated, moved


def _attended_pairs(queries: int, past: int, window: int | None) -> int:
    """(query, key) pairs a causal attention scores: query ``s`` (at position ``past + s``) attends the
    ``min(past + s + 1, window)`` keys up to its own (all of them when ``window`` is None)."""
    first = past + 1
    uncapped = queries if window is None else min(max(window - first + 1, 0), queries)
    return uncapped * first + uncapped * (uncapped - 1) // 2 + (queries - uncapped) * (window or 0)


def _gqa_cost(io: NodeIo, dtype_bytes: int) -> tuple[int, int] | None:
    """QK^T and AV over the keys each query attends (causal; the last ``local_window_size`` keys, its own
    included, when set): 4 * batch * num_heads * head_size FLOPs a (query, key) pair. Reads the query, key and
    value inputs and the past keys and values the queries attend, writes the output and the new keys and values
    into the cache. The past length is the total sequence length (the probe) less the new tokens; without the
    probe, the past cache's length (a shared buffer's or a window cache's capacity: an upper bound)."""
    query, output = io.inputs[0], io.outputs[0]
    past = io.inputs[3] if _given(io, 3) else None
    if query is None or output is None or (io.probe is None and _given(io, 3) and past is None):
        return None
    heads, kv_heads = int(io.attributes["num_heads"]), int(io.attributes["kv_num_heads"])
    batch, queries = query[0], query[1]
    head_size = output[2] // heads
    past_length = past[2] if past is not None else 0
    if io.probe is not None:
        past_length = max(io.probe[0] - queries, 0)
    window = int(io.attributes.get("local_window_size", -1))
    if not int(io.attributes.get("causal", 1)):
        pairs = queries * (past_length + queries)
    else:
        pairs = _attended_pairs(queries, past_length, window if window > 0 else None)
    past_read = min(past_length, window - 1) if window > 0 else past_length
    new = sum(_elements(s) for s in io.inputs[:3] if s is not None) + _elements(output)
    cache = 2 * batch * kv_heads * head_size * (past_read + queries)
    return 4 * batch * heads * head_size * pairs, (new + cache) * dtype_bytes


def _matmul_nbits_cost(io: NodeIo, dtype_bytes: int) -> tuple[int, int] | None:
    """``[M, K] x [K, N]``: 2 * M * K * N FLOPs; reads A, the packed weights as stored (N * k_blocks *
    block_size * bits / 8 bytes), the scales, zero points (packed uint8, or like the scales) and bias; writes Y."""
    a = io.inputs[0]
    if a is None:
        return None
    k, n = int(io.attributes["K"]), int(io.attributes["N"])
    bits, block = int(io.attributes.get("bits", 4)), int(io.attributes["block_size"])
    rows = _elements(a) // k
    blocks = -(-k // block)
    moved = (rows * k + rows * n + n * blocks) * dtype_bytes + n * blocks * block * bits // 8
    if _given(io, 3):
        packed = io.input_types[3] == TensorProto.UINT8
        moved += n * (-(-blocks * bits // 8)) if packed else n * blocks * dtype_bytes
    if _given(io, 5):
        moved += n * dtype_bytes
    return 2 * rows * k * n, moved


def _gather_block_quantized_cost(io: NodeIo, dtype_bytes: int) -> tuple[int, int] | None:
    """Dequantizes each gathered element (subtract the zero point, scale: 2); reads the gathered packed values,
    their blocks' scales (and zero points) and the indices, writes the output."""
    output, indices = io.outputs[0], io.inputs[1]
    if output is None or indices is None:
        return None
    elements = _elements(output)
    bits = int(io.attributes.get("bits", 4))
    blocks = elements // (int(io.attributes.get("block_size", 128)) or output[-1])
    moved = -(-elements * bits // 8) + (blocks + elements) * dtype_bytes
    moved += _elements(indices) * element_bytes(io.input_types[1])
    if _given(io, 3):
        moved += -(-blocks * bits // 8)
    return 2 * elements, moved


_ACTIVATION_FLOPS = {"silu": 4, "swish": 4}  # x * sigmoid(x): exp, add, divide, multiply


def _causal_conv_cost(io: NodeIo, dtype_bytes: int) -> tuple[int, int] | None:
    """Depthwise: 2 FLOPs per output element a kernel tap, plus the bias and the activation per output element;
    reads its inputs (the past state too), writes the output and the present state."""
    output, weight = io.outputs[0], io.inputs[1]
    if output is None or weight is None:
        return None
    per_element = 2 * _elements(weight[2:]) + _given(io, 2)
    per_element += _ACTIVATION_FLOPS.get(str(io.attributes.get("activation", "none")), 0)
    return per_element * _elements(output), _all_elements(io) * dtype_bytes


CostFormula = Callable[[NodeIo, int], "tuple[int, int] | None"]  # (FLOPs, bytes) of a node at a dtype


CONTRIB_COSTS: dict[tuple[str, str], CostFormula] = {
    ("", "SimplifiedLayerNormalization"): _rms_norm_cost,
    (CONTRIB, "SkipSimplifiedLayerNormalization"): _skip_rms_norm_cost,
    (CONTRIB, "SkipLayerNormalization"): _skip_layer_norm_cost,
    (CONTRIB, "RotaryEmbedding"): _rotary_cost,
    (CONTRIB, "MatMulNBits"): _matmul_nbits_cost,
    (CONTRIB, "GroupQueryAttention"): _gqa_cost,
    (CONTRIB, "GatherBlockQuantized"): _gather_block_quantized_cost,
    (CONTRIB, "CausalConvWithState"): _causal_conv_cost,
}


def never_costed(io: NodeIo, dtype_bytes: int) -> None:
    """An op of another domain without a formula: not costed."""
    return None


def element_bytes(elem_type: int) -> int:
    """Bytes of one element of an ONNX tensor type (1 for the sub-byte and unknown types: a lower bound)."""
    try:
        return max(1, onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize)
    except (KeyError, TypeError, ValueError):
        return 1
