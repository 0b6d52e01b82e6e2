"""Running a sweep's points: one point end to end (:func:`run_point`), in-process, on a local process pool or on Ray
(:func:`run_sweep`), records back in point order (:class:`SweepResult`)."""

from __future__ import annotations

import itertools
import math
import os
import re
import shutil
import signal
import socket
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hw_model.bench import BenchConfig, Job, run_job
from hw_model.bench_trace import CAPTURED_LEVEL
from hw_model.errors import HwModelError
from hw_model.hardware import load_system
from hw_model.models import get_model
from hw_model.settings import SimulationSettings
from hw_model.sweep.grid import (
    LATENCY_KEY,
    SYNTHETIC,
    WALL_KEY,
    SweepGrid,
    SweepGridError,
    SweepPoint,
    _flatten,
    iter_points,
)
from hw_model.sweep.guard import IN_FLIGHT_PER_WORKER, count_points, in_order, run_chunks
from hw_model.sweep.pareto import FrontBuilder
from hw_model.sweep.stream import RecordTable, with_speedups
from ndp_io import remove_on_signal

# per worker process: routing traces by (trace, seed, tokens, knobs), the most recently used few only
_TRACE_CACHES: OrderedDict[tuple, dict] = OrderedDict()


TRACE_CACHE_ENTRIES = 8


def _simulate_point(point: SweepPoint, hw: str, cache: dict) -> dict[str, Any]:
    """The bench record of one point: a captured routing trace replayed (hw_model/sweep/captured.py), or a bench
    job on the point's model and trace."""
    system = load_system(hw, point.ndp_units)  # loaded here: a sweep's point may have no NDP unit
    if point.trace != SYNTHETIC and point.skew_level == CAPTURED_LEVEL:
        from hw_model.sweep.captured import run_captured

        return run_captured(point.trace, system, point.policy, point.residency_fraction, cache)
    config = BenchConfig(
        hw=hw,
        ndp_units=(point.ndp_units,),
        models=(point.model,),
        policies=(point.policy,),
        prompt_tokens=point.prompt_tokens,
        generated_tokens=point.generated_tokens,
        seed=point.seed,
        locality=point.locality,
        shift_at=point.shift_at,
        trace_file=None if point.trace == SYNTHETIC else point.trace,
        sweeps=False,
        gantt=False,
        default_units=point.ndp_units,
    )
    settings = SimulationSettings(hw=system, policy=point.policy, residency_fraction=point.residency_fraction)
    job = Job(get_model(point.model), settings, point.skew_level, point.skew, section="sweep")
    return run_job(job, config, cache).record


def run_point(point: SweepPoint) -> dict[str, Any]:
    """Simulate one point; its flat record (coordinates, then the bench job's results, then ``sim_wall_s``)."""
    started = time.perf_counter()
    record = point.params()
    cache_key = (point.trace, point.seed, point.prompt_tokens, point.generated_tokens, point.locality, point.shift_at)
    cache = _TRACE_CACHES.setdefault(cache_key, {})
    _TRACE_CACHES.move_to_end(cache_key)
    while len(_TRACE_CACHES) > TRACE_CACHE_ENTRIES:
        _TRACE_CACHES.popitem(last=False)
    with tempfile.TemporaryDirectory(prefix="ndp-sweep-") as tmp:
        hw = point.hw
        if point.hw_toml is not None:
            hw = os.path.join(tmp, "hardware.toml")
            Path(hw).write_text(point.hw_toml, encoding="utf-8")
        try:
            result_record = _simulate_point(point, hw, cache)
        except HwModelError as exc:
            record["error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            record[LATENCY_KEY] = None
            record[WALL_KEY] = time.perf_counter() - started
            return record
    skip = set(record) | {"hw", "section", "speedup_vs_monde"}
    record.update({k: v for k, v in _flatten(result_record).items() if k not in skip})
    record[WALL_KEY] = time.perf_counter() - started
    return record


def _run_chunk(points: Sequence[SweepPoint]) -> list[dict[str, Any]]:
    return [run_point(p) for p in points]


CHUNK_POINTS_MAX = 256  # points per chunk at most: a chunk's records wait in memory until it is handed on


def chunk_size(points: int, workers: int) -> int:
    """Points per chunk: contiguous chunks (neighbouring points share routing traces), about four per worker, at
    most :data:`CHUNK_POINTS_MAX`."""
    return max(1, min(CHUNK_POINTS_MAX, math.ceil(points / (4 * max(1, workers)))))


def _chunks(points: Iterable[SweepPoint], size: int) -> Iterator[list[SweepPoint]]:
    """``points`` in lists of ``size`` (the last shorter), made as they are consumed."""
    source = iter(points)
    while chunk := list(itertools.islice(source, size)):
        yield chunk


@dataclass(frozen=True)
class SweepResult:
    """Records in point order, the Pareto fronts, and how the sweep ran."""

    records: RecordTable | tuple[dict[str, Any], ...]  # a RecordTable (on disk) from run_sweep
    fronts: tuple[dict[str, Any], ...]
    backend: str
    workers: int
    wall_s: float

    def __post_init__(self) -> None:
        if self.backend not in ("serial", "local", "ray"):
            raise SweepGridError(f"unknown backend {self.backend!r}")
        if self.workers < 1 or self.wall_s < 0:
            raise SweepGridError("workers must be positive and wall_s non-negative")
        if isinstance(self.records, tuple) and [r["point"] for r in self.records] != list(range(len(self.records))):
            raise SweepGridError("records must be in point order")  # a RecordTable checks each record it is given

    @property
    def points_per_s(self) -> float:
        return len(self.records) / self.wall_s if self.wall_s > 0 else float("inf")


def _run_local(chunks: Iterable[list[SweepPoint]], tasks: int, jobs: int) -> Generator[list[dict], None, None]:
    # bounded (never more workers than chunks, MAX_WORKERS_HARD, a window of chunks in flight), no orphans:
    # hw_model/sweep/guard.py
    return run_chunks(chunks, tasks, jobs, _run_chunk, SweepGridError)


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a ``host:port`` (or ``ray://host:port``) nobody listens on: ``ray.init`` would retry for
    minutes. ``auto`` and addresses without a port are left to Ray."""
    match = re.fullmatch(r"(?:ray://)?\[?([^\]/]+?)\]?:(\d+)", address)
    if match is None:
        return
    host, port = match.group(1), int(match.group(2))
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise SweepGridError(f"cannot reach a Ray cluster at {address}: {exc.strerror or exc}") from None


def shippable_hw_model(package_dir: Path, staging_dir: Path) -> Path:
    """The ``hw_model`` directory Ray ships to a cluster's workers: ``package_dir`` itself, or, where ``pip install``
    compiled some of its modules (extension modules for this machine's platform, which load a library outside the
    package), a copy of its pure-Python sources and data under ``staging_dir``, which any worker can import."""
    from hw_model import compiled_modules, extension_module_name

    if not compiled_modules(package_dir):
        return package_dir
    copy_dir = staging_dir / package_dir.name
    shutil.copytree(
        package_dir,
        copy_dir,
        ignore=lambda _, names: [n for n in names if n == "__pycache__" or extension_module_name(n) is not None],
    )
    return copy_dir


def _run_ray(chunks: Iterable[list[SweepPoint]], jobs: int, address: str | None) -> Generator[list[dict], None, None]:
    try:
        import ray
    except ImportError:
        raise SweepGridError("--ray needs Ray: pip install 'ndp-ep[ray]' (or run on the local process pool)") from None
    import logging

    import hw_model

    started_here = not ray.is_initialized()
    # ray.init installs its own SIGTERM/SIGINT handlers in this process; they are put back after shutdown
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    if started_here and address:
        _check_reachable(address)
    staging = tempfile.TemporaryDirectory(prefix="ndp-ep-ray-")  # a pure-Python copy of hw_model, if one is shipped
    if started_here:  # ship this hw_model to the workers: a cluster need not have ndp-ep installed
        # a local instance's workers share this machine's packages; a cluster's get the pure-Python sources
        package_dir = Path(hw_model.__file__).parent
        shipped = shippable_hw_model(package_dir, Path(staging.name)) if address else package_dir
        options: dict[str, Any] = {
            "runtime_env": {"py_modules": [str(shipped)]},
            "logging_level": logging.ERROR,
            "log_to_driver": False,
        }
        try:
            if address:
                ray.init(address=address, **options)
            else:
                ray.init(num_cpus=jobs, include_dashboard=False, **options)
        except (ConnectionError, RuntimeError, ValueError) as exc:  # what ray.init raises for a bad address
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            staging.cleanup()
            raise SweepGridError(f"cannot start or join Ray ({address or 'local'}): {first}") from None
    try:
        remote = ray.remote(_run_chunk)  # a window of chunks in flight, results in chunk order (as on the local pool)
        yield from in_order(chunks, IN_FLIGHT_PER_WORKER * jobs, remote.remote, ray.get)
    finally:
        if started_here:
            ray.shutdown()
            for sig, handler in handlers.items():
                if handler is not None:
                    signal.signal(sig, handler)
        staging.cleanup()


def run_sweep(
    grid: SweepGrid,
    jobs: int = 1,
    backend: str = "local",
    ray_address: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SweepResult:
    """Run every point of ``grid``; ``backend`` is ``"local"`` (a process pool of ``jobs`` workers, or
    in-process when ``jobs`` is 1) or ``"ray"`` (``ray_address`` None: a local Ray with ``jobs`` CPUs).

    Points are made as they are needed (:func:`~hw_model.sweep.grid.iter_points`), a bounded window of them is in
    flight, and each record, back in point order, goes to the result's :class:`RecordTable` (a file) and to the
    Pareto fronts (:class:`~hw_model.sweep.pareto.FrontBuilder`, which keeps only the fronts): memory does not
    grow with the number of points."""
    if backend not in ("local", "ray"):
        raise SweepGridError(f"backend must be 'local' or 'ray', got {backend!r}")
    if not isinstance(jobs, int) or jobs < 1:
        raise SweepGridError(f"jobs must be a positive integer, got {jobs!r}")
    total = count_points(grid)
    if progress:
        progress(0, total)
    started = time.perf_counter()
    # SIGTERM/SIGINT/SIGHUP while the sweep runs remove the table's spool (its own folder) before acting as before
    with remove_on_signal():
        chunk_results, used = _execute(grid, total, jobs, backend, ray_address)
        table, fronts = RecordTable(), FrontBuilder(grid.varied_axes)
        try:
            for record in with_speedups(_records(chunk_results, total, progress), grid.baseline):
                table.append(record)
                fronts.add(record)
        except BaseException:
            table.close()
            raise
        finally:  # on an error, the pool (or Ray) is shut down now, not when the traceback goes
            chunk_results.close()
    wall = time.perf_counter() - started
    return SweepResult(table, tuple(fronts.fronts()), used, jobs, wall)


def _execute(
    grid: SweepGrid, total: int, jobs: int, backend: str, ray_address: str | None
) -> tuple[Generator[list[dict], None, None], str]:
    """The records of ``grid``'s points in chunks, in point order, and the backend that runs them."""
    size = chunk_size(total, jobs)
    if backend == "ray":
        return _run_ray(_chunks(iter_points(grid), size), jobs, ray_address), "ray"
    if jobs > 1 and total > 1:
        return _run_local(_chunks(iter_points(grid), size), math.ceil(total / size), jobs), "local"
    return ([run_point(point)] for point in iter_points(grid)), "serial"


def _records(
    chunk_results: Iterable[list[dict]], total: int, progress: Callable[[int, int], None] | None
) -> Iterator[dict[str, Any]]:
    done = 0
    for chunk in chunk_results:
        yield from chunk
        done += len(chunk)
        if progress:
            progress(done, total)
