"""ndp-ep: an ONNX Runtime execution provider for MoE models on GPU + NDP-DIMM systems.

``ndp_ep.InferenceSession`` has ONNX Runtime's session API; ``ndp_ep.convert_model`` rewrites a model's
MoE blocks into sharded expert ops. For a plain ``onnxruntime.InferenceSession``: ``register()``,
``devices()``, ``session_options()``, ``last_report(session)``, ``get_library_path()``, ``get_ep_name()``.
Everything is imported lazily, so ``ndp-ep --help`` stays fast.
"""

from ndp_ep.errors import ConversionError, FeedError, ModelLoadError, NdpEpError

__all__ = [
    "ConversionError",
    "FeedError",
    "InferenceSession",
    "ModelLoadError",
    "NdpEpError",
    "convert_model",
    "devices",
    "get_ep_name",
    "get_library_path",
    "last_report",
    "register",
    "session_options",
]
_EP_HELPERS = ("devices", "get_ep_name", "get_library_path", "last_report", "register", "session_options")


def __getattr__(name: str):
    if name == "InferenceSession":
        from ndp_ep.session import InferenceSession

        return InferenceSession
    if name == "convert_model":
        from ndp_ep.convert import convert_model

        return convert_model
    if name in _EP_HELPERS:
        from ndp_ep import ep

        return getattr(ep, name)
    raise AttributeError(name)
