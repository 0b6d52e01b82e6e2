"""Running a sweep's points: one point end to end (:func:`run_point`), in-process, on a local process pool or on Ray
(:func:`run_sweep`), records back in point order (:class:`SweepResult`)."""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import socket
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hw_model.bench import BenchConfig, Job, run_job
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
    expand,
)
from hw_model.sweep.pareto import add_speedups, pareto_fronts, rectangular

# per worker process: routing traces by (trace, seed, tokens, knobs), the most recently used few only
_TRACE_CACHES: OrderedDict[tuple, dict] = OrderedDict()


TRACE_CACHE_ENTRIES = 8


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
            system = load_system(hw, point.ndp_units)  # loaded here: a sweep's point may have no NDP unit
            if point.trace != SYNTHETIC and point.skew_level == "captured":  # hw_model/sweep_captured.py
                from hw_model.sweep_captured import run_captured

                result_record = run_captured(point.trace, system, point.policy, point.residency_fraction, cache)
            else:
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
                settings = SimulationSettings(
                    hw=system, policy=point.policy, residency_fraction=point.residency_fraction
                )
                job = Job(get_model(point.model), settings, point.skew_level, point.skew, section="sweep")
                result_record = run_job(job, config, cache).record
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


def _chunks(points: Sequence[SweepPoint], workers: int) -> list[list[SweepPoint]]:
    """Contiguous chunks (neighbouring points share routing traces), about four per worker."""
    size = max(1, math.ceil(len(points) / (4 * max(1, workers))))
    return [list(points[i : i + size]) for i in range(0, len(points), size)]


@dataclass(frozen=True)
class SweepResult:
    """Records in point order, the Pareto fronts, and how the sweep ran."""

    records: tuple[dict[str, Any], ...]
    fronts: tuple[dict[str, Any], ...]
    backend: str
    workers: int
    wall_s: float

    def __post_init__(self) -> None:
        if self.backend not in ("serial", "local", "ray"):
            raise SweepGridError(f"unknown backend {self.backend!r}")
        if self.workers < 1 or self.wall_s < 0:
            raise SweepGridError("workers must be positive and wall_s non-negative")
        if [r["point"] for r in self.records] != list(range(len(self.records))):
            raise SweepGridError("records must be in point order")

    @property
    def points_per_s(self) -> float:
        return len(self.records) / self.wall_s if self.wall_s > 0 else float("inf")


def _run_local(chunks: list[list[SweepPoint]], jobs: int, progress: Callable[[int], None]) -> list[list[dict]]:
    results: list[list[dict]] = [[] for _ in chunks]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(_run_chunk, chunk): i for i, chunk in enumerate(chunks)}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            progress(len(results[futures[future]]))
    return results


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


def _run_ray(
    chunks: list[list[SweepPoint]], jobs: int, address: str | None, progress: Callable[[int], None]
) -> list[list[dict]]:
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
        remote = ray.remote(_run_chunk)
        refs = [remote.remote(chunk) for chunk in chunks]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[list[dict]] = [[] for _ in chunks]
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                results[index[ref]] = ray.get(ref)
                progress(len(results[index[ref]]))
        return results
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
    in-process when ``jobs`` is 1) or ``"ray"`` (``ray_address`` None: a local Ray with ``jobs`` CPUs)."""
    if backend not in ("local", "ray"):
        raise SweepGridError(f"backend must be 'local' or 'ray', got {backend!r}")
    if not isinstance(jobs, int) or jobs < 1:
        raise SweepGridError(f"jobs must be a positive integer, got {jobs!r}")
    points = expand(grid)
    done = [0]

    def tick(count: int) -> None:
        done[0] += count
        if progress:
            progress(done[0], len(points))

    if progress:
        progress(0, len(points))
    started = time.perf_counter()
    if backend == "ray":
        chunk_results = _run_ray(_chunks(points, jobs), jobs, ray_address, tick)
        used = "ray"
    elif jobs > 1 and len(points) > 1:
        chunk_results = _run_local(_chunks(points, jobs), jobs, tick)
        used = "local"
    else:
        chunk_results = [[]]
        for point in points:
            chunk_results[0].append(run_point(point))
            tick(1)
        used = "serial"
    wall = time.perf_counter() - started
    records = [r for chunk in chunk_results for r in chunk]
    records.sort(key=lambda r: r["point"])
    add_speedups(records, grid.baseline)
    records = rectangular(records)
    return SweepResult(tuple(records), tuple(pareto_fronts(records, grid.varied_axes)), used, jobs, wall)
