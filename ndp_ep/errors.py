"""Typed errors of the provider, and the one boundary that translates the graph passes' errors into them.

The CLI turns every :class:`NdpEpError` into a one-line message and exit code 2. ``graph_passes`` never
imports ``ndp_ep``, so its errors (:mod:`graph_passes.errors`, and
:class:`graph_passes.sharded_op.ShardedOpError` for a tampered converted node) are translated here and only
here, by :func:`translate_graph_pass_error` / the :func:`graph_pass_errors` context manager:

=========================================  ==================
graph_passes error                         ndp_ep error
=========================================  ==================
``InvalidModelError``                      ``ModelLoadError``
``ShardedOpError`` (broken op contract)    ``ModelLoadError``
``UnsupportedModelError`` (e.g. strict)    ``ConversionError``
any other ``GraphPassError``               ``ConversionError``
=========================================  ==================
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class NdpEpError(Exception):
    """Base class of the provider's input errors."""


class ModelLoadError(NdpEpError):
    """The model file is missing, unreadable or not ONNX (or a converted node breaks the op contract)."""


class FeedError(NdpEpError):
    """Input feeds do not match the model's inputs (names, dtypes, ranks)."""


class ConversionError(NdpEpError):
    """A conversion could not be completed (for instance a skipped block under ``strict``)."""


class RunError(NdpEpError):
    """ONNX Runtime failed while running a model on feeds that match its signature (an inconsistent model)."""


def translate_graph_pass_error(exc: BaseException) -> NdpEpError | None:
    """The :class:`NdpEpError` a graph-pass error stands for (same message), or None for any other exception."""
    from graph_passes.errors import GraphPassError, InvalidModelError
    from graph_passes.sharded_op import ShardedOpError

    if isinstance(exc, InvalidModelError | ShardedOpError):
        return ModelLoadError(str(exc))
    if isinstance(exc, GraphPassError):
        return ConversionError(str(exc))
    return None


@contextmanager
def graph_pass_errors() -> Iterator[None]:
    """Re-raise graph-pass errors raised inside the block as the matching :class:`NdpEpError`."""
    try:
        yield
    except Exception as exc:
        translated = translate_graph_pass_error(exc)
        if translated is None:
            raise
        raise translated from None
