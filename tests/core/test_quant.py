"""Block-wise 4/8-bit packing as ONNX Runtime's QMoE stores it, on hand-computed bytes."""

from __future__ import annotations

import numpy as np
import pytest

from graph_passes import quant


def test_four_bit_values_pack_low_nibble_first():
    assert quant.pack(np.array([1, 2, 3], np.uint8), 4).tolist() == [0x21, 0x03]
    assert quant.unpack(np.array([0x21, 0x03], np.uint8), 4, 3).tolist() == [1, 2, 3]
    assert quant.packed_width(3, 4) == 2 and quant.packed_width(3, 8) == 3


def test_dequantize_uses_the_default_zero_point_and_one_scale_per_block():
    packed = quant.pack(np.array([[0, 15, 8, 9]], np.uint8), 4)
    scales = np.array([[0.5, 2.0]], np.float32)  # blocks of 2 inputs
    got = quant.dequantize(packed, scales, None, bits=4, block=2, cols=4)
    assert got.tolist() == [[-4.0, 3.5, 0.0, 2.0]]  # (q - 8) * scale
    zero_points = quant.pack(np.array([[1, 9]], np.uint8), 4)
    got = quant.dequantize(packed, scales, zero_points, bits=4, block=2, cols=4)
    assert got.tolist() == [[-0.5, 7.0, -2.0, 0.0]]
    eight = quant.dequantize(np.array([[0, 255]], np.uint8), np.array([[0.25]], np.float32), None, 8, 2, 2)
    assert eight.tolist() == [[-32.0, 31.75]]  # (q - 128) * scale


@pytest.mark.parametrize(("start", "stop", "want"), [(0, 2, [0x21]), (1, 3, [0x32]), (1, 4, [0x32, 0x04])])
def test_input_slices_are_repacked_when_not_byte_aligned(start, stop, want):
    packed = quant.pack(np.array([[1, 2, 3, 4]], np.uint8), 4)
    assert quant.slice_inputs(packed, 4, start, stop).tolist() == [want]


def test_other_bit_widths_are_refused():
    with pytest.raises(ValueError, match="4- and 8-bit"):
        quant.pack(np.zeros(4, np.uint8), 2)
