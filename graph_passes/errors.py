"""Typed errors of the graph passes."""


class GraphPassError(ValueError):
    """Base class of the graph passes' input errors."""


class UnsupportedModelError(GraphPassError):
    """The model cannot be converted at all (for instance a strict conversion met a skipped block)."""


class InvalidModelError(GraphPassError):
    """The input is missing, unreadable or not an ONNX model."""


class UnsafeModelError(InvalidModelError):
    """The model asks for a file outside its own directory (absolute path, ``..``, symlink escape)."""
