"""Typed errors of the provider. The CLI turns every one of them into a one-line message and exit code 2."""


class NdpEpError(Exception):
    """Base class of the provider's input errors."""


class ModelLoadError(NdpEpError):
    """The model file is missing, unreadable or not ONNX."""


class FeedError(NdpEpError):
    """Input feeds do not match the model's inputs (names, dtypes, ranks)."""


class ConversionError(NdpEpError):
    """A conversion could not be completed (for instance a skipped block under ``strict``)."""


class RunError(NdpEpError):
    """ONNX Runtime failed while running a model on feeds that match its signature (an inconsistent model)."""
