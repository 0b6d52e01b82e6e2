"""Fused ``com.microsoft.QMoE`` / ``MoE`` decoders at real models' widths, streamed to external data (no download).

    python sample_models/build_real_widths.py OUT_DIR --hidden 2048 --ffn 1792 --experts 32 --top-k 4 \
        --layers 4 --precision int4

A chain of ``layers`` MoE layers as ONNX Runtime GenAI's model builder emits them (router Gemm → fused op with the
router's logits, biases, interleaved SwiGLU rows ``swiglu_fusion=1``, blocks of 32 for quantized experts), each
followed by a residual Add::

    x[T,H] ─┬─ Gemm(router) ─ logits ─┐
            └─────────────────────── QMoE | MoE ─ Add(x) ─► next layer ... ─► y[T,H]

Expert weights are seeded random values in ONNX Runtime's layouts (``[E, 2I, H/pack]`` packed values and
``[E, 2I, H/block]`` scales; ``[E, 2I, H]`` floats), written one expert at a time to ``model.onnx.data`` so that
building never holds more than one expert in memory. Float models (``fp32``, ``fp16``) compute in their own
precision end to end (ONNX Runtime's CPU ``MoE`` runs float16); quantized ones in float32, as the builder's int4
CPU exports do. The tests (tests/large/test_real_widths.py) and benchmarks/bench_real_widths.py build from here.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

PRECISIONS = {"int4": 4, "int8": 8, "fp32": 0, "fp16": 0}
QUANT_BLOCK = 32  # ONNX Runtime GenAI's builder default
SWIGLU_GPT_OSS = {"activation_alpha": 1.702, "activation_beta": 1.0, "swiglu_limit": 7.0}
SILU_GLU = {"activation_alpha": 1.0, "activation_beta": 0.0}
DATA_NAME = "model.onnx.data"


@dataclass(frozen=True)
class RealWidthSpec:
    """The MoE shape of one model: ``layers`` fused MoE layers of ``num_experts`` experts (top ``top_k``)."""

    layers: int
    num_experts: int
    top_k: int
    hidden: int
    ffn: int
    precision: str = "int4"
    block: int = QUANT_BLOCK
    gpt_oss_swiglu: bool = False  # GPT-OSS's clamped SwiGLU (alpha 1.702, limit 7); else SiLU-GLU

    def __post_init__(self) -> None:
        for name in ("layers", "num_experts", "top_k", "hidden", "ffn", "block"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k {self.top_k} exceeds num_experts {self.num_experts}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")

    @property
    def bits(self) -> int:
        return PRECISIONS[self.precision]

    @property
    def quantized(self) -> bool:
        return self.bits > 0

    @property
    def float_type(self) -> int:
        return TensorProto.FLOAT16 if self.precision == "fp16" else TensorProto.FLOAT

    @property
    def np_float(self) -> type:
        return np.float16 if self.precision == "fp16" else np.float32

    def matrix_bytes(self, rows: int, cols: int) -> int:
        """Bytes of one expert's ``[rows, cols]`` matrix with its scales (quantized) as stored."""
        if not self.quantized:
            return rows * cols * np.dtype(self.np_float).itemsize
        return rows * (cols * self.bits // 8) + rows * (-(-cols // self.block)) * 4

    @property
    def expert_bytes(self) -> int:
        """One expert's tensors on disk (matrices, scales, biases)."""
        biases = (2 * self.ffn + self.hidden) * np.dtype(self.np_float).itemsize
        return self.matrix_bytes(2 * self.ffn, self.hidden) + self.matrix_bytes(self.hidden, self.ffn) + biases

    @property
    def expert_weight_bytes(self) -> int:
        return self.layers * self.num_experts * self.expert_bytes


class _Writer:
    """Appends stacked tensors, one expert at a time, to one external-data file."""

    def __init__(self, data_file, rng: np.random.Generator) -> None:
        self.data_file, self.rng = data_file, rng
        self.initializers: list[TensorProto] = []

    def stacked(self, name: str, shape: tuple[int, ...], data_type: int, make) -> str:
        """``shape[0]`` experts, each ``make(rng)`` (an array of ``shape[1:]``), written in turn."""
        offset = self.data_file.tell()
        for _ in range(shape[0]):
            chunk = np.ascontiguousarray(make(self.rng))
            if chunk.shape != tuple(shape[1:]):
                raise ValueError(f"{name}: expert of shape {chunk.shape}, expected {shape[1:]}")
            chunk.tofile(self.data_file)
        tensor = TensorProto()
        tensor.name, tensor.data_type = name, data_type
        tensor.dims.extend(shape)
        tensor.data_location = TensorProto.EXTERNAL
        length = self.data_file.tell() - offset
        for key, value in (("location", DATA_NAME), ("offset", str(offset)), ("length", str(length))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.initializers.append(tensor)
        return name

    def inline(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(array, name))
        return name


def _quantized_matrix(writer: _Writer, spec: RealWidthSpec, name: str, rows: int, cols: int) -> tuple[str, str]:
    """Packed values ``[E, rows, cols*bits/8]`` and float32 scales ``[E, rows, ceil(cols/block)]``."""
    experts, bits, blocks = spec.num_experts, spec.bits, -(-cols // spec.block)
    scale = 1.0 / np.sqrt(cols) / (2 ** (bits - 1)) * np.sqrt(3.0)

    def values(rng: np.random.Generator) -> np.ndarray:
        packed = rng.integers(0, 256, (rows, cols * bits // 8), dtype=np.uint8)  # every nibble uniform
        return packed

    def scales(rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(0.5 * scale, 1.5 * scale, (rows, blocks)).astype(np.float32)

    packed_name = writer.stacked(f"{name}.qweight", (experts, rows, cols * bits // 8), TensorProto.UINT8, values)
    scales_name = writer.stacked(f"{name}.scales", (experts, rows, blocks), TensorProto.FLOAT, scales)
    return packed_name, scales_name


def _float_matrix(writer: _Writer, spec: RealWidthSpec, name: str, rows: int, cols: int) -> str:
    std = np.float32(np.sqrt(3.0 / cols))

    def values(rng: np.random.Generator) -> np.ndarray:
        chunk = rng.random((rows, cols), dtype=np.float32)
        chunk -= np.float32(0.5)
        chunk *= 2 * std
        return chunk.astype(spec.np_float, copy=False)

    return writer.stacked(f"{name}.weight", (spec.num_experts, rows, cols), spec.float_type, values)


def _bias(writer: _Writer, spec: RealWidthSpec, name: str, width: int) -> str:
    def values(rng: np.random.Generator) -> np.ndarray:
        return (rng.standard_normal(width, dtype=np.float32) * np.float32(0.02)).astype(spec.np_float)

    bias_type = spec.float_type
    return writer.stacked(name, (spec.num_experts, width), bias_type, values)


def _layer(writer: _Writer, spec: RealWidthSpec, layer: int, x: str, nodes: list[onnx.NodeProto]) -> str:
    p = f"model.layers.{layer}.moe"
    h, i, e = spec.hidden, spec.ffn, spec.num_experts
    router = (writer.rng.standard_normal((e, h), dtype=np.float32) / np.float32(np.sqrt(h))).astype(spec.np_float)
    logits = f"/model/layers.{layer}/moe/router/logits"
    nodes.append(
        helper.make_node("Gemm", [x, writer.inline(f"{p}.router.weight", router)], [logits], transB=1, name=logits)
    )
    attrs: dict = {"k": spec.top_k, "activation_type": "swiglu", "swiglu_fusion": 1, "normalize_routing_weights": 1}
    attrs |= SWIGLU_GPT_OSS if spec.gpt_oss_swiglu else SILU_GLU
    if spec.quantized:
        fc1, fc1_scales = _quantized_matrix(writer, spec, f"{p}.experts.gate_up_proj", 2 * i, h)
        fc1_bias = _bias(writer, spec, f"{p}.experts.gate_up_proj.bias", 2 * i)
        fc2, fc2_scales = _quantized_matrix(writer, spec, f"{p}.experts.down_proj", h, i)
        fc2_bias = _bias(writer, spec, f"{p}.experts.down_proj.bias", h)
        inputs = [x, logits, fc1, fc1_scales, fc1_bias, fc2, fc2_scales, fc2_bias]
        attrs |= {"expert_weight_bits": spec.bits, "block_size": spec.block}
        op = "QMoE"
    else:
        fc1 = _float_matrix(writer, spec, f"{p}.experts.gate_up_proj", 2 * i, h)
        fc1_bias = _bias(writer, spec, f"{p}.experts.gate_up_proj.bias", 2 * i)
        fc2 = _float_matrix(writer, spec, f"{p}.experts.down_proj", h, i)
        fc2_bias = _bias(writer, spec, f"{p}.experts.down_proj.bias", h)
        inputs = [x, logits, fc1, fc1_bias, fc2, fc2_bias]
        op = "MoE"
    out = f"/model/layers.{layer}/moe/{op}/output_0"
    nodes.append(
        helper.make_node(op, inputs, [out], name=f"/model/layers.{layer}/moe/{op}", domain="com.microsoft", **attrs)
    )
    residual = f"/model/layers.{layer}/residual/output_0"
    nodes.append(helper.make_node("Add", [x, out], [residual], name=f"/model/layers.{layer}/residual/Add"))
    return residual


def build_real_width_model(spec: RealWidthSpec, directory: Path, seed: int = 0) -> Path:
    """Write ``model.onnx`` and ``model.onnx.data`` of ``spec`` into ``directory``; returns the model's path."""
    directory.mkdir(parents=True, exist_ok=True)
    nodes: list[onnx.NodeProto] = []
    with open(directory / DATA_NAME, "wb") as data_file:
        writer = _Writer(data_file, np.random.default_rng(seed))
        x = "hidden_states"
        for layer in range(spec.layers):
            x = _layer(writer, spec, layer, x, nodes)
    nodes.append(helper.make_node("Identity", [x], ["y"], name="output/Identity"))
    graph = helper.make_graph(
        nodes,
        f"real_widths_{spec.precision}",
        [helper.make_tensor_value_info("hidden_states", spec.float_type, ["tokens", spec.hidden])],
        [helper.make_tensor_value_info("y", spec.float_type, ["tokens", spec.hidden])],
        writer.initializers,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="ndp-ep sample_models/build_real_widths.py")
    model.ir_version = 10
    path = directory / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--ffn", type=int, default=1792)
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="int4")
    parser.add_argument("--gpt-oss-swiglu", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    spec = RealWidthSpec(
        args.layers, args.experts, args.top_k, args.hidden, args.ffn, args.precision, gpt_oss_swiglu=args.gpt_oss_swiglu
    )
    path = build_real_width_model(spec, args.out, args.seed)
    print(f"{path}: {spec.expert_weight_bytes / 1e9:.2f} GB of expert weights")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
