"""``ndp-ep sweep GRID.toml``: a design-space sweep (models x hardware x policies x traces x seeds).

Runs every point of the grid (see :mod:`hw_model.sweep` for the file format) on a local process pool, or on
Ray with ``--ray`` (a local Ray instance, or the cluster at ``--ray ADDRESS``), prints the Pareto fronts
(``--json``: one JSON object on stdout instead) and, only when ``--out`` names a directory, writes
``sweep.json``, ``sweep.parquet`` (pyarrow), ``pareto.json`` and ``pareto.png`` (matplotlib) there; none of
them may be one of the sweep's inputs (the grid, its hardware and trace files).
"""

from __future__ import annotations

import argparse
import json
import sys

HELP = "design-space sweep of the simulated GPU + NDP system from a TOML grid, on a process pool or Ray"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ndp_ep.cli_args import default_jobs, jobs_arg, output_dir

    parser.add_argument("grid", help="grid TOML file (axes: models, hw, ndp_units, policies, skew, traces, seeds...)")
    parser.add_argument(
        "--out",
        type=output_dir,
        default=None,
        metavar="DIR",
        help="write sweep.json/.parquet and pareto.json/.png to DIR (default: nothing written)",
    )
    parser.add_argument("--jobs", type=jobs_arg, default=default_jobs(), help="parallel worker processes")
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run on Ray (the ray extra): a local instance, or the cluster at ADDRESS",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _progress(done: int, total: int) -> None:
    if done == total or done * 10 // max(1, total) != (done - 1) * 10 // max(1, total):
        print(f"sweep: {done}/{total} points", file=sys.stderr, flush=True)


def _value(value: object) -> str:
    """A hardware value for people: 25.6G rather than 2.56e+10."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return str(value)
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.4g}{prefix}"
    return f"{value:.4g}"


def _print_json(payload: dict, rows_key: str) -> None:
    """``print(json.dumps(payload))`` with ``payload[rows_key]`` (an iterable) written a row at a time."""
    out = sys.stdout
    out.write("{")
    for i, (key, value) in enumerate(payload.items()):
        out.write(("" if i == 0 else ", ") + json.dumps(key) + ": ")
        if key != rows_key:
            out.write(json.dumps(value))
            continue
        out.write("[")
        for j, row in enumerate(value):
            out.write(("" if j == 0 else ", ") + json.dumps(row))
        out.write("]")
    out.write("}\n")


def run(args: argparse.Namespace) -> int:
    from hw_model.sweep import HARDWARE_COLUMN_PREFIX, LATENCY_KEY, load_grid, output_files, run_sweep, write_sweep
    from ndp_ep.text import plural
    from ndp_io import check_no_clobber

    grid = load_grid(args.grid)
    if args.out is not None:  # before any work
        check_no_clobber(output_files(args.out), [args.grid, *grid.input_files()])
    backend = "ray" if args.ray is not None else "local"
    result = run_sweep(grid, jobs=args.jobs, backend=backend, ray_address=args.ray or None, progress=_progress)
    files = write_sweep(result, args.out) if args.out is not None else []
    failed, infeasible = 0, 0  # one pass over the records (a file: never all in memory)
    first_failed: list[dict] = []
    for record in result.records:
        if record.get("error"):
            failed += 1
            first_failed += [record] if len(first_failed) < 5 else []
        elif record.get("feasible") is False:
            infeasible += 1
    if args.json:
        payload = {
            "grid": grid.to_json(),
            "backend": result.backend,
            "workers": result.workers,
            "points": len(result.records),
            "failed": failed,
            "infeasible": infeasible,
            "wall_s": result.wall_s,
            "points_per_s": result.points_per_s,
            "files": [str(p) for p in files],
            "records": result.records,
            "pareto": list(result.fronts),
        }
        _print_json(payload, "records")
        return 0
    print(
        f"{plural(len(result.records), 'point')} ({failed} failed, {infeasible} whose experts do not fit: left "
        f"out of the Pareto fronts) in {result.wall_s:.1f} s on {result.backend} with {result.workers} worker(s): "
        f"{result.points_per_s:.1f} points/s"
    )
    for record in first_failed:
        print(f"  point {record['point']} ({record['model']}, {record['policy']}): {record['error']}")
    for front in result.fronts:
        axis = front["axis"]
        print(f"\nPareto front of {front['model']} ({front['skew_level']}), latency vs {axis}:")
        if not front["front"]:
            print("  no feasible configuration (every point failed or its experts do not fit)")
        for row in front["front"]:
            hardware = ", ".join(
                f"{k.removeprefix(HARDWARE_COLUMN_PREFIX)}={_value(v)}"
                for k, v in row.items()
                if k.startswith(HARDWARE_COLUMN_PREFIX) and k != axis
            )
            extra = f", {hardware}" if hardware else ""
            print(
                f"  {axis.removeprefix(HARDWARE_COLUMN_PREFIX)}={_value(row[axis])}: {row[LATENCY_KEY]:.4g} s  "
                f"{row['policy']} on {row['hw']} ({row['ndp_units']} NDP units{extra})"
            )
    if files:
        print(f"\nwrote {', '.join(str(p) for p in files)}")
    return 0
