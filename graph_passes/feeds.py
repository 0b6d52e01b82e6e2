"""Random input feeds from a model's input signature (used by ``ndp-ep run`` and the numeric check).

Symbolic dimensions get small sizes (batch-like names 1, everything else ``seq_len``). Integer inputs that
index an embedding table are drawn below the table's row count; masks are ones; position ids count up.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from graph_passes.errors import GraphPassError
from ndp_io import available_memory_bytes

BATCH_DIM_NAMES = ("batch", "batch_size", "n", "b")


def _dims(value: onnx.ValueInfoProto, seq_len: int) -> list[int]:
    dims = []
    for d in value.type.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(d.dim_value)
        elif d.HasField("dim_param") and d.dim_param.lower() in BATCH_DIM_NAMES:
            dims.append(1)
        else:
            dims.append(seq_len)
    return dims


def _index_bound(model: onnx.ModelProto, input_name: str) -> int | None:
    initializer_dims = {t.name: t.dims for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == input_name:
            dims = initializer_dims.get(node.input[0])
            if dims:
                return int(dims[0])
    return None


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


def random_feeds(model: onnx.ModelProto, seed: int = 0, seq_len: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    budget = available_memory_bytes() // 4
    for value in graph_inputs(model):
        dims = _dims(value, seq_len)
        dtype = _checked_dtype_and_size(value, dims, budget)
        lowered = value.name.lower()
        if np.issubdtype(dtype, np.floating):
            feeds[value.name] = rng.standard_normal(dims).astype(dtype)
        elif np.issubdtype(dtype, np.bool_) or "mask" in lowered:
            feeds[value.name] = np.ones(dims, dtype=dtype)
        elif "position" in lowered and dims:
            feeds[value.name] = np.broadcast_to(np.arange(dims[-1], dtype=dtype), dims).copy()
        else:
            bound = _index_bound(model, value.name) or 2
            feeds[value.name] = rng.integers(0, bound, size=dims).astype(dtype)
    return feeds
