"""ndp-ep: an ONNX Runtime execution-provider prototype for MoE models on GPU + NDP-DIMM systems.

``ndp_ep.InferenceSession`` has ONNX Runtime's session API; ``ndp_ep.convert_model`` rewrites a model's
MoE blocks into sharded expert ops.
"""

from ndp_ep.errors import ConversionError, FeedError, ModelLoadError, NdpEpError

__all__ = ["ConversionError", "FeedError", "InferenceSession", "ModelLoadError", "NdpEpError", "convert_model"]


def __getattr__(name: str):
    if name == "InferenceSession":
        from ndp_ep.session import InferenceSession

        return InferenceSession
    if name == "convert_model":
        from ndp_ep.convert import convert_model

        return convert_model
    raise AttributeError(name)
