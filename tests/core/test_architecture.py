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


def test_sessions_do_not_import_the_onnxruntime_extensions_package(repo_root, samples_dir):
    code = (
        "import sys, numpy as np\n"
        "from ndp_ep.session import InferenceSession\n"
        f"s = InferenceSession({str(samples_dir / 'moe_block.onnx')!r})\n"
        "s.run(None, {'hidden_states': np.zeros((1, 2, 64), np.float32)})\n"
        "print('onnxruntime_extensions' in sys.modules, 'onnxruntime_extensions._ocos' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo_root, check=True)
    assert done.stdout.split() == ["False", "False"]
