"""Blocks too large to check whole are checked while the conversion is written, and nothing is committed until
every such check has confirmed the reading its block was rewritten on; otherwise the model is converted again,
checking first, so the result is exactly what checking first gives."""

from __future__ import annotations

import threading
from pathlib import Path

import onnx
import pytest

import ndp_ep.convert as ndp_convert
from graph_passes import verify
from graph_passes.convert import convert, plan_conversion
from ndp_ep.errors import ConversionError

BLOCK = Path(__file__).resolve().parents[2] / "sample_models" / "hf" / "mixtral_block_dynamo.onnx"


def _sampled_budget() -> int:
    """A check budget the block exceeds whole but its first experts fit."""
    planned = plan_conversion(BLOCK)
    (plan,) = planned.plans
    return verify._check_bytes(plan, planned.store) * verify.sampled_expert_count(plan) // plan.num_experts


def _converting(monkeypatch, budget: int, deferred: bool | None = None) -> list[bool]:
    """Make ``ndp_ep.convert_model`` use ``budget`` (and force ``defer_checks`` when given); returns the list the
    spy appends each call's ``defer_checks`` to."""
    calls: list[bool] = []

    def with_budget(*args, **kwargs):
        if deferred is not None:
            kwargs["defer_checks"] = deferred
        calls.append(kwargs.get("defer_checks", False))
        return convert(*args, max_check_weight_bytes=budget, **kwargs)

    monkeypatch.setattr(ndp_convert, "convert", with_budget)
    return calls


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_checking_while_writing_gives_the_bytes_and_report_of_checking_first(tmp_path, monkeypatch):
    budget = _sampled_budget()
    threads = []
    capture = verify._capture

    def spy(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return capture(*args, **kwargs)

    monkeypatch.setattr(verify, "_capture", spy)
    (tmp_path / "first").mkdir()
    (tmp_path / "while").mkdir()
    _converting(monkeypatch, budget, deferred=False)
    first = ndp_convert.convert_model(BLOCK, tmp_path / "first" / "out.onnx", external_data=True)
    assert threads == ["MainThread"]
    calls = _converting(monkeypatch, budget)
    during = ndp_convert.convert_model(BLOCK, tmp_path / "while" / "out.onnx", external_data=True)
    assert calls == [True] and threads[1:] == ["ndp-ep-checks"]
    assert _files(tmp_path / "while") == _files(tmp_path / "first")
    assert during.report == first.report and during.report.pending == ()
    (block,) = during.report.blocks
    assert block.checked_numerically and block.checked_in_isolation
    assert any("checked on its first 3 of 4 experts" in note for note in during.report.notes)


def test_a_block_whose_check_fails_while_writing_is_converted_again_and_left_out(tmp_path, monkeypatch):
    budget = _sampled_budget()
    reference = verify.reference_block
    monkeypatch.setattr(verify, "reference_block", lambda *args, **kwargs: reference(*args, **kwargs) * 1.1)
    calls = _converting(monkeypatch, budget)
    result = ndp_convert.convert_model(BLOCK, tmp_path / "out.onnx", external_data=True)
    assert calls == [True, False]  # speculated, refused, converted again checking first
    assert result.report.blocks == () and len(result.report.skipped) == 1
    assert "no reading of the expert computation reproduces its output" in result.report.skipped[0].reason
    written = onnx.load(str(tmp_path / "out.onnx"), load_external_data=False)
    assert not any(node.domain == "ndp_ep" for node in written.graph.node)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in result.files)  # no temp left


def test_strict_with_a_check_failing_while_writing_writes_nothing(tmp_path, monkeypatch):
    budget = _sampled_budget()
    reference = verify.reference_block
    monkeypatch.setattr(verify, "reference_block", lambda *args, **kwargs: reference(*args, **kwargs) * 1.1)
    _converting(monkeypatch, budget)
    with pytest.raises(ConversionError, match="strict: block at .* was skipped"):
        ndp_convert.convert_model(BLOCK, tmp_path / "out.onnx", external_data=True, strict=True)
    assert list(tmp_path.iterdir()) == []


def test_background_checks_multiply_on_one_blas_thread():
    if verify._openblas_local_threads_setter() is None:
        pytest.skip("NumPy does not use an OpenBLAS with per-thread thread counts here")
    previous: list[int] = []

    def check_thread() -> None:
        assert verify.single_threaded_blas_here()
        previous.append(verify._openblas_local_threads_setter()(1))  # returns this thread's count, set above

    thread = threading.Thread(target=check_thread)
    thread.start()
    thread.join()
    assert previous == [1]
