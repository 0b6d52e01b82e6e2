"""A sweep's files: ``sweep.json``, ``pareto.json``, ``sweep.parquet`` (with pyarrow) and ``pareto.png`` (with
matplotlib)."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from hw_model.bench import write_json_atomic
from hw_model.figures import save_png
from hw_model.sweep.execution import SweepResult
from hw_model.sweep.grid import HARDWARE_COLUMN_PREFIX, LATENCY_KEY, SYNTHETIC
from hw_model.sweep.pareto import ENERGY_KEY, WORKLOAD_KEYS, configurations
from ndp_io import atomic_write
from ndp_io.limits import MAX_FIGURE_POINTS, limit_note

SWEEP_FILES = ("sweep.json", "pareto.json", "sweep.parquet", "pareto.png")


def output_files(out_dir: str | Path) -> list[Path]:
    """Every file :func:`write_sweep` may write in ``out_dir`` (to check against the inputs before a sweep)."""
    return [Path(out_dir) / name for name in SWEEP_FILES]


PARQUET_BATCH_ROWS = 4_096  # rows of sweep.parquet converted from Python records at a time
PARQUET_ROW_GROUP_ROWS = 131_072  # rows held as Arrow columns (compact) before a row group is written


def write_sweep(result: SweepResult, out_dir: str | Path) -> list[Path]:
    """Write ``sweep.json``, ``pareto.json`` and, when their packages are installed, ``sweep.parquet`` and
    ``pareto.png``; returns the paths written. Missing pyarrow or matplotlib is a warning on stderr. The tables are
    written a record at a time (a batch at a time for parquet), never all in memory; the figure draws a dot per
    configuration, so it holds those, and is skipped (a note on stderr) over :data:`ndp_io.limits.MAX_FIGURE_POINTS`
    points."""
    table_path, pareto_path, parquet_path, png_path = output_files(out_dir)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    written = [table_path, pareto_path]
    with atomic_write(table_path, "w", encoding="utf-8") as handle:
        write_json_rows(handle, result.records)
    write_json_atomic(pareto_path, list(result.fronts))
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        print("ndp-ep sweep: pyarrow is not installed, sweep.parquet skipped (pip install pyarrow)", file=sys.stderr)
    else:
        written.append(write_parquet(result.records, parquet_path))
    if result.fronts and len(result.records) > MAX_FIGURE_POINTS:
        print(
            f"ndp-ep sweep: pareto.png skipped: {len(result.records):,} points, the figure draws at most "
            f"{MAX_FIGURE_POINTS:,} {limit_note('MAX_FIGURE_POINTS')}",
            file=sys.stderr,
        )
    elif result.fronts:
        try:
            written.append(plot_pareto(result.records, result.fronts, png_path))
        except ImportError:
            print(
                "ndp-ep sweep: matplotlib is not installed, pareto.png skipped (pip install 'ndp-ep[plot]')",
                file=sys.stderr,
            )
    return written


def write_json_rows(handle: IO[str], rows: Iterable[Mapping[str, Any]]) -> None:
    """``json.dumps(list(rows), indent=1) + "\n"`` written a row at a time (the same text: a list item is its own
    indented text shifted one space, JSON strings holding no raw newline)."""
    first = True
    for row in rows:
        handle.write("[\n " if first else ",\n ")
        handle.write(json.dumps(row, indent=1).replace("\n", "\n "))
        first = False
    handle.write("[]\n" if first else "\n]\n")


def write_parquet(rows: Iterable[Mapping[str, Any]], path: Path) -> Path:
    """``rows`` as a parquet file, the same bytes as ``pyarrow.Table.from_pylist(list(rows))`` written whole when
    they fit one row group (:data:`PARQUET_ROW_GROUP_ROWS`), without holding them: a first pass finds the schema
    of all of them (what ``from_pylist`` infers from the whole list: each batch's, unified), a second converts
    :data:`PARQUET_BATCH_ROWS` at a time and writes a row group at a time. Raises ImportError without pyarrow."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = None
    for batch in _batches(rows, PARQUET_BATCH_ROWS):
        found = pa.Table.from_pylist(batch).schema
        if schema is None or not found.equals(schema):
            schema = found if schema is None else pa.unify_schemas([schema, found], promote_options="permissive")
    schema = pa.schema([]) if schema is None else schema
    with atomic_write(path) as handle, pq.ParquetWriter(handle, schema) as writer:
        group: list[Any] = []
        for batch in _batches(rows, PARQUET_BATCH_ROWS):
            group.append(pa.Table.from_pylist(batch, schema=schema))
            if sum(t.num_rows for t in group) >= PARQUET_ROW_GROUP_ROWS:
                writer.write_table(pa.concat_tables(group))
                group = []
        if group:
            writer.write_table(pa.concat_tables(group))
    return path


def _batches(rows: Iterable[Mapping[str, Any]], size: int) -> Iterator[list[Mapping[str, Any]]]:
    source = iter(rows)
    while batch := list(itertools.islice(source, size)):
        yield batch


def plot_pareto(records: Iterable[Mapping[str, Any]], fronts: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Latency against each varied resource axis: one row per workload, one column per axis, each
    configuration (mean over seeds) a dot coloured by policy, the Pareto front a step line. Raises
    ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    rows = configurations(records)
    workloads = list(dict.fromkeys(tuple(f[k] for k in WORKLOAD_KEYS) for f in fronts))
    axes_names = list(dict.fromkeys(f["axis"] for f in fronts))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    colours = dict(zip(policies, plt.get_cmap("tab10").colors, strict=False))
    fig, panels = plt.subplots(
        len(workloads), len(axes_names), figsize=(4.4 * len(axes_names), 3.4 * len(workloads)), squeeze=False
    )
    for i, workload in enumerate(workloads):
        mine = [r for r in rows if tuple(r[k] for k in WORKLOAD_KEYS) == workload]
        model, trace, level = workload
        title = model if trace == SYNTHETIC else f"{model}, {Path(trace).name}"
        title += f" (skew {level})" if trace == SYNTHETIC else ""
        for j, axis in enumerate(axes_names):
            ax = panels[i][j]
            for policy in policies:
                pts = [r for r in mine if r["policy"] == policy]
                ax.scatter(
                    [r[axis] for r in pts],
                    [r[LATENCY_KEY] for r in pts],
                    s=16,
                    alpha=0.75,
                    color=colours[policy],
                    label=policy,
                )
            front = next(
                (f["front"] for f in fronts if f["axis"] == axis and tuple(f[k] for k in WORKLOAD_KEYS) == workload), []
            )
            if front:
                ax.step(
                    [r[axis] for r in front],
                    [r[LATENCY_KEY] for r in front],
                    where="post",
                    color="black",
                    lw=1.2,
                    label="Pareto front",
                )
            values = [r[LATENCY_KEY] for r in mine]
            if values and max(values) > 20 * min(values):
                ax.set_yscale("log")
            if axis == ENERGY_KEY:  # a continuous axis: matplotlib's own ticks
                ax.set_xlabel("request energy, J")
            else:
                ticks = sorted({r[axis] for r in mine})
                ax.set_xticks(ticks)
                if ticks and max(abs(t) for t in ticks) >= 1e4:  # bytes/s, bytes: 25.6 G rather than 2.56e10
                    ax.xaxis.set_major_formatter(EngFormatter())
                ax.set_xlabel(axis.removeprefix(HARDWARE_COLUMN_PREFIX))
            ax.set_ylabel("end-to-end latency, s")
            ax.set_title(title, fontsize=9)
    panels[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return save_png(fig, path, dpi=110, bbox_inches="tight")
