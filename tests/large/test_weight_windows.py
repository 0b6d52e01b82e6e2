"""WeightStore reads experts of external tensors as windows of one mapping per data file.

What the conversion of a large model relies on: each window is the exact file range of its expert (the writer
copies C-contiguous views of it file to file), and the pages a window touched leave this process once the
window and every view of it are dropped (peak RSS stays one expert's worth, not the whole file).
"""

from __future__ import annotations

import gc
import mmap
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from graph_passes import weights
from graph_passes.data_writers import file_range_of
from graph_passes.weights import WeightStore

EXPERTS, ROWS, COLS = 4, 8, 1024  # 32 KiB per float32 expert (whole pages), 128 KiB in all: not inlined


def _store(tmp_path: Path, values: dict[str, np.ndarray]) -> WeightStore:
    """A store over a model whose initializers ``values`` all live in ``weights.bin``."""
    graph = helper.make_graph([], "g", [], [], [numpy_helper.from_array(v, n) for n, v in values.items()])
    model = helper.make_model(graph)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    return WeightStore(onnx.load(str(path), load_external_data=False), tmp_path)


def _mapped_pages(address: int, length: int) -> int:
    """How many pages of ``[address, address + length)`` this process has mapped (``/proc/self/pagemap``'s present
    bit, Linux)."""
    page = mmap.PAGESIZE
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(address // page * 8)
        entries = np.frombuffer(pagemap.read(length // page * 8), dtype=np.uint64)
    return int(np.count_nonzero(entries >> np.uint64(63)))


def test_expert_windows_are_the_experts_file_ranges(tmp_path):
    rng = np.random.default_rng(7)
    small = rng.standard_normal(10).astype(np.float32)  # shifts the stacked tensor off a page boundary
    stacked = rng.standard_normal((EXPERTS, ROWS, COLS)).astype(np.float32)
    store = _store(tmp_path, {"small": small, "s": stacked})
    path, offset, _ = store.external_location("s")
    expert_bytes = ROWS * COLS * 4
    for expert in (2, 0, 3):
        view = store.expert("s", expert)
        assert np.array_equal(view, stacked[expert])
        assert file_range_of(view) == (path, offset + expert * expert_bytes, expert_bytes)
        rows = view[3:5]  # a row block, as a shard of an [out, in] matrix is
        assert file_range_of(rows) == (path, offset + expert * expert_bytes + 3 * COLS * 4, 2 * COLS * 4)
        assert file_range_of(view[:, :16]) is None  # a column block is strided: copied, not a file range
    assert np.array_equal(store.full("s"), stacked)
    assert len(store._mapped) == 1  # every window of the file shares one mapping


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/pagemap")
def test_window_pages_leave_the_process_when_its_last_view_is_dropped(tmp_path, monkeypatch):
    stacked = np.arange(EXPERTS * ROWS * COLS, dtype=np.float32).reshape(EXPERTS, ROWS, COLS)
    store = _store(tmp_path, {"s": stacked})
    released: list[tuple[int, int]] = []
    real_release = weights._release
    monkeypatch.setattr(
        weights, "_release", lambda m, start, length: (released.append((start, length)), real_release(m, start, length))
    )

    view = store.expert("s", 1)
    address, expert_bytes = view.__array_interface__["data"][0], ROWS * COLS * 4
    assert float(view.sum()) == float(stacked[1].sum())  # touches every page of expert 1
    assert _mapped_pages(address, expert_bytes) == expert_bytes // mmap.PAGESIZE
    rows = view[2:4].T  # a view of the window keeps it, and its pages, alive
    del view
    gc.collect()
    assert released == []
    assert float(rows.sum()) == float(stacked[1, 2:4].sum())
    del rows
    gc.collect()
    assert len(released) == 1
    assert _mapped_pages(address, expert_bytes) == 0
