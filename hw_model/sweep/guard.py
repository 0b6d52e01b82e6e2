"""The resource guards of ``ndp-ep sweep`` (issue 32): the grid's size before it is expanded, its TOML read within
the parse limits, and a worker pool that is bounded and leaves no orphans.

* :func:`count_points`: the number of points :func:`hw_model.sweep.expand` would make, as the product of the
  axis lengths (a file trace contributes one variant, a synthetic one ``skews x seeds``), without expanding;
  :func:`check_grid_size` refuses a grid over :data:`ndp_io.limits.MAX_GRID_POINTS` naming the limit (a grid
  of 10^10 points grew memory at ~60 MB/s with nothing printed).
* :func:`read_toml`: grid and hardware TOML through :mod:`ndp_io.parsing` (size, depth, a BOM accepted), errors
  of the caller's type.
* :func:`run_chunks`: chunks on a process pool of :func:`ndp_io.workers.worker_count` workers (never more than
  the chunks), each started with :func:`ndp_io.workers.die_with_parent`, terminated on SIGTERM/SIGHUP; a bounded
  window of chunks in flight (:func:`in_order`, which Ray's backend shares), results streamed back in chunk order.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections import deque
from collections.abc import Callable, Generator, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from hw_model.errors import HwModelError
from ndp_io.limits import MAX_GRID_POINTS, limit_note
from ndp_io.parsing import read_toml as _read_toml
from ndp_io.workers import die_with_parent, terminate_on_signal, worker_count

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

SYNTHETIC = "synthetic"


def count_points(grid: Any) -> int:
    """The points of ``grid`` (a :class:`hw_model.sweep.SweepGrid`), as the product of its axis lengths."""
    hardware = math.prod(len(values) for values in dict(grid.hardware).values())
    variants = sum(len(grid.skew) * len(grid.seeds) if trace == SYNTHETIC else 1 for trace in grid.traces)
    axes = (len(grid.models), len(grid.hw), hardware, len(grid.ndp_units), variants)
    return math.prod(axes) * len(grid.residency_fractions) * len(grid.policies)


def check_grid_size(grid: Any, error: Callable[[str], HwModelError]) -> int:
    """``grid``'s point count; ``error`` naming :data:`MAX_GRID_POINTS` when it is over, before any expansion."""
    count = count_points(grid)
    if count > MAX_GRID_POINTS:
        raise error(
            f"the grid has {count:,} points (the product of its axis lengths); at most {MAX_GRID_POINTS:,} "
            f"{limit_note('MAX_GRID_POINTS')}: split it into several sweeps"
        )
    return count


def read_toml(path: Path, error: Callable[[str], Exception]) -> dict[str, Any]:
    """The TOML file at ``path``, size- and depth-bounded (:func:`ndp_io.parsing.read_toml`)."""
    return _read_toml(path, error, tomllib.loads)


IN_FLIGHT_PER_WORKER = 2  # chunks submitted and not yet handed on, per worker: the pool is never idle for want of one


def run_chunks(
    chunks: Iterable[Sequence[Any]],
    tasks: int,
    jobs: int,
    run_chunk: Callable[[Any], list[dict]],
    error: Callable[[str], HwModelError],
) -> Generator[list[dict], None, None]:
    """``run_chunk`` of each of ``tasks`` chunks (made lazily by ``chunks``) on a bounded pool (see the module
    docstring); results yielded in chunk order, at most :data:`IN_FLIGHT_PER_WORKER` x workers chunks submitted and
    not yet yielded at any time, so the points waiting for a worker and the records waiting for the caller stay
    bounded whatever the grid's size. Closing the generator early cancels what has not started."""
    try:
        workers = worker_count(jobs, tasks)
    except ValueError as exc:
        raise error(f"jobs: {exc}") from None
    pool = ProcessPoolExecutor(max_workers=workers, initializer=die_with_parent)
    try:
        with terminate_on_signal(pool):

            def submit(chunk: Any) -> Future:
                return pool.submit(run_chunk, chunk)

            yield from in_order(chunks, IN_FLIGHT_PER_WORKER * workers, submit, Future.result)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def in_order(
    chunks: Iterable[Any], in_flight: int, submit: Callable[[Any], Any], result: Callable[[Any], list[dict]]
) -> Generator[list[dict], None, None]:
    """``result(submit(chunk))`` of each chunk (made lazily by ``chunks``), yielded in chunk order, with at most
    ``in_flight`` chunks submitted and not yet yielded: the window of a process pool (futures) and of Ray (refs)."""
    source = iter(chunks)
    window = deque(submit(chunk) for chunk in itertools.islice(source, in_flight))
    while window:
        results = result(window.popleft())
        window.extend(submit(chunk) for chunk in itertools.islice(source, 1))
        yield results
