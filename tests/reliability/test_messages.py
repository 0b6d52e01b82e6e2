"""Messages that confused without being wrong now say what is wrong (issue 32, "messages"): a big-endian feed, an
output that cannot be written found only after the work. (A byte-order mark, a subnormal bandwidth and ``--hw
DIR``: tests/reliability/test_limits.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from ndp_ep import InferenceSession
from ndp_ep.cli import main
from ndp_ep.errors import FeedError

REPO = Path(__file__).resolve().parents[2]


def _int64_model() -> bytes:
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Identity", ["ids"], ["out"])],
        "g",
        [value("ids", TensorProto.INT64, [2])],
        [value("out", TensorProto.INT64, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_big_endian_feed_runs_with_its_values(tmp_path, capsys):
    # ONNX Runtime alone reads the bytes in the machine's order: [1, 2] big-endian ran as [2**56, 2**57]
    session = InferenceSession(_int64_model())
    assert session.run(None, {"ids": np.array([1, 2], dtype=">i8")})[0].tolist() == [1, 2]
    model, feeds, outputs = tmp_path / "m.onnx", tmp_path / "f.npz", tmp_path / "o.npz"
    model.write_bytes(_int64_model())
    np.savez(feeds, ids=np.array([3, 4], dtype=">i8"))
    assert main(["run", str(model), "--inputs", str(feeds), "--outputs", str(outputs)]) == 0
    with np.load(outputs) as saved:
        assert saved["out"].tolist() == [3, 4]


def test_a_feed_of_the_right_type_in_the_wrong_byte_order_is_named_as_such():
    from ndp_ep.session import InferenceSession as Session

    session = Session(_int64_model())
    with pytest.raises(FeedError, match="byte order, got big-endian int64") as caught:
        session._check_feeds({"ids": (np.dtype(">i8"), (2,))})
    assert "astype('<i8')" in str(caught.value)


def _work_never_starts(monkeypatch, module: str, name: str) -> list:
    calls: list = []
    monkeypatch.setattr(f"{module}.{name}", lambda *a, **k: calls.append(a) or pytest.fail("the work started"))
    return calls


@pytest.mark.parametrize("command", ["bench", "sweep"])
def test_an_unwritable_out_directory_is_refused_before_the_work(tmp_path, capsys, monkeypatch, command):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    grid = REPO / "docs" / "sweep_example.toml"
    module, name = ("hw_model.bench", "run_bench") if command == "bench" else ("hw_model.sweep", "run_sweep")
    calls = _work_never_starts(monkeypatch, module, name)
    argv = ["bench", "--quick"] if command == "bench" else ["sweep", str(grid)]
    assert main([*argv, "--out", str(blocker / "plots")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert calls == []


@pytest.mark.parametrize("command", ["bench", "sweep"])
def test_a_json_out_in_a_directory_without_write_permission_is_refused_before_the_work(
    tmp_path, capsys, monkeypatch, command
):
    locked = tmp_path / "locked"
    locked.mkdir()
    import ndp_io.guard

    real_access = ndp_io.guard.os.access
    # the tests may run as root, whom permissions do not stop: the directory reads as not writable
    monkeypatch.setattr(ndp_io.guard.os, "access", lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    module, name = ("hw_model.bench", "run_bench") if command == "bench" else ("hw_model.sweep", "run_sweep")
    calls = _work_never_starts(monkeypatch, module, name)
    if command == "bench":
        argv = ["bench", "--quick", "--json-out", str(locked / "r.json")]
    else:
        argv = ["sweep", str(REPO / "docs" / "sweep_example.toml"), "--out", str(locked / "out")]
    assert main(argv) == 2
    assert "permission denied" in capsys.readouterr().err
    assert calls == []
