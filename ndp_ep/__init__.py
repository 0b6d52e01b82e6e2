"""ndp-ep: an ONNX Runtime execution-provider prototype for MoE models on GPU + NDP-DIMM systems.

``ndp_ep.InferenceSession`` has ONNX Runtime's session API; ``ndp_ep.convert_model`` rewrites a model's
MoE blocks into sharded expert ops; ``ndp_ep.sample_path`` finds the bundled sample models. Heavy modules
are imported on first use (``_LAZY``), so ``import ndp_ep`` and ``ndp-ep --help`` stay fast; ``dir(ndp_ep)``
lists the public API (``__all__``).
"""

from ndp_ep.errors import ConversionError, FeedError, ModelLoadError, NdpEpError

# public name -> module that defines it, imported on first access
_LAZY = {
    "InferenceSession": "ndp_ep.session",
    "convert_model": "ndp_ep.convert",
    "sample_path": "ndp_ep.samples",
}

__all__ = [
    "ConversionError",
    "FeedError",
    "InferenceSession",
    "ModelLoadError",
    "NdpEpError",
    "__version__",
    "convert_model",
    "sample_path",
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
