"""Reference numerics of MoE experts, shared by the verifier and the provider's kernels.

Activations operate on float32 numpy arrays. :func:`canonical_matrix` turns one expert's slice of an
exported weight (``[out, in]`` or ``[in, out]``, possibly with gate/up halves or interleaved rows) into
the ``x @ W`` form ``[in, out]`` that the sharded ops use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from graph_passes.plan import MoEBlockPlan, StackedBias, StackedMatrix

_SQRT_2_OVER_PI = np.float32(np.sqrt(2.0 / np.pi))


def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf
    except ImportError:  # pragma: no cover - scipy is a dependency
        return np.vectorize(__import__("math").erf, otypes=[np.float32])(x)
    return erf(x).astype(np.float32, copy=False)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x))).astype(np.float32, copy=False)


def plain_activation(name: str, x: np.ndarray) -> np.ndarray:
    """``relu``, ``gelu`` (erf), ``gelu_tanh`` or ``silu`` of ``x``."""
    if name == "relu":
        return np.maximum(x, np.float32(0))
    if name == "gelu":
        return (np.float32(0.5) * x * (np.float32(1) + _erf(x / np.float32(np.sqrt(2.0))))).astype(np.float32)
    if name == "gelu_tanh":
        inner = _SQRT_2_OVER_PI * (x + np.float32(0.044715) * x * x * x)
        return (np.float32(0.5) * x * (np.float32(1) + np.tanh(inner))).astype(np.float32)
    if name == "silu":
        return x * sigmoid(x)
    raise ValueError(f"unknown activation {name!r}")


def gated_activation(name: str, gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """The GLU product of ``gate`` and ``up`` projections for ``silu_glu``, ``gelu_glu``, ``swiglu_clamp``."""
    if name == "silu_glu":
        return gate * sigmoid(gate) * up
    if name == "gelu_glu":
        return plain_activation("gelu", gate) * up
    if name == "swiglu_clamp":
        gate = np.minimum(gate, np.float32(limit))
        up = np.clip(up, np.float32(-limit), np.float32(limit))
        return (up + np.float32(1)) * (gate * sigmoid(np.float32(alpha) * gate))
    raise ValueError(f"unknown gated activation {name!r}")


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


TRANSPOSE_TILE_ROWS = 64


def transpose_blocked(matrix: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``matrix.T`` as a C-contiguous array, copied a band of rows at a time.

    numpy's element-wise transposing copy of a large matrix misses the cache on every write; copying
    bands of 64 source rows keeps both sides cache-resident and is several times faster.
    """
    rows, cols = matrix.shape
    if out is None:
        out = np.empty((cols, rows), dtype=matrix.dtype)
    for start in range(0, rows, TRANSPOSE_TILE_ROWS):
        out[:, start : start + TRANSPOSE_TILE_ROWS] = matrix[start : start + TRANSPOSE_TILE_ROWS].T
    return out


def copy_blocked(view: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """A C-contiguous copy of the 2-D ``view`` (any strides); bands of columns when it is a transpose."""
    if out is None:
        out = np.empty(view.shape, dtype=view.dtype)
    if view.ndim != 2 or abs(view.strides[0]) >= abs(view.strides[1]):
        out[...] = view
        return out
    for start in range(0, view.shape[1], TRANSPOSE_TILE_ROWS):
        out[:, start : start + TRANSPOSE_TILE_ROWS] = view[:, start : start + TRANSPOSE_TILE_ROWS]
    return out


def canonical_view(raw_expert: np.ndarray, matrix: StackedMatrix) -> np.ndarray:
    """One expert's matrix as ``[in, out]`` (``x @ W``) float32, as a view of ``raw_expert`` where possible.

    Slice it and copy the slice with :func:`copy_blocked` to get a contiguous shard in one pass.
    """
    w = raw_expert.T if matrix.layout == "out_in" else raw_expert
    return select_columns(w.astype(np.float32, copy=False), matrix.columns)


def canonical_matrix(raw_expert: np.ndarray, matrix: StackedMatrix) -> np.ndarray:
    """One expert's matrix as ``[in, out]`` (``x @ W``), contiguous float32."""
    if matrix.layout == "out_in" and raw_expert.ndim == 2:
        # columns of W = rows of the [out, in] source: select rows, then transpose once
        rows = select_columns(raw_expert.T, matrix.columns).T
        return transpose_blocked(rows.astype(np.float32, copy=False))
    w = raw_expert.T if matrix.layout == "out_in" else raw_expert
    return np.ascontiguousarray(select_columns(w, matrix.columns), dtype=np.float32)


def canonical_bias(raw_expert: np.ndarray, bias: StackedBias) -> np.ndarray:
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

    With ``views`` the matrices are :func:`canonical_view` s of what ``read_expert`` returned (no copy).
    """
    w = plan.weights
    to_canonical = canonical_view if views else canonical_matrix

    def matrix(m: StackedMatrix | None) -> np.ndarray | None:
        if m is None:
            return None
        raw = read_expert(m.per_expert[expert], -1) if m.per_expert else read_expert(m.initializer, expert)
        return to_canonical(raw, m)

    def bias(b: StackedBias | None) -> np.ndarray | None:
        return None if b is None else canonical_bias(read_expert(b.initializer, expert), b)

    return ExpertArrays(
        up=matrix(w.up),
        down=matrix(w.down),
        gate=matrix(w.gate),
        up_bias=bias(w.up_bias),
        gate_bias=bias(w.gate_bias),
        down_bias=bias(w.down_bias),
    )


def expert_ffn(plan: MoEBlockPlan, x: np.ndarray, weights: ExpertArrays) -> np.ndarray:
    """One expert applied to ``x`` ``[n, H]``."""
    u = x @ weights.up
    if weights.up_bias is not None:
        u = u + weights.up_bias
    if plan.gated:
        g = x @ weights.gate
        if weights.gate_bias is not None:
            g = g + weights.gate_bias
        act = gated_activation(plan.activation, g, u, plan.activation_alpha, plan.activation_limit)
    else:
        act = plain_activation(plan.activation, u)
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
