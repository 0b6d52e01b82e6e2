"""Sweep throughput: points per second in-process, on the local process pool and on a local Ray.

Runs one grid (default docs/sweep_example.toml: 96 points, 64 + 64-token requests of OLMoE and Mixtral)
through :func:`hw_model.sweep.run_sweep` on each backend and prints points/s. Ray's start-up (``ray.init``
with the ``hw_model`` package shipped to the workers) is timed on its own and excluded from its points/s,
so the figure compares execution; the total with start-up is printed too. Checks that every backend gives
the same table (wall-time columns aside). Ray is skipped, with a note, when it is not installed. ``hw_model`` comes
from this checkout (pure Python), or with ``--installed`` from the installed package (``pip install .`` from this
checkout first), whose hot modules are compiled with mypyc.

Usage: python benchmarks/bench_sweep.py [--grid FILE] [--jobs 2] [--installed]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if "--installed" not in sys.argv:  # read before argparse: it decides where hw_model comes from
    sys.path.insert(0, str(REPO))

from hw_model.sweep import comparable_records, expand, load_grid, run_sweep  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", default=str(REPO / "docs" / "sweep_example.toml"))
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--installed", action="store_true", help="the installed hw_model, not this checkout's")
    args = parser.parse_args()
    grid = load_grid(args.grid)
    points = len(expand(grid))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    import hw_model

    core = ", ".join(hw_model.compiled_modules()) or "none"
    print(f"sweep throughput: {points} points of {Path(args.grid).name}, {args.jobs} workers")
    print(f"hw_model: {Path(hw_model.__file__).parent} (compiled: {core})")
    print(f"machine load average (1 min): {load:.2f} on {os.cpu_count()} CPUs")

    serial = run_sweep(grid, jobs=1)
    print(f"{'in-process (1 worker)':34s} {serial.wall_s:7.2f} s  {serial.points_per_s:7.1f} points/s")
    pool = run_sweep(grid, jobs=args.jobs)
    print(f"{f'local process pool ({args.jobs} workers)':34s} {pool.wall_s:7.2f} s  {pool.points_per_s:7.1f} points/s")
    same = comparable_records(serial.records) == comparable_records(pool.records)
    try:
        import ray
    except ImportError:
        print("local Ray: skipped (ray is not installed: pip install 'ndp-ep[ray]')")
    else:
        started = time.perf_counter()
        ray.init(
            num_cpus=args.jobs,
            include_dashboard=False,
            logging_level=logging.ERROR,
            log_to_driver=False,
            runtime_env={"py_modules": [hw_model]},
        )
        startup_s = time.perf_counter() - started
        try:
            on_ray = run_sweep(grid, jobs=args.jobs, backend="ray")
        finally:
            ray.shutdown()
        print(
            f"{f'local Ray ({args.jobs} CPUs)':34s} {on_ray.wall_s:7.2f} s  {on_ray.points_per_s:7.1f} points/s"
            f"  (+ {startup_s:.1f} s start-up: {points / (on_ray.wall_s + startup_s):.1f} points/s with it)"
        )
        same = same and comparable_records(serial.records) == comparable_records(on_ray.records)
    print(f"identical tables on every backend: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
