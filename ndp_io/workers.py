"""Worker processes of a command (``sweep --jobs``, ``bench --jobs``): how many, and that none outlives it.

* :func:`worker_count`: the pool size for ``requested`` workers and ``tasks`` tasks — never more workers than
  tasks (a pool forks every worker at once under the ``fork`` start method), never more than the CPUs unless
  ``explicit`` (the user asked for that number), never more than :data:`ndp_io.limits.MAX_WORKERS_HARD`
  (a ``ValueError`` naming the limit beyond it, raised before anything is forked).
* :func:`die_with_parent`: a pool ``initializer`` after which a worker is killed when its parent dies, however
  it dies (``PR_SET_PDEATHSIG`` on Linux; elsewhere a no-op), so killing ``ndp-ep sweep`` leaves no orphans.
* :func:`terminate_on_signal`: while active, SIGTERM/SIGHUP first terminate the given pool's workers, then act
  as before (the process dies of the signal).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from ndp_io.limits import MAX_WORKERS_HARD, cpu_count, limit_note

_PR_SET_PDEATHSIG = 1


def worker_count(requested: int, tasks: int, explicit: bool = True) -> int:
    """The number of worker processes to start (see the module docstring)."""
    if requested > MAX_WORKERS_HARD:
        raise ValueError(
            f"{requested:,} worker processes asked; at most {MAX_WORKERS_HARD} {limit_note('MAX_WORKERS_HARD')}"
        )
    count = requested if explicit else min(requested, cpu_count())
    return max(1, min(count, tasks))


def die_with_parent() -> None:
    """Pool initializer: this worker gets SIGKILL when the process that started it dies (Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the pool's own shutdown is all there is
        return


@contextlib.contextmanager
def terminate_on_signal(pool: Any) -> Iterator[None]:
    """While active (main thread only), SIGTERM and SIGHUP terminate ``pool``'s worker processes first (a
    ``concurrent.futures.ProcessPoolExecutor``), then the previous handler runs or the process dies of the
    signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}

    def handler(signum: int, frame: Any) -> None:
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            with contextlib.suppress(Exception):
                process.terminate()
        before = previous.get(signum, signal.SIG_DFL)
        if callable(before):
            before(signum, frame)
            return
        if before == signal.SIG_IGN:
            return
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    for name in ("SIGTERM", "SIGHUP"):
        signum = getattr(signal, name, None)
        if signum is not None:
            with contextlib.suppress(ValueError, OSError):
                previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, before in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signum, before if before is not None else signal.SIG_DFL)
