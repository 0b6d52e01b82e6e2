"""GenAI-builder fixtures (``sample_models/genai``) and the ``needs_native_ep`` marker (tests that run converted
float16 / bfloat16 / int8 / int4 models end to end through the native provider)."""

from __future__ import annotations

import json
from pathlib import Path

GENAI_DIR = Path(__file__).resolve().parents[2] / "sample_models" / "genai"


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "needs_native_ep: needs the native NdpExecutionProvider (ndp_ep.register)")


def manifest() -> dict[str, dict]:
    entries = json.loads((GENAI_DIR / "MANIFEST.json").read_text())
    assert entries, "sample_models/genai/MANIFEST.json lists no fixture"
    return entries
