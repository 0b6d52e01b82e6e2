"""The direct (``O_DIRECT``) weight writer: the bytes it leaves are those of the parts it was given, in order.

``save_rewritten`` streams large weights with ``graph_passes.data_writers._DirectWriter``; these tests give it
every kind of part a conversion produces (file ranges of a mapped source, strided column blocks of it, transposed
views, in-memory arrays, raw bytes) with buffers small enough that parts, and single rows, straddle buffers,
and compare the file with the parts' bytes computed here by plain numpy copies.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from graph_passes import data_writers, model_io
from graph_passes.convert import convert
from graph_passes.data_writers import _DirectWriter
from graph_passes.model_io import save_rewritten
from ndp_io import OutputWriteError
from sample_models.build_samples import MoEBlockSpec, build_moe_decoder

CHUNK = 2 * data_writers.DIRECT_ALIGN  # 8 KiB buffers: a 64 x 48 float16 column block spans several


def _source(tmp_path: Path, dtype: np.dtype, rows: int, cols: int, seed: int) -> tuple[np.ndarray, np.memmap]:
    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(dtype)
    path = tmp_path / f"source.{np.dtype(dtype).name}.bin"
    path.write_bytes(b"\x07" * 3 + values.tobytes())  # an odd offset: file ranges need not be aligned
    return values, np.memmap(path, dtype=dtype, mode="r", offset=3, shape=(rows, cols))


def _parts(mapped: np.ndarray) -> list[np.ndarray]:
    cols = mapped.shape[1]
    return [
        mapped[5:37],  # contiguous rows of the mapped file: a file range
        mapped[:, cols // 4 : cols // 2],  # a column block: strided rows
        mapped[:, 1:].T,  # a transposing view
        np.arange(1000, dtype=np.int64),  # an in-memory array
        mapped[3:4, 7:11],  # a few bytes
        mapped[:, : cols // 4],
        mapped[:, ::3],  # rows not contiguous within
        mapped[-1],  # the last row: a short file range
    ]


def _skip_without_direct_io(directory: Path) -> None:
    with open(directory / "probe.bin", "wb") as probe:
        writer = _DirectWriter.open(probe, chunk_bytes=CHUNK, writers=1)
        if writer is None:
            pytest.skip(f"{directory} does not take O_DIRECT writes")
        with writer:
            writer.finish()
    (directory / "probe.bin").unlink()


def _write(path: Path, parts: list, chunk: int = CHUNK, writers: int = 3) -> _DirectWriter:
    with open(path, "wb") as data_file:
        writer = _DirectWriter.open(data_file, chunk_bytes=chunk, writers=writers)
        if writer is None:
            pytest.skip(f"{path.parent} does not take O_DIRECT writes")
        with writer:
            for part in parts:
                if isinstance(part, bytes):
                    writer.write_bytes(part)
                else:
                    writer.write_array(part, "t")
            writer.finish()
        assert data_file.tell() == writer.position
    return writer


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_direct_writer_leaves_the_bytes_of_each_part_in_order(tmp_path, dtype):
    values, mapped = _source(tmp_path, dtype, 64, 48, seed=1)
    parts = [*_parts(mapped), b"tail bytes"]
    expected = b"".join(p if isinstance(p, bytes) else np.ascontiguousarray(np.asarray(p)).tobytes() for p in parts)
    writer = _write(tmp_path / "out.bin", parts)
    assert (tmp_path / "out.bin").read_bytes() == expected
    assert writer.position == len(expected)
    # the parts really are what the conversion hands over: slices of the source's values
    assert np.ascontiguousarray(parts[1]).tobytes() == values[:, 12:24].tobytes()


def test_direct_writer_with_one_writer_and_a_row_longer_than_a_buffer(tmp_path):
    _, mapped = _source(tmp_path, np.float32, 8, 3000, seed=2)  # 12,000-byte rows, 8 KiB buffers
    parts = [mapped[:, 1:2999], mapped[2:5], mapped[:, ::2]]
    expected = b"".join(np.ascontiguousarray(p).tobytes() for p in parts)
    _write(tmp_path / "out.bin", parts, writers=1)
    assert (tmp_path / "out.bin").read_bytes() == expected


def test_a_refused_direct_write_is_made_through_the_page_cache(tmp_path, monkeypatch):
    _, mapped = _source(tmp_path, np.float16, 64, 48, seed=3)
    parts = _parts(mapped)
    expected = b"".join(np.ascontiguousarray(p).tobytes() for p in parts)
    real_pwrite = os.pwrite
    refused: list[int] = []

    def pwrite(fd, data, offset):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")  # a file system taking O_DIRECT but not the write
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    writer = _write(tmp_path / "out.bin", parts)
    assert refused and not writer.direct
    assert (tmp_path / "out.bin").read_bytes() == expected


@pytest.mark.parametrize("window", [data_writers.MAP_WINDOW_BYTES, 8192])  # 8 KiB: ranges cross window boundaries
def test_aligned_file_ranges_go_to_the_disk_from_a_mapping_of_the_source(tmp_path, monkeypatch, window):
    _skip_without_direct_io(tmp_path)
    monkeypatch.setattr(data_writers, "MAP_WINDOW_BYTES", window)
    values = np.random.default_rng(4).standard_normal((64, 1024)).astype(np.float32)  # 4 KiB rows
    path = tmp_path / "aligned.bin"
    path.write_bytes(values.tobytes())
    mapped = np.memmap(path, dtype=np.float32, mode="r", shape=values.shape)
    # rows 0-4, 16-39 and 1 reach aligned places of the file (the column block before them is 8 KiB); the last
    # rows follow 400 bytes and are copied
    parts = [mapped[:5], mapped[8:12, :512], mapped[16:40], mapped[1], mapped[3:4, :100], mapped[40:64]]
    expected = b"".join(np.ascontiguousarray(p).tobytes() for p in parts)
    real_write_mapped = _DirectWriter._write_mapped
    from_mappings: list[int] = []

    def spy(self, chunk, length):
        from_mappings.append(length)
        return real_write_mapped(self, chunk, length)

    monkeypatch.setattr(_DirectWriter, "_write_mapped", spy)
    _write(tmp_path / "out.bin", parts)
    assert (tmp_path / "out.bin").read_bytes() == expected
    assert sum(from_mappings) == (5 + 24 + 1) * 4096
    real_mmap = mmap.mmap  # the module the writer imports on use

    def refuse(fileno, length, *args, **kwargs):
        if fileno != -1:
            raise OSError(errno.ENODEV, "No such device")  # a source that cannot be mapped: read instead
        return real_mmap(fileno, length, *args, **kwargs)

    monkeypatch.setattr(mmap, "mmap", refuse)
    from_mappings.clear()
    _write(tmp_path / "out2.bin", parts)
    assert (tmp_path / "out2.bin").read_bytes() == expected
    assert from_mappings == []


@pytest.fixture(scope="module")
def external_model(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("direct")
    path = directory / "decoder.onnx"
    specs = (MoEBlockSpec(num_experts=8, hidden=64, ffn=256),)
    onnx.save(build_moe_decoder(specs, seed=5), str(path), save_as_external_data=True, location="weights.bin")
    return path


def test_saved_weights_are_the_same_bytes_direct_or_through_the_page_cache(external_model, tmp_path, monkeypatch):
    rewritten, _ = convert(external_model, shards=2)
    (tmp_path / "cached").mkdir()
    _, cached = save_rewritten(rewritten, tmp_path / "cached" / "m.onnx", external=True)
    monkeypatch.setattr(model_io, "DIRECT_MIN_BYTES", 0)
    monkeypatch.setattr(data_writers, "DIRECT_CHUNK_BYTES", CHUNK)
    used: list[bool] = []
    real_open = _DirectWriter.open.__func__

    def spy(cls, data_file, chunk_bytes=None, writers=None):
        writer = real_open(cls, data_file, chunk_bytes, writers)
        used.append(writer is not None)
        return writer

    monkeypatch.setattr(_DirectWriter, "open", classmethod(spy))
    (tmp_path / "direct").mkdir()
    _, direct = save_rewritten(convert(external_model, shards=2)[0], tmp_path / "direct" / "m.onnx", external=True)
    if used != [True]:
        pytest.skip(f"{tmp_path} does not take O_DIRECT writes")
    assert direct.read_bytes() == cached.read_bytes()


def test_a_full_disk_while_writing_direct_is_one_error_and_leaves_no_files(external_model, tmp_path, monkeypatch):
    _skip_without_direct_io(tmp_path)
    rewritten, _ = convert(external_model, shards=2)
    monkeypatch.setattr(model_io, "DIRECT_MIN_BYTES", 0)
    monkeypatch.setattr(data_writers, "DIRECT_CHUNK_BYTES", CHUNK)

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(OutputWriteError, match="No space left"):
        save_rewritten(rewritten, out_dir / "m.onnx", external=True)
    assert list(out_dir.iterdir()) == []
