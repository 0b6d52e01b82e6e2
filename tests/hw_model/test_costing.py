"""NonExpertCoster (ndp_ep/costing.py) against costs computed by hand from the h200 preset's numbers."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hw_model.hardware import load_system
from ndp_ep.costing import NonExpertCoster

# h200 preset, by hand: 4.8 TB/s x 0.8805 achievable; 989.4 TFLOP/s bf16 x 0.8281; 1.5 us per kernel
BANDWIDTH = 4.8e12 * 0.8805
FLOPS = 989.4e12 * 0.8281
KERNEL_S = 1.5e-6


def _model() -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.zeros((64, 32), dtype=np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["y"], name="free"),
    ]
    shape = numpy_helper.from_array(np.array([-1, 32], dtype=np.int64), "shape")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[weight, shape],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("batch", [1, 8])
def test_non_expert_cost_matches_a_hand_computed_roofline(batch):
    coster = NonExpertCoster(_model(), load_system("h200"), "bf16")
    cost = coster.cost({"x": (batch, 64)})
    # MatMul [batch,64] x [64,32]: 2 * batch * 32 * 64 FLOPs; reads x and w, writes h; bf16 = 2 bytes
    mm_flops = 2.0 * batch * 32 * 64
    mm_bytes = (batch * 64 + 64 * 32 + batch * 32) * 2
    # Relu: one op per output element; reads h, writes r
    relu_flops = batch * 32
    relu_bytes = 2 * batch * 32 * 2
    assert cost.kernels == 2  # Reshape is free
    assert cost.flops == pytest.approx(mm_flops + relu_flops)
    assert cost.bytes_moved == pytest.approx(mm_bytes + relu_bytes)
    expected = (
        2 * KERNEL_S + max(mm_flops / FLOPS, mm_bytes / BANDWIDTH) + max(relu_flops / FLOPS, relu_bytes / BANDWIDTH)
    )
    assert cost.time_s == pytest.approx(expected, rel=1e-6)


def test_costs_are_cached_per_input_shape():
    coster = NonExpertCoster(_model(), load_system("h200"), "bf16")
    assert coster.cost({"x": (4, 64)}) is coster.cost({"x": (4, 64)})
    assert coster.cost({"x": (4, 64)}) != coster.cost({"x": (5, 64)})


@pytest.mark.parametrize("batch", [1, 1000])
def test_the_working_set_is_the_largest_nodes_inputs_and_outputs_at_their_element_types(batch):
    cost = NonExpertCoster(_model(), load_system("h200"), "bf16").cost({"x": (batch, 64)})
    # float32 (4 bytes), whatever dtype the GPU work is costed in: MatMul holds x, w and h; Relu holds h and r;
    # Reshape holds r, its int64 shape (2 values) and y
    matmul = (batch * 64 + 64 * 32 + batch * 32) * 4
    relu = 2 * batch * 32 * 4
    reshape = 2 * batch * 32 * 4 + 2 * 8
    expected, node = max((matmul, "mm (MatMul)"), (relu, "relu (Relu)"), (reshape, "free (Reshape)"))
    assert (cost.working_set_bytes, cost.working_set_node) == (expected, node)
