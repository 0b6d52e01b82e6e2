"""GenAI-builder fixtures (``sample_models/genai``) and the ``needs_native_ep`` marker.

Tests marked ``needs_native_ep`` run converted float16 / bfloat16 / int8 / int4 models end to end; the Python
kernels only compute float32 shards, so they are skipped until the native provider (``ndp_ep.register``) exists.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

GENAI_DIR = Path(__file__).resolve().parents[2] / "sample_models" / "genai"


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "needs_native_ep: needs the native NdpExecutionProvider (ndp_ep.register)")


def pytest_collection_modifyitems(config, items) -> None:
    import ndp_ep

    if hasattr(ndp_ep, "register"):
        return
    skip = pytest.mark.skip(reason="needs the native NdpExecutionProvider (ndp_ep.register does not exist yet)")
    for item in items:
        if "needs_native_ep" in item.keywords:
            item.add_marker(skip)


def manifest() -> dict[str, dict]:
    entries = json.loads((GENAI_DIR / "MANIFEST.json").read_text())
    assert entries, "sample_models/genai/MANIFEST.json lists no fixture"
    return entries
