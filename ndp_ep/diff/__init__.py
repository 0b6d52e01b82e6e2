"""Semantic diff of two ONNX models (``ndp-ep diff``): nodes, initializers, opsets and ndp-ep MoE rewrites.

from ndp_ep.diff import diff_models, render_text
result = diff_models("a.onnx", "b.onnx")   # raises ndp_ep.errors.ModelLoadError on bad input
print(render_text(result)); exit_code = 0 if result.equivalent else 1

Output formats are the ``render_<format>.py`` modules of this package, found by :func:`renderers`
(see :mod:`ndp_ep.diff.renderers`).
"""

from ndp_ep.diff.engine import diff_models, diff_snapshots
from ndp_ep.diff.render_html import render_html
from ndp_ep.diff.render_json import SCHEMA_ID, render_json, to_json_document
from ndp_ep.diff.render_text import render_text
from ndp_ep.diff.renderers import Renderer, RenderOptions, renderers
from ndp_ep.diff.result import ModelDiff

__all__ = [
    "SCHEMA_ID",
    "ModelDiff",
    "RenderOptions",
    "Renderer",
    "diff_models",
    "diff_snapshots",
    "render_html",
    "render_json",
    "render_text",
    "renderers",
    "to_json_document",
]
