"""Reference numerics of MoE experts, shared by the verifier and the provider's kernels.

Activations operate on float32 numpy arrays. :func:`canonical_matrix` turns one expert's slice of an
exported weight (``[out, in]`` or ``[in, out]``, possibly with gate/up halves or interleaved rows) into
the ``x @ W`` form ``[in, out]`` the reference computes with. (The sharded op's float shards keep their
source's layout instead, see :mod:`graph_passes.sharded_op`: an ``out_in`` shard is a transpose of a
:func:`canonical_view` slice, i.e. a plain slice of the source.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from graph_passes import activations, quant
from graph_passes.plan import MoEBlockPlan, StackedBias, StackedMatrix


def plain_activation(name: str, x: np.ndarray) -> np.ndarray:
    """A plain activation of the catalog (:mod:`graph_passes.activations`) applied to ``x``."""
    return activations.apply_plain(name, x)


def gated_activation(
    name: str,
    gate: np.ndarray,
    up: np.ndarray,
    alpha: float = activations.SWIGLU_ALPHA,
    limit: float = activations.SWIGLU_LIMIT,
    beta: float = activations.SWIGLU_BETA,
) -> np.ndarray:
    """A gated activation of the catalog applied to the ``gate`` and ``up`` projections."""
    return activations.apply_gated(name, gate, up, alpha, limit, beta)


def select_columns(array: np.ndarray, columns: str) -> np.ndarray:
    """Columns (last axis) of ``array`` named by a :class:`StackedMatrix` ``columns`` selector."""
    width = array.shape[-1]
    if columns == "all":
        return array
    if columns == "first_half":
        return array[..., : width // 2]
    if columns == "second_half":
        return array[..., width // 2 :]
    if columns == "even":
        return array[..., 0::2]
    if columns == "odd":
        return array[..., 1::2]
    raise ValueError(f"unknown column selection {columns!r}")


TRANSPOSE_BAND = 64  # source rows staged at a time by copy_blocked
CACHE_LINE_BYTES = 64


def transpose_blocked(matrix: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``matrix.T`` as a C-contiguous array (:func:`copy_blocked` of the transposed view)."""
    return copy_blocked(matrix.T, out)


def copy_blocked(view: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """A C-contiguous copy of the 2-D ``view`` (any strides), staged through a padded buffer when it is a transpose.

    numpy copies into ``out`` in ``out``'s memory order, so a transposing copy reads one element from each of
    many source rows per output row. When those rows lie a power of two bytes apart (1024 or 2048 values of
    2 or 4 bytes: every common hidden size) they all fall in the same few L1 cache sets and evict each other,
    and the copy runs at under 1 GB/s. Each band of :data:`TRANSPOSE_BAND` source rows is therefore first
    copied (sequentially) into a scratch buffer whose row pitch is an odd number of cache lines, so the rows
    occupy distinct sets, then transposed from there: two passes, several times faster for any dtype.
    """
    if out is None:
        out = np.empty(view.shape, dtype=view.dtype)
    if view.ndim != 2 or abs(view.strides[0]) >= abs(view.strides[1]):
        out[...] = view
        return out
    rows, cols = view.shape
    itemsize = view.dtype.itemsize
    lines = -(-rows * itemsize // CACHE_LINE_BYTES)
    lines += 1 - lines % 2  # an odd pitch in cache lines: consecutive rows map to different sets
    pitch = -(-lines * CACHE_LINE_BYTES // itemsize)
    scratch = np.empty((min(TRANSPOSE_BAND, cols), pitch), dtype=view.dtype)
    for start in range(0, cols, TRANSPOSE_BAND):
        band = view[:, start : start + TRANSPOSE_BAND]
        staged = scratch[: band.shape[1], :rows]
        staged[...] = band.T  # source rows, read in their own order
        out[:, start : start + TRANSPOSE_BAND] = staged.T
    return out


def canonical_view(raw_expert: np.ndarray, matrix: StackedMatrix) -> np.ndarray:
    """One expert's matrix as ``[in, out]`` (``x @ W``) in its stored dtype, a view of ``raw_expert``.

    A shard of it in the source's own layout (``[:, cols].T`` of an ``out_in`` source, ``[rows]`` of an
    ``in_out`` one) is a view of ``raw_expert`` with no transposed strides; :func:`copy_blocked` makes any
    slice contiguous in one pass.
    """
    w = raw_expert.T if matrix.layout == "out_in" else raw_expert
    return select_columns(w, matrix.columns)


def canonical_matrix(raw_expert: np.ndarray, matrix: StackedMatrix) -> np.ndarray:
    """One expert's matrix as ``[in, out]`` (``x @ W``), contiguous float32."""
    if matrix.layout == "out_in" and raw_expert.ndim == 2:
        # columns of W = rows of the [out, in] source: select rows, then transpose once
        rows = select_columns(raw_expert.T, matrix.columns).T
        return transpose_blocked(rows.astype(np.float32, copy=False))
    w = raw_expert.T if matrix.layout == "out_in" else raw_expert
    return np.ascontiguousarray(select_columns(w, matrix.columns), dtype=np.float32)


def canonical_bias(raw_expert: np.ndarray, bias: StackedBias) -> np.ndarray:
    """One expert's bias (selected columns) as contiguous float32."""
    return np.ascontiguousarray(select_columns(raw_expert, bias.columns), dtype=np.float32)


@dataclass(frozen=True)
class ExpertArrays:
    """One expert's canonical weights: ``[in, out]`` matrices and per-output biases (float32)."""

    up: np.ndarray
    down: np.ndarray
    gate: np.ndarray | None = None
    up_bias: np.ndarray | None = None
    gate_bias: np.ndarray | None = None
    down_bias: np.ndarray | None = None


def load_expert(
    plan: MoEBlockPlan, read_expert: Callable[[str, int], np.ndarray], expert: int, views: bool = False
) -> ExpertArrays:
    """Expert ``expert``'s canonical weights; ``read_expert(initializer, e)`` returns ``initializer[e]``.

    With ``views`` the matrices are :func:`canonical_view` s (no transposing copy) of what ``read_expert``
    returned, or of the float32 matrix a quantized one dequantizes to (NumPy's BLAS multiplies such views as
    they are).
    """
    w = plan.weights
    to_canonical = canonical_view if views else canonical_matrix
    dequantized: dict[str, np.ndarray] = {}  # a gate and an up projection stacked in one tensor: one dequantize

    def matrix(m: StackedMatrix | None, inputs: int) -> np.ndarray | None:
        if m is None:
            return None
        raw = read_expert(m.per_expert[expert], -1) if m.per_expert else read_expert(m.initializer, expert)
        if m.scales:
            if m.initializer not in dequantized:
                zero_points = read_expert(m.zero_points, expert) if m.zero_points else None
                scales = read_expert(m.scales, expert)
                bits, block = plan.bits, plan.quant_block_size
                dequantized[m.initializer] = quant.dequantize(raw, scales, zero_points, bits, block, inputs)
            raw = dequantized[m.initializer]
        return to_canonical(raw, m)

    def bias(b: StackedBias | None) -> np.ndarray | None:
        return None if b is None else canonical_bias(read_expert(b.initializer, expert), b)

    return ExpertArrays(
        up=matrix(w.up, plan.hidden),
        down=matrix(w.down, plan.ffn),
        gate=matrix(w.gate, plan.hidden),
        up_bias=bias(w.up_bias),
        gate_bias=bias(w.gate_bias),
        down_bias=bias(w.down_bias),
    )


def expert_ffn(plan: MoEBlockPlan, x: np.ndarray, weights: ExpertArrays, activation_block: int = 0) -> np.ndarray:
    """One expert applied to ``x`` ``[n, H]``. ``activation_block`` > 0: each matrix multiply's input is first
    rounded to int8 per block of that many values, as a block-quantized multiply with int8 activations does
    (see :func:`graph_passes.quant.int8_activation_roundtrip`); a matrix whose input width has a partial last
    block is multiplied in float, as ONNX Runtime does (:func:`graph_passes.quant.int8_activations_apply`)."""
    if activation_block and quant.int8_activations_apply(plan.hidden, activation_block):
        x = quant.int8_activation_roundtrip(x, activation_block)
    u = x @ weights.up
    if weights.up_bias is not None:
        u = u + weights.up_bias
    if plan.gated:
        g = x @ weights.gate
        if weights.gate_bias is not None:
            g = g + weights.gate_bias
        act = gated_activation(
            plan.activation, g, u, plan.activation_alpha, plan.activation_limit, plan.activation_beta
        )
    else:
        act = plain_activation(plan.activation, u)
    if activation_block and quant.int8_activations_apply(plan.ffn, activation_block):
        act = quant.int8_activation_roundtrip(act, activation_block)
    y = act @ weights.down
    if weights.down_bias is not None:
        y = y + weights.down_bias
    return y


def group_slots_by_expert(expert_ids: np.ndarray, num_experts: int):
    """For ``expert_ids`` ``[T, K]``, yield ``(expert, token_rows, slot_flat_indices)`` for each expert hit."""
    flat = expert_ids.reshape(-1).astype(np.int64, copy=False)
    if flat.size and (flat.min() < 0 or flat.max() >= num_experts):
        raise ValueError(f"expert id out of range 0..{num_experts - 1}")
    top_k = expert_ids.shape[-1]
    order = np.argsort(flat, kind="stable")
    counts = np.bincount(flat, minlength=num_experts)
    start = 0
    for expert in np.flatnonzero(counts):
        stop = start + counts[expert]
        slots = order[start:stop]
        yield int(expert), slots // top_k, slots
        start = stop
