"""The shard copy (``expert_math.copy_blocked``): a staged transposing copy must move every element exactly.

The converter copies each shard once from the source layout, usually a transpose of an ``[out, in]`` slice.
These tests compare it with numpy's own contiguous copy of the same view, for the weight dtypes the
converter writes and for the shapes that exercise the band edges (columns not a multiple of the band,
rows whose byte pitch is or is not a power of two, strided and reversed views, a strided destination).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from graph_passes.expert_math import TRANSPOSE_BAND, copy_blocked, transpose_blocked

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.uint8]


def _source(rows: int, cols: int, dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.uint8:
        return rng.integers(0, 256, (rows, cols), dtype=np.uint8)
    return rng.standard_normal((rows, cols)).astype(np.float32).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(
    ("rows", "cols", "columns"),
    [
        (256, 128, slice(0, 64)),  # one band exactly; 128-value rows: a power-of-two pitch
        (512, 96, slice(32, 96)),  # a shard out of the middle
        (2 * TRANSPOSE_BAND + 5, 70, slice(None)),  # a partial last band
        (33, 17, slice(3, 14)),  # odd sizes, fewer columns than a band
    ],
)
def test_transposed_shard_copy_equals_numpy_copy(dtype, rows, cols, columns):
    source = _source(rows, cols, dtype, seed=rows + cols)
    view = source.T[columns]  # [in, out] rows of an [out, in] source: a transposing view
    copied = copy_blocked(view)
    assert copied.flags.c_contiguous
    assert copied.dtype == source.dtype
    assert np.array_equal(copied.view(np.uint8), np.ascontiguousarray(view).view(np.uint8))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_strided_and_reversed_views_copy_exactly(dtype):
    source = _source(300, 80, dtype, seed=7)
    for view in (source.T[::2], source.T[:, ::3], source.T[::-1, 5:60], source[10:200:2].T, source[:, 1::2]):
        assert np.array_equal(copy_blocked(view).view(np.uint8), np.ascontiguousarray(view).view(np.uint8))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_copy_into_halves_of_a_gated_shard(dtype):
    gate, up = _source(150, 64, dtype, seed=1), _source(150, 64, dtype, seed=2)  # [out, in] halves
    out = np.zeros((64, 2 * 150), dtype=gate.dtype)
    copy_blocked(gate.T, out[:, :150])
    copy_blocked(up.T, out[:, 150:])
    expected = np.ascontiguousarray(np.concatenate([gate.T, up.T], axis=1))
    assert np.array_equal(out.view(np.uint8), expected.view(np.uint8))


def test_transpose_blocked_is_the_contiguous_transpose():
    matrix = _source(130, 257, np.float32, seed=3)
    result = transpose_blocked(matrix)
    assert result.flags.c_contiguous
    assert np.array_equal(result, matrix.T)
