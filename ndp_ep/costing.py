"""FLOPs and bytes of the graph's non-expert nodes for given input shapes, costed on the GPU.

Shapes come from ONNX shape inference on a weightless skeleton of the model with the run's concrete input
shapes; each claimed expert node is stood in for by an ``Identity`` of its hidden input (same shape).
Results are cached per input-shape signature, so steady-state runs pay nothing.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import onnx
from onnx import TensorProto

from graph_passes.graph_index import copy_fields, copy_without_initializers
from hw_model.cost import kernel_time_s
from hw_model.hardware import DTYPE_BYTES, SystemSpec
from ndp_ep.partition import is_ndp_supported

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
_WEIGHT_BYTE_FIELDS = ("raw_data", "external_data")


class GpuCost(NamedTuple):
    """Non-expert work of one run on the GPU (a named tuple: a frozen dataclass costs ~0.4 ms to define at import,
    in every ``ndp-ep run``), and the node whose inputs and outputs together are the largest, at their element
    types, among those shape inference sizes: ``working_set_bytes`` (a lower bound on the memory the run needs
    where it is computed: a node's inputs and outputs are all held while it runs) and ``working_set_node`` naming
    it (empty when no node is sized)."""

    flops: float
    bytes_moved: float
    kernels: int
    time_s: float
    working_set_bytes: float = 0.0
    working_set_node: str = ""


class NonExpertCoster:
    def __init__(self, model: onnx.ModelProto, system: SystemSpec, dtype: str) -> None:
        self.system = system
        self.dtype = dtype
        self.dtype_bytes = DTYPE_BYTES[dtype]
        self.skeleton = self._skeleton(model)
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
            cached = self._cache[key] = self._compute(input_shapes)
        return cached

    def _compute(self, input_shapes: dict[str, tuple[int, ...]]) -> GpuCost:
        model = onnx.ModelProto()
        model.CopyFrom(self.skeleton)
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
        shapes: dict[str, tuple[int, ...]] = {}
        sizes: dict[str, float] = {}  # bytes of each tensor shape inference sized
        for value in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
            dims = value.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims):
                shape = shapes[value.name] = tuple(d.dim_value for d in dims)
                sizes[value.name] = float(math.prod(shape)) * _element_bytes(value.type.tensor_type.elem_type)
        for tensor in inferred.graph.initializer:
            shapes[tensor.name] = tuple(tensor.dims)
            sizes[tensor.name] = float(math.prod(tensor.dims)) * _element_bytes(tensor.data_type)
        working_set_bytes, working_set_node = 0.0, ""
        for node in inferred.graph.node:
            working = sum(sizes.get(name, 0.0) for name in (*node.input, *node.output) if name)
            if working > working_set_bytes:
                working_set_bytes, working_set_node = working, f"{node.name or node.output[0]} ({node.op_type})"
        flops = bytes_moved = 0.0
        kernels = 0
        time_s = 0.0
        gpu = self.system.gpu
        for node in inferred.graph.node:
            if node.op_type in FREE_OPS:
                continue
            out_shape = shapes.get(node.output[0]) if node.output else None
            in_shapes = [shapes.get(i) for i in node.input if i]
            if out_shape is None:
                continue
            # math.prod, not np.prod: a Python product of a few ints is 20x quicker than building an array
            out_elems = float(math.prod(out_shape))
            node_bytes = (out_elems + sum(float(math.prod(s)) for s in in_shapes if s is not None)) * self.dtype_bytes
            if node.op_type in ("MatMul", "Gemm") and in_shapes and in_shapes[0]:
                inner = in_shapes[0][-1] if not _attr(node, "transA", 0) else in_shapes[0][-2]
                node_flops = 2.0 * out_elems * inner
            else:
                node_flops = out_elems
            flops += node_flops
            bytes_moved += node_bytes
            kernels += 1
            time_s += kernel_time_s(gpu, node_flops, node_bytes, self.dtype, kernels=1)
        return GpuCost(flops, bytes_moved, kernels, time_s, working_set_bytes, working_set_node)


def _element_bytes(elem_type: int) -> int:
    """Bytes of one element of an ONNX tensor type (1 for the sub-byte and unknown types: a lower bound)."""
    try:
        return max(1, onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize)
    except (KeyError, TypeError, ValueError):
        return 1


def _copy_header(tensor: onnx.TensorProto, target: onnx.TensorProto) -> None:
    """``tensor`` into ``target`` without its bytes: every field but ``raw_data`` and ``external_data``, with
    ``data_location`` set to inline."""
    copy_fields(tensor, target, _WEIGHT_BYTE_FIELDS)
    target.data_location = TensorProto.DEFAULT


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for attribute in node.attribute:
        if attribute.name == name:
            return int(onnx.helper.get_attribute_value(attribute))
    return default
