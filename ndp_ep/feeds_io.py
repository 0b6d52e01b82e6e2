"""Reading input feeds from ``.npz`` files safely (headers first, no pickles) and writing outputs atomically."""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path

import numpy as np

from ndp_ep.errors import FeedError
from ndp_io import atomic_write, available_memory_bytes

MAX_MEMBERS = 4096
NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header; an empty archive's end record


def load_feeds(path: str | Path, max_bytes: int | None = None) -> dict[str, np.ndarray]:
    """Read named arrays from an ``.npz`` archive safely; every problem is a one-line :class:`FeedError`.

    Each member's ``.npy`` header is read before its data: object dtypes (pickles) are refused, and the
    arrays' total size must fit in ``max_bytes`` (default: half the memory available now), so a header
    claiming 10^12 elements or a decompression bomb is refused before anything large is allocated or
    decompressed. Only the bytes the header promises are decompressed, and they must all be there.
    """
    path = Path(path)
    budget = available_memory_bytes() // 2 if max_bytes is None else max_bytes
    try:
        if path.is_dir():
            raise FeedError(f"feeds path is a directory: {path}")
        if not stat.S_ISREG(path.stat().st_mode):  # before opening: a FIFO would block the open forever
            raise FeedError(f"feeds path is not a regular file: {path}")
        with open(path, "rb") as handle:
            magic = handle.read(6)
    except FileNotFoundError:
        raise FeedError(f"no such feeds file: {path}") from None
    except OSError as exc:
        raise FeedError(f"cannot read feeds file {path}: {(exc.strerror or type(exc).__name__).lower()}") from None
    if not magic:
        raise FeedError(f"feeds file {path} is empty")
    if magic == NPY_MAGIC:
        raise FeedError(f"{path} is a single .npy array; save feeds as an .npz archive of named arrays (np.savez)")
    if not magic.startswith(ZIP_MAGICS):
        raise FeedError(f"{path} is not an .npz archive of named arrays")
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            if not members:
                raise FeedError(f"feeds file {path} holds no arrays")
            if len(members) > MAX_MEMBERS:
                raise FeedError(f"feeds file {path} holds {len(members)} entries (at most {MAX_MEMBERS})")
            headers = [_member_header(archive, member, path) for member in members]
            total = sum(nbytes for _, _, _, nbytes in headers)
            if total > budget:
                from ndp_ep.text import human_bytes

                raise FeedError(
                    f"feeds file {path} declares {human_bytes(total)} of arrays, more than the "
                    f"{human_bytes(budget)} allowed (half the available memory)"
                )
            feeds: dict[str, np.ndarray] = {}
            for member, (shape, fortran, dtype, nbytes) in zip(members, headers, strict=True):
                name = member.filename[: -len(".npy")] if member.filename.endswith(".npy") else member.filename
                if name in feeds:
                    raise FeedError(f"feeds file {path} holds two arrays named {name!r}")
                feeds[name] = _member_data(archive, member, shape, fortran, dtype, nbytes, path)
            return feeds
    except FeedError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, ValueError, OSError, EOFError) as exc:
        raise FeedError(f"{path} is not a readable .npz archive ({type(exc).__name__})") from None


def _member_header(archive: zipfile.ZipFile, member: zipfile.ZipInfo, path: Path) -> tuple:
    """``(shape, fortran_order, dtype, nbytes)`` from one member's ``.npy`` header, reading nothing more."""
    with archive.open(member) as stream:
        try:
            version = np.lib.format.read_magic(stream)
            reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = reader(stream, max_header_size=10_000)
        except (ValueError, EOFError, SyntaxError, TypeError) as exc:
            raise FeedError(f"{path}: entry {member.filename!r} is not a .npy array ({type(exc).__name__})") from None
    if dtype.hasobject:
        raise FeedError(f"{path}: entry {member.filename!r} holds Python objects (pickles are not read)")
    count = 1
    for dim in shape:
        count *= int(dim)
    return shape, fortran, dtype, count * dtype.itemsize


def _member_data(archive, member, shape, fortran: bool, dtype: np.dtype, nbytes: int, path: Path) -> np.ndarray:
    with archive.open(member) as stream:
        version = np.lib.format.read_magic(stream)
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        reader(stream, max_header_size=10_000)
        buffer = bytearray(nbytes)
        view = memoryview(buffer)
        filled = 0
        while filled < nbytes:
            got = stream.readinto(view[filled:])
            if not got:
                raise FeedError(f"{path}: entry {member.filename!r} ends before its {nbytes} bytes")
            filled += got
        if stream.read(1):
            raise FeedError(f"{path}: entry {member.filename!r} holds more bytes than its header declares")
    array = np.frombuffer(buffer, dtype=dtype)
    return array.reshape(shape, order="F" if fortran else "C")


def save_arrays(path: str | Path, arrays: dict[str, np.ndarray]) -> Path:
    """``np.savez`` to ``path`` atomically (:func:`ndp_io.atomic_write`)."""
    with atomic_write(path) as stream:
        np.savez(stream, **arrays)
    return Path(path)
