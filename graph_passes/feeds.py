"""Random input feeds from a model's input signature (used by ``ndp-ep run`` without ``--inputs``).

Symbolic dimensions get small sizes (batch-like names 1, everything else ``seq_len``). Integer inputs that
index an embedding table are drawn below the table's row count; masks are ones; position ids count up.

KV-cache decoders (ONNX Runtime GenAI model builder outputs) get *valid* feeds: the first step of generation
with an empty past. Past key/value caches ``past_key_values.N.key/value`` have length 0 (sliding-window
caches, whose attention refuses a capacity below the window, are allocated at their window and masked out),
their head dimension comes from ``genai_config.json`` beside the model (``decoder.head_size``) or from the
attention node's attributes, the attention mask covers the past plus the new tokens, conv states
(``past.N.conv``) are zeros and token ids stay below the vocabulary size.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from graph_passes.errors import GraphPassError
from ndp_io import available_memory_bytes

BATCH_DIM_NAMES = ("batch", "batch_size", "n", "b")
GENAI_CONFIG = "genai_config.json"
PAST_LENGTH_DIMS = ("past_sequence_length", "past_seq_len", "past_length")
SLIDING_DIMS = ("past_sliding_length",)
TOTAL_LENGTH_DIMS = ("total_sequence_length", "total_seq_len")
_CACHE_INPUT = re.compile(r"^past_key_values\.\d+\.(key|value)$|^past\.\d+\.(key|value)$")
_STATE_INPUT = re.compile(r"^past\.\d+\.(conv|state|ssm)")


@dataclass(frozen=True)
class DecoderConfig:
    """What a GenAI ``genai_config.json`` says about a decoder's inputs (all optional)."""

    head_size: int | None = None
    num_key_value_heads: int | None = None
    vocab_size: int | None = None
    sliding_window: int | None = None
    context_length: int | None = None  # the longest sequence the model takes (its rotary caches' length)

    def __post_init__(self) -> None:
        for name in ("head_size", "num_key_value_heads", "vocab_size", "sliding_window", "context_length"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"DecoderConfig.{name} must be a positive integer, got {value!r}")


def read_genai_config(model_path: str | Path | None) -> DecoderConfig | None:
    """The decoder facts of the ``genai_config.json`` beside ``model_path``, or None when there is none."""
    if model_path is None:
        return None
    path = Path(model_path).parent / GENAI_CONFIG
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
        model = config.get("model", {})
        decoder = model.get("decoder", {})
        window = decoder.get("sliding_window") or {}
    except (ValueError, AttributeError, OSError):
        return None

    def positive(value) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    return DecoderConfig(
        head_size=positive(decoder.get("head_size")),
        num_key_value_heads=positive(decoder.get("num_key_value_heads")),
        vocab_size=positive(model.get("vocab_size")),
        sliding_window=positive(window.get("window_size") if isinstance(window, dict) else None),
        context_length=positive(model.get("context_length")),
    )


def _index_bound(model: onnx.ModelProto, input_name: str) -> int | None:
    initializer_dims = {t.name: t.dims for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == input_name:
            dims = initializer_dims.get(node.input[0])
            if dims:
                return int(dims[0])
    return None


def _projection_width(model: onnx.ModelProto, value: str, depth: int = 6) -> int | None:
    """Output width of the MatMul (by a 2-D initializer) that ``value`` comes from, a few nodes upstream."""
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output if o}
    pending = [value]
    for _ in range(depth):
        upstream = []
        for name in pending:
            node = producers.get(name)
            if node is None:
                continue
            if node.op_type in ("MatMul", "MatMulNBits"):
                if node.op_type == "MatMulNBits":
                    return next((a.i for a in node.attribute if a.name == "N"), None)
                weight = shapes.get(node.input[1]) if len(node.input) > 1 else None
                if weight and len(weight) == 2:
                    return weight[1]
            upstream.extend(i for i in node.input if i and i not in shapes)
        pending = upstream
    return None


def _attention_facts(model: onnx.ModelProto) -> tuple[int | None, int | None]:
    """``(head_size, sliding_window)`` read off the first GroupQueryAttention node, when present."""
    for node in model.graph.node:
        if node.op_type != "GroupQueryAttention":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        window = attrs.get("local_window_size", -1)
        heads = attrs.get("num_heads", 0)
        kv_heads = attrs.get("kv_num_heads", heads)
        cos_cache = node.input[7] if len(node.input) > 7 else ""
        cos_dims = next((tuple(t.dims) for t in model.graph.initializer if t.name == cos_cache), ())
        if attrs.get("do_rotary") and not attrs.get("rotary_embedding_dim") and len(cos_dims) == 2:
            head_size = 2 * cos_dims[1]  # full rotary: the cos cache holds head_size / 2 frequencies
        else:  # the width of the packed QKV (or key) projection
            packed = len(node.input) < 2 or not node.input[1]
            width = _projection_width(model, node.input[0] if packed else node.input[1])
            divisor = heads + 2 * kv_heads if packed else kv_heads
            head_size = width // divisor if width and divisor and width % divisor == 0 else None
        return head_size, (window if isinstance(window, int) and window > 0 else None)
    return None, None


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Inputs a caller must feed (graph inputs that are not initializers)."""
    initializers = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in initializers]


def _checked_dtype_and_size(value: onnx.ValueInfoProto, dims: list[int], budget: int) -> np.dtype:
    """The input's numpy dtype, once its size is known to fit ``budget`` bytes (checked before allocating)."""
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
    except (KeyError, TypeError, ValueError):
        raise GraphPassError(f"input {value.name!r} has no numeric tensor type; give its feeds explicitly") from None
    count = 1
    for dim in dims:
        count *= dim
    if count * dtype.itemsize > budget:
        raise GraphPassError(
            f"input {value.name!r} of shape {dims} needs {count * dtype.itemsize / 2**20:.0f} MiB, more than the "
            f"{budget / 2**20:.0f} MiB available for random feeds"
        )
    return dtype


def is_kv_cache_decoder(model: onnx.ModelProto) -> bool:
    """True when the model takes past key/value caches or recurrent states (a generation step)."""
    return any(_CACHE_INPUT.match(v.name) or _STATE_INPUT.match(v.name) for v in graph_inputs(model))


def random_feeds(
    model: onnx.ModelProto,
    seed: int = 0,
    seq_len: int = 8,
    config: DecoderConfig | None = None,
    past_len: int = 0,
) -> dict[str, np.ndarray]:
    """Feeds for every input of ``model``: random values, or valid first-step feeds for a KV-cache decoder."""
    rng = np.random.default_rng(seed)
    head_size, window = _attention_facts(model)
    if config is not None:
        head_size = config.head_size or head_size
        window = config.sliding_window or window
    vocab = config.vocab_size if config is not None else None
    symbolic = {
        **dict.fromkeys(PAST_LENGTH_DIMS, past_len),
        **dict.fromkeys(SLIDING_DIMS, max(window or 0, past_len)),
        **dict.fromkeys(TOTAL_LENGTH_DIMS, past_len + seq_len),
    }
    feeds: dict[str, np.ndarray] = {}
    budget = available_memory_bytes() // 4
    for value in graph_inputs(model):
        dims: list[int] = []
        shape = value.type.tensor_type.shape.dim
        for position, d in enumerate(shape):
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(d.dim_value)
            elif d.dim_param.lower() in BATCH_DIM_NAMES:
                dims.append(1)
            elif d.dim_param in symbolic:
                dims.append(symbolic[d.dim_param])
            elif _CACHE_INPUT.match(value.name) and position == len(shape) - 1 and head_size:
                dims.append(head_size)
            else:
                dims.append(seq_len)
        dtype = _checked_dtype_and_size(value, dims, budget)
        lowered = value.name.lower()
        if _CACHE_INPUT.match(value.name) or _STATE_INPUT.match(value.name):
            feeds[value.name] = np.zeros(dims, dtype=dtype)
        elif np.issubdtype(dtype, np.floating) or dtype == np.dtype("bfloat16"):
            feeds[value.name] = rng.standard_normal(dims).astype(dtype)
        elif np.issubdtype(dtype, np.bool_) or "mask" in lowered:
            feeds[value.name] = np.ones(dims, dtype=dtype)
        elif "position" in lowered and dims:
            positions = np.arange(past_len, past_len + dims[-1], dtype=dtype)
            feeds[value.name] = np.broadcast_to(positions, dims).copy()
        else:
            bound = _index_bound(model, value.name) or vocab or 2
            feeds[value.name] = rng.integers(0, bound, size=dims).astype(dtype)
    return feeds
