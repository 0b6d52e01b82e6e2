"""``check_model`` accepts every well-formed initializer encoding and refuses sizes its bytes do not back."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from graph_passes.errors import InvalidModelError
from graph_passes.model_check import check_tensor


@pytest.mark.parametrize(
    "tensor",
    [
        helper.make_tensor("int4_typed", TensorProto.INT4, [5], [1, 2, 3, 4, 5]),  # 3 packed values
        helper.make_tensor("int4_raw", TensorProto.INT4, [5], b"\x21\x43\x05", raw=True),
        helper.make_tensor("uint4_raw", TensorProto.UINT4, [2, 3], b"\x00\x11\x22", raw=True),
        helper.make_tensor("f16_typed", TensorProto.FLOAT16, [3], [1.0, 2.0, 3.0]),
        helper.make_tensor("bf16_typed", TensorProto.BFLOAT16, [2], [1.0, 2.0]),
        helper.make_tensor("c64_typed", TensorProto.COMPLEX64, [2], [1 + 2j, 3 - 1j]),
        helper.make_tensor("str", TensorProto.STRING, [2], [b"a", b"b"]),
        numpy_helper.from_array(np.zeros((0, 4), np.float32), "empty"),
        numpy_helper.from_array(np.arange(6, dtype=np.int64).reshape(2, 3), "i64_raw"),
        helper.make_tensor("i64_typed", TensorProto.INT64, [3], [1, 2, 3]),
        helper.make_tensor("bool_typed", TensorProto.BOOL, [2], [True, False]),
    ],
    ids=lambda t: t.name,
)
def test_well_formed_initializers_pass(tensor):
    check_tensor(tensor, None)


def _raw(name, dtype, dims, **fields):
    """A TensorProto built field by field (``helper.make_tensor`` refuses the inconsistent ones)."""
    tensor = TensorProto(name=name, data_type=dtype, dims=dims)
    for field, values in fields.items():
        if field == "raw_data":
            tensor.raw_data = values
        else:
            getattr(tensor, field).extend(values)
    return tensor


def _short(tensor, cut: int = 1):
    tensor.raw_data = tensor.raw_data[:-cut]
    return tensor


@pytest.mark.parametrize(
    ("tensor", "words"),
    [
        (_short(helper.make_tensor("int4", TensorProto.INT4, [5], b"\x21\x43\x05", raw=True)), "raw_data has 2"),
        (_raw("int4_typed", TensorProto.INT4, [7], int32_data=[1, 2, 3]), "3 values stored"),
        (_short(numpy_helper.from_array(np.ones(4, np.float32), "f32")), "raw_data has 15"),
        (_raw("f32_typed", TensorProto.FLOAT, [4], float_data=[1.0, 2.0]), "2 values stored"),
        (_raw("str", TensorProto.STRING, [3], string_data=[b"a"]), "1 strings for 3"),
        (_raw("header_only", TensorProto.FLOAT, [10**12]), "raw_data has 0"),
        (_raw("dtype", 99, [1], raw_data=b"\0"), "unknown data type"),
        (_raw("negative", TensorProto.FLOAT, [2, -3], raw_data=b""), "negative dimension"),
    ],
    ids=lambda v: v.name if hasattr(v, "name") else "",
)
def test_sizes_the_bytes_do_not_back_are_refused(tensor, words):
    with pytest.raises(InvalidModelError, match=words):
        check_tensor(tensor, None)
