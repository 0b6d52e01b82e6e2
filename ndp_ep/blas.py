"""Loading numpy's OpenBLAS with one BLAS thread (``OPENBLAS_NUM_THREADS=1`` while it loads).

OpenBLAS starts one worker thread per core when its library is loaded; the workers spin before they sleep, so
on a busy two-core machine they take tens of milliseconds of CPU from a short program. OpenBLAS reads the
variable only when it loads, so the caller's value is restored right after and nothing else changes. Used for
numpy's in ``ndp-ep run``, which multiplies no matrices in Python (:mod:`ndp_ep.commands.run`); the provider
library has no BLAS (its matrix kernels are its own, native/src/panel_gemm.h). This module imports neither numpy
nor ONNX Runtime."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

BLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"


@contextlib.contextmanager
def single_threaded_blas_load() -> Iterator[None]:
    """``OPENBLAS_NUM_THREADS=1`` inside the block, then the caller's value (or none) again."""
    previous = os.environ.get(BLAS_THREADS_ENV)
    os.environ[BLAS_THREADS_ENV] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(BLAS_THREADS_ENV, None)
        else:
            os.environ[BLAS_THREADS_ENV] = previous
