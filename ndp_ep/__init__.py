"""ndp-ep: an ONNX Runtime execution provider for MoE models on GPU + NDP-DIMM systems.

``ndp_ep.InferenceSession`` has ONNX Runtime's session API; ``ndp_ep.convert_model`` rewrites a model's
MoE blocks into sharded expert ops; ``ndp_ep.sample_path`` finds the bundled sample models. For a plain
``onnxruntime.InferenceSession``: ``register()``, ``devices()``, ``session_options()``,
``last_report(session)``, ``routing_trace(session)``, ``get_library_path()``, ``get_ep_name()``; for ONNX Runtime
GenAI's own generation loop, ``GenerationReports``. Heavy modules are imported on first use
(``_LAZY``), so ``import ndp_ep`` and ``ndp-ep --help`` stay fast; ``dir(ndp_ep)`` lists the public API.
"""

from ndp_ep.errors import ConversionError, FeedError, ModelLoadError, NdpEpError, RunError

# public name -> module that defines it, imported on first access
_LAZY = {
    "GenerationReports": "ndp_ep.genai",
    "InferenceSession": "ndp_ep.session",
    "convert_model": "ndp_ep.convert",
    "sample_path": "ndp_ep.samples",
    "devices": "ndp_ep.ep",
    "get_ep_name": "ndp_ep.ep",
    "get_library_path": "ndp_ep.ep",
    "last_report": "ndp_ep.reporter",
    "register": "ndp_ep.ep",
    "routing_trace": "ndp_ep.routing",
    "session_options": "ndp_ep.ep",
}

__all__ = [
    "ConversionError",
    "FeedError",
    "GenerationReports",
    "InferenceSession",
    "ModelLoadError",
    "NdpEpError",
    "RunError",
    "__version__",
    "convert_model",
    "devices",
    "get_ep_name",
    "get_library_path",
    "last_report",
    "register",
    "routing_trace",
    "sample_path",
    "session_options",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "__version__":
        from ndp_ep.cli import version

        return version()
    raise AttributeError(f"module 'ndp_ep' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
