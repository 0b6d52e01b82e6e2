"""A chain of ``com.microsoft.QMoE`` blocks at any widths, its weights in one external-data file, built layer by layer.

    x[T,H] ─► Gemm(router) ─► QMoE(x, logits) ─► + x ─► ... (``layers`` times) ─► y[T,H]

Each block has seeded random block-quantized codes (4 or 8 bits) and float32 scales, no biases and no zero points,
SiLU-GLU on interleaved rows (``swiglu_fusion=1``, alpha 1, beta 0), as ONNX Runtime GenAI's model builder writes
an LFM2-MoE block; offsets in the data file are 64 KiB aligned, as onnx aligns tensors for memory mapping. Used by
``benchmarks/bench_session_cost.py`` (at LFM2-8B-A1B's widths) and the provider's tests (at small ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ALIGN = 1 << 16


@dataclass(frozen=True)
class ChainWidths:
    """The widths of every block of the chain."""

    hidden: int = 2048
    experts: int = 32
    top_k: int = 4
    ffn: int = 1792
    block: int = 32

    def __post_init__(self) -> None:
        if min(self.hidden, self.experts, self.top_k, self.ffn, self.block) < 1 or self.top_k > self.experts:
            raise ValueError(f"invalid chain widths {self}")
        if self.hidden % self.block or self.ffn % self.block:
            raise ValueError(f"hidden and ffn must be multiples of the block size: {self}")


LFM2_8B_A1B = ChainWidths()


def _write_external(path: Path, arrays: list[tuple[str, np.ndarray]], data_name: str) -> list[TensorProto]:
    """Appends each array to the external-data file at ``path`` (aligned offsets); returns their tensor protos."""
    tensors = []
    with open(path, "ab") as data:
        for name, array in arrays:
            offset = data.seek(0, 2)
            pad = -offset % ALIGN
            data.write(b"\0" * pad)
            offset += pad
            data.write(np.ascontiguousarray(array).tobytes())
            tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
            tensor.dims.extend(array.shape)
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(array.nbytes))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            tensors.append(tensor)
    return tensors


def build_chain(path: Path, layers: int, bits: int, widths: ChainWidths = LFM2_8B_A1B, seed: int = 0) -> None:
    """The chain (module docstring) at ``path``, its weights in ``path``.data, built one layer at a time."""
    hidden, experts, ffn, block = widths.hidden, widths.experts, widths.ffn, widths.block
    rng = np.random.default_rng(seed)
    data_name = path.name + ".data"
    (path.parent / data_name).unlink(missing_ok=True)
    nodes, inits = [], []
    current = "x"
    per_byte = 8 // bits
    for layer in range(layers):
        p = f"/model/layers.{layer}/moe"
        arrays = [
            (f"{p}.router", (rng.standard_normal((experts, hidden)) / np.sqrt(hidden)).astype(np.float32)),
            (f"{p}.fc1", rng.integers(0, 256, (experts, 2 * ffn, hidden // per_byte), dtype=np.uint8)),
            (f"{p}.fc1_scales", rng.uniform(0.01, 0.03, (experts, 2 * ffn, hidden // block)).astype(np.float32)),
            (f"{p}.fc2", rng.integers(0, 256, (experts, hidden, ffn // per_byte), dtype=np.uint8)),
            (f"{p}.fc2_scales", rng.uniform(0.01, 0.03, (experts, hidden, ffn // block)).astype(np.float32)),
        ]
        inits += _write_external(path.parent / data_name, arrays, data_name)
        del arrays
        logits, moe, residual = f"{p}/logits", f"{p}/out", f"{p}/residual"
        nodes.append(helper.make_node("Gemm", [current, f"{p}.router"], [logits], transB=1))
        nodes.append(
            helper.make_node(
                "QMoE",
                [current, logits, f"{p}.fc1", f"{p}.fc1_scales", "", f"{p}.fc2", f"{p}.fc2_scales"],
                [moe],
                name=f"{p}/QMoE",
                domain="com.microsoft",
                k=widths.top_k,
                activation_type="swiglu",
                swiglu_fusion=1,
                normalize_routing_weights=1,
                expert_weight_bits=bits,
                block_size=block,
                activation_alpha=1.0,
                activation_beta=0.0,
            )
        )
        nodes.append(helper.make_node("Add", [current, moe], [residual]))
        current = residual
    nodes.append(helper.make_node("Identity", [current], ["y"]))
    graph = helper.make_graph(
        nodes,
        "real_width_qmoe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["tokens", hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["tokens", hidden])],
        inits,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=10), str(path))
