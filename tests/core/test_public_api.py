"""The Python surface a user meets first: ``dir(ndp_ep)``, the bundled samples, readable reports."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import ndp_ep

REPO = Path(__file__).resolve().parents[2]


def test_dir_and_all_list_the_public_api_and_every_name_resolves():
    expected = {"InferenceSession", "convert_model", "sample_path", "NdpEpError", "ModelLoadError", "FeedError"}
    assert expected <= set(ndp_ep.__all__) and dir(ndp_ep) == sorted(ndp_ep.__all__)
    for name in ndp_ep.__all__:
        assert getattr(ndp_ep, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ndp_ep.nope  # noqa: B018


def test_sample_path_finds_each_bundled_sample_and_refuses_unknown_names():
    from ndp_ep.samples import SAMPLES

    for name in SAMPLES:
        path = ndp_ep.sample_path(name)
        assert path.is_file() and path.name == name
    assert ndp_ep.sample_path("moe_block.onnx").read_bytes() == (REPO / "sample_models" / "moe_block.onnx").read_bytes()
    with pytest.raises(ValueError, match="unknown sample"):
        ndp_ep.sample_path("../pyproject.toml")


@pytest.fixture(scope="module")
def decode_report():
    session = ndp_ep.InferenceSession(ndp_ep.sample_path("moe_decoder.onnx"))
    session.run(None, {"input_ids": np.array([[1, 2, 3]], dtype=np.int64)})
    session.run(None, {"input_ids": np.array([[4]], dtype=np.int64)})
    return session.last_report


def test_report_repr_is_one_short_line_and_str_is_the_readable_report(decode_report):
    text = repr(decode_report)
    assert "\n" not in text and len(text) < 200 and text.startswith("RunReport(run_index=1, phase='decode', tokens=1")
    assert str(decode_report) == decode_report.format_text()
    assert repr(decode_report.layers[0]).startswith("LayerReport('model.layers.0.mlp'")


def test_report_text_says_one_token_in_the_singular_and_aligns_its_columns(decode_report):
    lines = str(decode_report).splitlines()
    assert "(decode, 1 token," in lines[0] and "weights costed as bf16" in lines[0]
    assert not re.search(r"\b1 (tokens|experts)\b", str(decode_report))
    rows = [line for line in lines[1:] if line.startswith("  ") and not line.lstrip().startswith("note:")]
    assert lines[1].startswith("simulated energy ") and " mJ" in lines[1]
    ms_ends = {line.index(" ms") for line in rows}
    assert len(ms_ends) == 1, lines  # latencies right-aligned in one column
