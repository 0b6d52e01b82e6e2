"""The general data-flow rule alone converts every exported family and both exporters' forms.

The specific rules (TorchScript one-hot form, fused op) claim blocks first in the default rule set; this test
runs the general ``gathered_experts`` rule by itself, so it proves the rule recognises MoE blocks by the data
flow of their expert computation rather than by one exporter's op sequence.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graph_passes.convert import convert
from graph_passes.rewrite import materialize_with_store
from graph_passes.rules.gathered_experts import GatheredExpertsRule

HF = Path(__file__).resolve().parents[2] / "sample_models" / "hf"
FIXTURES = sorted(p for p in [*HF.glob("*.onnx"), *HF.glob("extra/*.onnx")] if "eager" not in p.name)


def test_the_fixture_globs_find_the_exported_models():
    assert len(FIXTURES) >= 12  # 4 families x block/model x 2 exporters, minus what does not export
    assert len(sorted(HF.glob("*eager*.onnx"))) >= 3


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_general_rule_alone_converts_the_fixture_and_reproduces_pytorch(path):
    from ndp_ep.session import InferenceSession

    rewritten, report = convert(path, shards=2, rules=[GatheredExpertsRule()])
    expected_blocks = 2 if "_model_" in path.name else 1
    assert len(report.blocks) == expected_blocks, report.skipped
    assert report.skipped == ()
    assert all(b.checked_numerically for b in report.blocks)
    inputs = dict(np.load(path.with_name(path.name.replace(".onnx", ".inputs.npz"))))
    expected = np.load(path.with_name(path.name.replace(".onnx", ".outputs.npz")))
    session = InferenceSession(materialize_with_store(rewritten))
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(names, inputs), strict=True))
    for name in expected.files:
        np.testing.assert_allclose(outputs[name], expected[name], rtol=0, atol=1e-4)


def test_general_rule_leaves_eager_unrolled_exports_alone():
    eager = sorted(HF.glob("*eager*.onnx"))
    assert eager
    for path in eager:
        _, report = convert(path, shards=2, rules=[GatheredExpertsRule()])
        assert report.blocks == ()
