"""Layering rules of the agreed architecture, and the fast import path of the custom-op bridge."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import importlib, pkgutil, sys
import {package}
for module in pkgutil.walk_packages({package}.__path__, "{package}."):
    importlib.import_module(module.name)
print(",".join(sorted(m for m in sys.modules if m.split(".")[0] in {forbidden!r})))
"""


def _imported(package: str, forbidden: tuple[str, ...], repo_root) -> str:
    code = PROBE.format(package=package, forbidden=forbidden)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo_root, check=True)
    return done.stdout.strip()


def test_hw_model_never_imports_onnx(repo_root):
    assert _imported("hw_model", ("onnx", "onnxruntime", "graph_passes", "ndp_ep"), repo_root) == ""


def test_graph_passes_knows_nothing_of_timing(repo_root):
    assert _imported("graph_passes", ("hw_model", "ndp_ep"), repo_root) == ""


def test_a_session_run_and_its_report_import_no_heavy_optional_packages(repo_root, samples_dir):
    """The run path (session, native provider, report) stays light: no scipy (expit), networkx (the diff's
    matcher), onnxruntime-extensions (the removed Python kernel), torch or matplotlib."""
    heavy = ("scipy", "networkx", "onnxruntime_extensions", "torch", "matplotlib")
    code = (
        "import sys, numpy as np\n"
        "from ndp_ep.session import InferenceSession\n"
        f"s = InferenceSession({str(samples_dir / 'moe_block.onnx')!r})\n"
        "s.run(None, {'hidden_states': np.zeros((1, 2, 64), np.float32)})\n"
        "assert s.last_report is not None\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo_root, check=True)
    assert done.stdout.strip() == "[]"
