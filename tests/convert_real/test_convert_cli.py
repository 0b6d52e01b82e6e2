"""End to end, as a user runs it: ``ndp-ep convert --json`` on every real-exporter fixture must list the
expected MoE blocks, and ``ndp-ep run --inputs --outputs`` on the converted model must reproduce the outputs
PyTorch (or ONNX Runtime's CPU provider, for the fused op) computed, within 1e-4 absolute.

The commands run in-process through ``ndp_ep.cli.main`` (the process-level smoke tests are in
tests/core/test_cli.py): a subprocess per call would spend most of this module's time importing."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.convert_real.cases import (
    EAGER_REASON,
    HF_DIR,
    Expected,
    fused_cases,
    hf_cases,
    scale_gathered_weight,
    unweighted_combine,
)

ATOL = 1e-4


@pytest.fixture
def cli(capsys):
    """``cli("convert", ...)``: ``ndp-ep`` through ``main()`` in this process, as a CompletedProcess-like value."""
    from ndp_ep.cli import main

    def run(*args: str) -> SimpleNamespace:
        code = main(list(args))
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    return run


# Fixtures the converter does not handle yet, by stem, with the reason: marked xfail(strict=False) so that they
# start passing as soon as the converter supports them (test_rules.py already proves their plans).
KNOWN_GAPS: dict[str, str] = {}


def _param(case: Expected):
    gap = KNOWN_GAPS.get(case.stem)
    marks = [pytest.mark.xfail(strict=False, reason=gap)] if gap else []
    return pytest.param(case, id=case.stem, marks=marks)


def _convert(cli, source: Path, target: Path, *extra: str) -> dict:
    done = cli("convert", str(source), "-o", str(target), "--json", *extra)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _run(cli, model: Path, inputs: Path, outputs: Path) -> dict[str, np.ndarray]:
    done = cli("run", str(model), "--inputs", str(inputs), "--outputs", str(outputs), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(np.load(outputs))


def _check_report(report: dict, case: Expected) -> None:
    blocks = report["moe_blocks"]
    got = sorted((b["num_experts"], b["top_k"], b["hidden"], b["ffn"]) for b in blocks)
    assert got == sorted(case.blocks), report
    if case.skipped:
        reasons = [s["reason"] for s in report["skipped"]]
        matching = [r for r in reasons if case.skip_reason in r]
        assert len(matching) >= case.skipped, reasons


@pytest.mark.parametrize("case", [_param(c) for c in hf_cases() + fused_cases()])
def test_fixture_converts_and_reproduces_reference_outputs(case, cli, tmp_path):
    converted = tmp_path / f"{case.stem}.ndp.onnx"
    report = _convert(cli, case.path, converted)
    _check_report(report, case)
    outputs = _run(cli, converted, case.inputs, tmp_path / "out.npz")
    reference = dict(np.load(case.outputs))
    assert sorted(outputs) == sorted(reference)
    for name, expected in reference.items():
        np.testing.assert_allclose(outputs[name], expected, atol=ATOL, rtol=0, err_msg=name)


def _ort_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


NEGATIVES = [
    ("scaled_weight", "mixtral_block_torchscript", scale_gathered_weight),
    ("scaled_weight", "qwen2_moe_block_dynamo", scale_gathered_weight),
    ("unweighted_combine", "gpt_oss_block_torchscript", unweighted_combine),
    ("unweighted_combine", "mixtral_block_dynamo", unweighted_combine),
]


@pytest.mark.parametrize(("kind", "stem", "breaker"), NEGATIVES, ids=[f"{k}-{s}" for k, s, _ in NEGATIVES])
def test_a_block_that_is_not_a_plain_moe_is_skipped_and_the_model_still_runs(kind, stem, breaker, cli, tmp_path):
    broken = breaker(onnx.load(HF_DIR / f"{stem}.onnx"))
    source = tmp_path / f"{stem}.{kind}.onnx"
    onnx.save(broken, source)
    report = _convert(cli, source, tmp_path / "converted.onnx")
    assert report["moe_blocks"] == [], report
    assert report["skipped"] and all(s["reason"] for s in report["skipped"])
    feeds = dict(np.load(HF_DIR / f"{stem}.inputs.npz"))
    outputs = _run(cli, tmp_path / "converted.onnx", HF_DIR / f"{stem}.inputs.npz", tmp_path / "out.npz")
    for name, expected in _ort_outputs(broken, feeds).items():
        np.testing.assert_allclose(outputs[name], expected, atol=ATOL, rtol=0, err_msg=name)


def test_eager_unrolled_export_is_skipped_and_strict_turns_it_into_exit_code_2(cli, tmp_path):
    source = HF_DIR / "qwen2_moe_block_eager_torchscript.onnx"
    report = _convert(cli, source, tmp_path / "converted.onnx")
    assert report["moe_blocks"] == []
    assert any(s["reason"].startswith(EAGER_REASON) for s in report["skipped"]), report["skipped"]
    outputs = _run(
        cli, tmp_path / "converted.onnx", source.with_suffix("").with_suffix(".inputs.npz"), tmp_path / "out.npz"
    )
    reference = dict(np.load(HF_DIR / "qwen2_moe_block_eager_torchscript.outputs.npz"))
    for name, expected in reference.items():
        np.testing.assert_allclose(outputs[name], expected, atol=ATOL, rtol=0)

    strict = cli("convert", str(source), "-o", str(tmp_path / "strict.onnx"), "--strict")
    assert strict.returncode == 2
    assert "Traceback" not in strict.stderr and len(strict.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "strict.onnx").exists()
