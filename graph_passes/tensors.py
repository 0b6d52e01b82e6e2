"""An initializer's size and where its external data lies: element counts, byte sizes (sub-byte types packed) and
the checked, contained file range of external data.

The base :mod:`graph_passes.model_io` (reading and saving models), :mod:`graph_passes.model_check`,
:mod:`graph_passes.weights` and :mod:`graph_passes.rewrite` build on, so that none of them imports another for it.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path, PureWindowsPath

import numpy as np
import onnx
from onnx import TensorProto

from graph_passes.errors import InvalidModelError, UnsafeModelError

_DIGITS = re.compile(r"^[0-9]+$")


def external_data_path(base_dir: str | os.PathLike[str], location: str, tensor: str = "?") -> Path:
    """The real path of an external-data ``location`` of ``tensor``, which must be a file inside ``base_dir``.

    Raises :class:`UnsafeModelError` for an absolute path, a ``..`` component or a symbolic link resolving
    out of ``base_dir``, and :class:`InvalidModelError` for a missing file, a symlink loop or a non-file.
    """
    if not location or "\0" in location:
        raise InvalidModelError(f"initializer {tensor!r}: external data location {location!r} is not a file name")
    posix = location.replace("\\", "/")
    if os.path.isabs(location) or posix.startswith("/") or PureWindowsPath(location).drive:
        raise UnsafeModelError(
            f"initializer {tensor!r}: external data location {location!r} is an absolute path; "
            "it must name a file inside the model's directory"
        )
    if ".." in posix.split("/"):
        raise UnsafeModelError(
            f"initializer {tensor!r}: external data location {location!r} leaves the model's directory"
        )
    base_real = os.path.realpath(base_dir)
    candidate = Path(base_dir) / posix
    try:
        real = Path(os.path.realpath(candidate, strict=True))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InvalidModelError(
                f"initializer {tensor!r}: external data {location!r} is a symbolic link loop"
            ) from None
        if exc.errno == errno.EACCES:
            raise InvalidModelError(f"initializer {tensor!r}: external data {location!r}: permission denied") from None
        raise InvalidModelError(f"initializer {tensor!r}: external data file {location!r} not found") from None
    if os.path.commonpath([str(real), base_real]) != base_real:
        raise UnsafeModelError(
            f"initializer {tensor!r}: external data {location!r} is a symbolic link out of the model's directory"
        )
    if not real.is_file():
        raise InvalidModelError(f"initializer {tensor!r}: external data {location!r} is not a regular file")
    return real


def external_entries(tensor: TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


PACKED_BITS = {  # sub-byte types, packed along the flattened tensor (the last byte padded)
    getattr(TensorProto, name): bits
    for name, bits in (
        ("UINT4", 4),
        ("INT4", 4),
        ("FLOAT4E2M1", 4),
        ("UINT2", 2),
        ("INT2", 2),
        ("FLOAT6E2M3", 6),
        ("FLOAT6E3M2", 6),
    )
    if hasattr(TensorProto, name)
}


def element_count(tensor: TensorProto) -> int:
    """The number of elements ``tensor``'s dims declare (exact integer arithmetic; negative dims refused)."""
    count = 1
    for dim in tensor.dims:
        if dim < 0:
            raise InvalidModelError(f"initializer {tensor.name!r} has a negative dimension {list(tensor.dims)}")
        count *= int(dim)
    return count


def tensor_nbytes(tensor: TensorProto) -> int:
    """Bytes ``tensor``'s dims and dtype call for (sub-byte types packed; exact integers, no overflow)."""
    count = element_count(tensor)
    bits = PACKED_BITS.get(tensor.data_type)
    if bits is not None:
        return (count * bits + 7) // 8
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        raise InvalidModelError(f"initializer {tensor.name!r} has an unknown data type {tensor.data_type}") from None
    return count * itemsize


def external_range(tensor: TensorProto, base_dir: str | os.PathLike[str] | None) -> tuple[Path, int, int]:
    """``(file, offset, length)`` of an external tensor, checked: contained file, the range inside it, and a
    length equal to what the tensor's dims need."""
    if base_dir is None:
        raise InvalidModelError(f"initializer {tensor.name!r} uses external data but the model has no directory")
    entries = external_entries(tensor)
    path = external_data_path(base_dir, entries.get("location", ""), tensor.name)
    for key in ("offset", "length"):
        if key in entries and not _DIGITS.match(entries[key].strip()):
            raise InvalidModelError(
                f"initializer {tensor.name!r}: external data {key} {entries[key]!r} is not a non-negative integer"
            )
    offset = int(entries.get("offset", "0"))
    needed = tensor_nbytes(tensor)
    length = int(entries["length"]) if "length" in entries else needed
    if length != needed:
        raise InvalidModelError(
            f"initializer {tensor.name!r}: external data has length {length}, its shape needs {needed} bytes"
        )
    size = path.stat().st_size
    if offset + needed > size:
        raise InvalidModelError(
            f"initializer {tensor.name!r}: external data is truncated ({offset}+{needed} bytes, {path.name} has {size})"
        )
    return path, offset, needed


def external_data_files(model: onnx.ModelProto, base_dir: str | os.PathLike[str] | None) -> list[Path]:
    """The distinct (contained, existing) data files ``model``'s initializers reference."""
    files: dict[str, Path] = {}
    if base_dir is None:
        return []
    for tensor in model.graph.initializer:
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        location = external_entries(tensor).get("location", "")
        if location not in files:
            files[location] = external_data_path(base_dir, location, tensor.name)
    return list(files.values())
