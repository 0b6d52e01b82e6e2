"""How many threads numpy's OpenBLAS multiplies with: set while it loads (``OPENBLAS_NUM_THREADS``) or per calling
thread afterwards (``openblas_set_num_threads_local``).

OpenBLAS starts one worker thread per core when its library is loaded; the workers spin before they sleep, so on a
busy two-core machine they take tens of milliseconds of CPU from a short program. ``ndp-ep run``, which multiplies
no matrices in Python, loads numpy with one BLAS thread (:func:`single_threaded_blas_load`); the converter's
background checks, which multiply two tokens' worth of values while the writer runs, use one from their own thread
(:func:`single_threaded_blas_here`). This module imports neither numpy nor ONNX Runtime.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

BLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"


@contextlib.contextmanager
def single_threaded_blas_load() -> Iterator[None]:
    """``OPENBLAS_NUM_THREADS=1`` inside the block (OpenBLAS reads it only when it loads), then the caller's value
    (or none) again."""
    previous = os.environ.get(BLAS_THREADS_ENV)
    os.environ[BLAS_THREADS_ENV] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(BLAS_THREADS_ENV, None)
        else:
            os.environ[BLAS_THREADS_ENV] = previous


def single_threaded_blas_here() -> bool:
    """Best effort: NumPy's matrix products made from the calling thread from now on use one BLAS thread
    (OpenBLAS ≥ 0.3.27's ``openblas_set_num_threads_local``; True when it was found and called).

    A deferred check multiplies two tokens' worth of values; OpenBLAS would spread each product over its pool,
    whose idle workers then spin for a while, taking CPU from the writer the check overlaps.
    """
    setter = _openblas_local_threads_setter()
    if setter is None:
        return False
    setter(1)
    return True


@functools.cache
def _openblas_local_threads_setter():
    import ctypes

    try:
        with open("/proc/self/maps") as maps:  # the OpenBLAS NumPy loaded (Linux); elsewhere nothing is done
            paths = {line.split()[-1] for line in maps if "openblas" in line.rsplit("/", 1)[-1]}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            setter = ctypes.CDLL(path).openblas_set_num_threads_local
        except (OSError, AttributeError):
            continue
        setter.argtypes, setter.restype = [ctypes.c_int], ctypes.c_int
        return setter
    return None
