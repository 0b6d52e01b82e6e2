"""Typed errors of the graph passes."""


class GraphPassError(ValueError):
    """Base class of the graph passes' input errors."""


class UnsupportedModelError(GraphPassError):
    """The model cannot be converted at all (for instance a strict conversion met a skipped block)."""


class InvalidModelError(GraphPassError):
    """The input is missing, unreadable or not an ONNX model."""
