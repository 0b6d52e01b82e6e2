"""``ndp_io`` imports only the standard library, so hw_model (no onnx), graph_passes and ndp_ep can all use it."""

from __future__ import annotations

import ast
import sys


def test_ndp_io_imports_only_the_standard_library(repo_root):
    files = sorted((repo_root / "ndp_io").glob("*.py"))
    assert files, "ndp_io has no modules"
    imported: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    foreign = {
        name for name in imported if name not in sys.stdlib_module_names and name not in ("ndp_io", "__future__")
    }
    assert foreign == set()
    assert {"os", "signal"} <= imported  # the walk saw the imports it must see
