"""``--inputs`` archives are read headers first, bounded by memory, never unpickled (issue 11, item 5)."""

from __future__ import annotations

import io
import time
import zipfile

import numpy as np
import pytest

from ndp_ep.cli import main
from ndp_ep.errors import FeedError
from ndp_ep.feeds_io import load_feeds


def _npy_bytes(header_shape, dtype="<f4", payload=b""):
    """A .npy file whose header claims ``header_shape`` regardless of the payload that follows."""
    header = {"descr": dtype, "fortran_order": False, "shape": tuple(header_shape)}
    stream = io.BytesIO()
    np.lib.format.write_array_header_1_0(stream, header)
    return np.lib.format.magic(1, 0) + stream.getvalue()[len(np.lib.format.magic(1, 0)) :] + payload


def _zip(path, members, compression=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_round_trip_equals_numpy(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        "ids": rng.integers(0, 100, (2, 5)),
        "x": rng.standard_normal((3, 4)).astype(np.float16),
        "f": np.asfortranarray(rng.standard_normal((3, 2))),
        "scalar": np.float32(2.5),
    }
    np.savez_compressed(tmp_path / "f.npz", **arrays)
    loaded = load_feeds(tmp_path / "f.npz")
    assert loaded.keys() == arrays.keys()
    for name, value in arrays.items():
        assert loaded[name].dtype == np.asarray(value).dtype
        np.testing.assert_array_equal(loaded[name], value)


def test_empty_file(tmp_path):
    (tmp_path / "e.npz").write_bytes(b"")
    with pytest.raises(FeedError, match="empty"):
        load_feeds(tmp_path / "e.npz")


def test_empty_archive(tmp_path):
    np.savez(tmp_path / "e.npz")
    with pytest.raises(FeedError, match="no arrays"):
        load_feeds(tmp_path / "e.npz")


def test_a_single_npy_is_named_as_such(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros(3))
    with pytest.raises(FeedError, match=r"single \.npy"):
        load_feeds(tmp_path / "a.npy")


def test_a_header_claiming_10_to_the_12_elements_is_refused_before_reading(tmp_path):
    path = _zip(tmp_path / "big.npz", {"x.npy": _npy_bytes((10**12,), payload=b"\0" * 16)})
    with pytest.raises(FeedError, match=r"declares 3\.6 TiB of arrays"):  # 8e12 bytes of float64
        load_feeds(path)


def _bomb(path):
    """A member whose header claims 2 GiB of zeros, followed by 64 MiB of them deflated to well under 1 MiB."""
    claimed = 2 << 30
    chunk = np.zeros(1 << 24, np.uint8).tobytes()
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:  # noqa: SIM117
        with archive.open("x.npy", "w", force_zip64=True) as member:
            member.write(_npy_bytes((claimed,), dtype="|u1"))
            for _ in range(4):  # 64 MiB actually follow: a reader trusting the data would inflate them all
                member.write(chunk)
    assert path.stat().st_size < 1 << 20
    return path


@pytest.fixture(scope="module")
def bomb(tmp_path_factory):
    return _bomb(tmp_path_factory.mktemp("bomb") / "bomb.npz")


def test_a_decompression_bomb_is_refused_from_its_header(bomb):
    started = time.perf_counter()
    with pytest.raises(FeedError, match=r"declares 2\.0 GiB of arrays, more than the 1\.0 GiB allowed"):
        load_feeds(bomb, max_bytes=1 << 30)
    assert time.perf_counter() - started < 0.5


def test_cli_refuses_the_bomb_when_memory_is_short(bomb, samples_dir, capsys, monkeypatch):
    import ndp_ep.feeds_io

    monkeypatch.setattr(ndp_ep.feeds_io, "available_memory_bytes", lambda: 2 << 30)  # half: 1 GiB allowed
    assert main(["run", str(samples_dir / "moe_block.onnx"), "--inputs", str(bomb)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "declares 2.0 GiB of arrays, more than the 1.0 GiB allowed" in err


def test_data_shorter_or_longer_than_the_header(tmp_path):
    short = _zip(tmp_path / "s.npz", {"x.npy": _npy_bytes((4,), payload=b"\0" * 8)})
    with pytest.raises(FeedError, match="ends before"):
        load_feeds(short)
    long = _zip(tmp_path / "l.npz", {"x.npy": _npy_bytes((1,), payload=b"\0" * 8)})
    with pytest.raises(FeedError, match="more bytes"):
        load_feeds(long)


def test_object_arrays_are_never_unpickled(tmp_path):
    path = _zip(tmp_path / "o.npz", {"x.npy": _npy_bytes((1,), dtype="|O", payload=b"\x80\x04N.")})
    with pytest.raises(FeedError, match="pickles"):
        load_feeds(path)


def test_garbage_and_a_directory(tmp_path):
    (tmp_path / "g.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(FeedError, match="not a readable"):
        load_feeds(tmp_path / "g.npz")
    with pytest.raises(FeedError, match="directory"):
        load_feeds(tmp_path)


@pytest.mark.parametrize("kind", ["empty", "npy", "huge"])
def test_cli_run_inputs_one_line_exit_2(tmp_path, samples_dir, capsys, kind):
    path = tmp_path / "in.npz"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "npy":
        np.save(path.with_suffix(".npy"), np.zeros(3))
        path = path.with_suffix(".npy")
    else:
        _zip(path, {"hidden_states.npy": _npy_bytes((10**12,))})
    assert main(["run", str(samples_dir / "moe_block.onnx"), "--inputs", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ndp-ep run: error:")
