"""Block-wise 4/8-bit weight quantization as ONNX Runtime's ``com.microsoft.QMoE`` stores it.

A quantized matrix is ``[rows, cols]`` with rows = output features and cols = input features. Its values are
unsigned ``bits``-bit integers packed along the last axis (two 4-bit values per byte, low nibble first), with
one scale per ``block`` consecutive inputs of a row (``[rows, ceil(cols / block)]``) and optional zero points
packed like the values (``[rows, ceil(ceil(cols / block) * bits / 8)]``). A value dequantizes as
``(q - zero_point) * scale``; without zero points the zero point is ``2**(bits-1)``. This is the layout
:mod:`graph_passes.sharded_op` keeps on disk for quantized shards; slicing helpers here cut shards on block
boundaries.

When ``cols`` is not a multiple of ``block`` the last block is partial: the values stay unpadded
(``packed_width(cols)`` bytes a row, as ONNX Runtime GenAI's builder stores them), the last scale covers the
``cols % block`` remaining inputs, and ONNX Runtime's CPU QMoE multiplies such a matrix in float (dequantize,
then SGEMM) even where it would quantize the activations of a whole-block one (:func:`int8_activations_apply`).
"""

from __future__ import annotations

import numpy as np

SUPPORTED_BITS = (4, 8)


def _check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"only 4- and 8-bit quantization is supported, got {bits}")


def packed_width(count: int, bits: int) -> int:
    """Bytes holding ``count`` values of ``bits`` bits."""
    _check_bits(bits)
    return (count * bits + 7) // 8


def block_count(cols: int, block: int) -> int:
    """Scales per row of ``cols`` inputs in blocks of ``block`` (the last one partial when ``block`` does not
    divide ``cols``)."""
    return -(-cols // block)


def int8_activations_apply(cols: int, block: int) -> bool:
    """Whether ONNX Runtime's CPU QMoE may quantize the activations of a matrix with ``cols`` inputs in blocks of
    ``block`` to int8 (MLAS QNBit CompInt8): only when every block is whole; a partial last block sends that
    matrix to dequantize + SGEMM (onnxruntime 1.32 ``QNBitGemmEligible``: "the input feature size is not a
    multiple of block_size")."""
    return block > 0 and cols % block == 0


def unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """``[..., packed_width(count)]`` uint8 → ``[..., count]`` uint8 values."""
    _check_bits(bits)
    packed = np.asarray(packed, dtype=np.uint8)
    if bits == 8:
        return packed[..., :count]
    values = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    values[..., 0::2] = packed & 0x0F
    values[..., 1::2] = packed >> 4
    return values[..., :count]


def pack(values: np.ndarray, bits: int) -> np.ndarray:
    """``[..., count]`` uint8 values (< 2**bits) → ``[..., packed_width(count)]`` uint8, low nibble first."""
    _check_bits(bits)
    values = np.asarray(values, dtype=np.uint8)
    if bits == 8:
        return values.copy()
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.zeros(values.shape[:-1] + (1,), np.uint8)], axis=-1)
    return (values[..., 0::2] & 0x0F) | (values[..., 1::2] << 4)


def dequantize(
    packed: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    bits: int,
    block: int,
    cols: int,
) -> np.ndarray:
    """The float32 ``[rows, cols]`` matrix of a packed ``[rows, packed_width(cols)]`` quantized one.

    ``block`` 0 means one scale per row (per-channel).
    """
    packed = np.asarray(packed, dtype=np.uint8)
    rows = packed.shape[0]
    block = block or cols
    blocks = block_count(cols, block)
    scales = np.asarray(scales).reshape(rows, -1).astype(np.float32, copy=False)
    if scales.shape[1] != blocks:
        raise ValueError(f"expected {blocks} scales per row for {cols} inputs in blocks of {block}, got {scales.shape}")
    if zero_points is None:
        zp = np.full((rows, blocks), 2 ** (bits - 1), np.float32)
    else:
        zp = unpack(np.asarray(zero_points).reshape(rows, -1), bits, blocks).astype(np.float32)
    padded = blocks * block
    out = np.empty((rows, padded), dtype=np.float32)
    values = out.reshape(rows, blocks, block)
    _unpack_into(packed, bits, cols, out)
    values -= zp[:, :, None]  # (q - zp) * scale, as before: exact difference, one rounding
    values *= scales[:, :, None]
    return out[:, :cols] if padded != cols else out


def _unpack_into(packed: np.ndarray, bits: int, cols: int, out: np.ndarray) -> None:
    """The first ``cols`` values of each packed row, as float32, into ``out[:, :cols]`` (a padded tail is zeroed),
    whole rows at a time: no per-block loop and no integer temporary the size of the matrix."""
    if bits == 8:
        out[:, :cols] = packed[:, :cols]
    else:
        pairs = cols // 2
        out[:, 0 : 2 * pairs : 2] = packed[:, :pairs] & 0x0F
        out[:, 1 : 2 * pairs : 2] = packed[:, :pairs] >> 4
        if cols % 2:
            out[:, cols - 1] = packed[:, pairs] & 0x0F
    out[:, cols:] = 0


def slice_inputs(packed: np.ndarray, bits: int, start: int, stop: int, copy: bool = True) -> np.ndarray:
    """Columns ``start:stop`` (input features) of a packed ``[rows, ...]`` matrix, repacked when not byte-aligned.

    ``copy=False``: a byte-aligned slice is a (strided) view of ``packed``, for a writer that copies it once."""
    _check_bits(bits)
    per_byte = 8 // bits
    if start % per_byte == 0 and (stop % per_byte == 0):
        view = packed[..., start // per_byte : stop // per_byte]
        return np.ascontiguousarray(view) if copy else view
    return pack(unpack(packed, bits, stop)[..., start:stop], bits)


def int8_activation_roundtrip(values: np.ndarray, block_size: int) -> np.ndarray:
    """``values`` as a block-quantized matrix multiply with int8 activations sees them (ONNX Runtime's MLAS
    CompInt8 path): each block of ``block_size`` along the last axis scaled to int8 by its absolute maximum
    (scale ``amax / 127``, round half to even) and back to float32. Multiplying the result by the dequantized
    weights gives that path's product up to float32 rounding. The last axis must be a multiple of the block."""
    a = np.asarray(values, dtype=np.float32)
    if a.shape[-1] % block_size:
        raise ValueError(f"last axis {a.shape[-1]} is not a multiple of the block size {block_size}")
    blocks = a.reshape(-1, block_size)
    amax = np.abs(blocks).max(axis=1)
    safe = np.where(amax > 0, amax, np.float32(1))
    inverse = np.where(amax > 0, np.float32(127) / safe, np.float32(0)).astype(np.float32)
    quantized = np.rint(blocks * inverse[:, None])
    return (quantized * (amax / np.float32(127))[:, None]).astype(np.float32).reshape(a.shape)
