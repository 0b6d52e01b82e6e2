"""Design-space sweeps: a TOML grid of models x hardware x policies x traces x seeds, run on a process pool or Ray.

A grid file lists one value or a list of values per axis; every combination is one point, simulated end to
end by the bench's job runner (:func:`hw_model.bench.run_job`: prefill + decode of one request)::

    models = ["olmoe-1b-7b", "mixtral-8x7b"]      # required
    hw = ["paper"]                                # presets or hardware TOML files
    ndp_units = [2, 4, 6]
    policies = ["monde", "tp+lb+prefetch"]
    skew = ["typical", 1.2]                       # calibrated levels (low/typical/high) or Zipf exponents
    traces = ["synthetic"]                        # "synthetic" or routing-trace files (.npz/.json)
    seeds = [0, 1]                                # seeds of the synthetic traces
    residency_fractions = [1.0]                   # share of free GPU memory for resident experts
    prompt_tokens = 128                           # scalars: the request simulated at every point
    generated_tokens = 128
    locality = 0.0
    shift_at = 0.5                                # false: no domain shift
    baseline = "monde"                            # speedup_vs_baseline against this policy (default: monde if listed)

    [hardware.ndp_unit]                           # hardware axes: any numeric preset field, by section
    memory_bandwidth_bytes_per_s = [25.6e9, 51.2e9]
    [hardware.gpu]
    memory_capacity_bytes = [8e9, 16e9]

Bounds, checked when the grid is loaded: ``ndp_units`` 0-64 (:data:`hw_model.hardware.MAX_NDP_UNITS`; 0 is a
GPU-only system), ``prompt_tokens`` and ``generated_tokens`` 1-65,536 (:data:`MAX_TOKENS`), ``seeds`` >= 0.
Skew and seeds apply to synthetic traces only (a trace file is one point per other combination). Hardware
axes are applied to each ``hw`` preset's TOML data and checked by :func:`hw_model.hardware.system_from_dict`
when the grid is loaded, so a bad field or value fails before anything runs; each point carries its hardware
file's text, so a worker on another machine needs no shared file system. Relative paths in the grid are
relative to the grid file.

Backends: in-process (``jobs=1``), a local :class:`concurrent.futures.ProcessPoolExecutor`, or Ray (the
``ray`` extra; ``ray.init()`` starts a local instance, or joins a cluster by address; the ``hw_model``
package is shipped to the workers with Ray's ``py_modules``). Records come back in point order whatever the
backend, so local and Ray tables are identical except for the measured wall-time columns
(:func:`comparable_records` drops those). A point whose inputs the simulator rejects (e.g. a policy needing
NDP units with ``ndp_units = 0``) gets a record with an ``error`` message instead of results.

Outputs (:func:`write_sweep`): ``sweep.json`` (one flat record per point), ``sweep.parquet`` when pyarrow is
installed, ``pareto.json`` (per workload -- model, trace, skew -- and varied resource axis, the feasible
configurations on the latency/resource Pareto front, latency averaged over seeds) and ``pareto.png`` when
matplotlib is installed.

A sweep streams (issue 32): points are made one at a time (:func:`iter_points`), a bounded window of chunks is in
flight on the pool or Ray, each record goes, in point order, to a :class:`RecordTable` (a temporary file) and to the
Pareto fronts (:class:`FrontBuilder`, which keeps only the fronts and the open block's configurations), and the
tables are written a record at a time; memory does not grow with the number of points (the figure, a dot per
configuration, aside).

The package's modules: :mod:`~hw_model.sweep.grid` (the schema, its validation, the points),
:mod:`~hw_model.sweep.execution` (running the points), :mod:`~hw_model.sweep.stream` (the records as they come),
:mod:`~hw_model.sweep.pareto` (the table and its fronts), :mod:`~hw_model.sweep.output` (the files).
"""

from __future__ import annotations

from hw_model.sweep.execution import TRACE_CACHE_ENTRIES, SweepResult, run_point, run_sweep, shippable_hw_model
from hw_model.sweep.grid import (
    DEFAULT_BASELINE,
    FEASIBLE_KEY,
    FILE_TRACE_SKEW_LEVEL,
    HARDWARE_COLUMN_PREFIX,
    LATENCY_KEY,
    MAX_TOKENS,
    NONDETERMINISTIC_KEY,
    SYNTHETIC,
    WALL_KEY,
    SweepGrid,
    SweepGridError,
    SweepPoint,
    dump_toml,
    expand,
    grid_from_dict,
    iter_points,
    load_grid,
)
from hw_model.sweep.output import SWEEP_FILES, output_files, plot_pareto, write_sweep
from hw_model.sweep.pareto import (
    DESIGN_KEYS,
    WORKLOAD_KEYS,
    FrontBuilder,
    add_speedups,
    comparable_records,
    configurations,
    pareto_front,
    pareto_fronts,
    rectangular,
)
from hw_model.sweep.stream import RecordTable, with_speedups

__all__ = [
    "DEFAULT_BASELINE",
    "DESIGN_KEYS",
    "FEASIBLE_KEY",
    "FrontBuilder",
    "FILE_TRACE_SKEW_LEVEL",
    "HARDWARE_COLUMN_PREFIX",
    "LATENCY_KEY",
    "MAX_TOKENS",
    "NONDETERMINISTIC_KEY",
    "RecordTable",
    "SWEEP_FILES",
    "SYNTHETIC",
    "TRACE_CACHE_ENTRIES",
    "WALL_KEY",
    "WORKLOAD_KEYS",
    "SweepGrid",
    "SweepGridError",
    "SweepPoint",
    "SweepResult",
    "add_speedups",
    "comparable_records",
    "configurations",
    "dump_toml",
    "expand",
    "grid_from_dict",
    "iter_points",
    "load_grid",
    "output_files",
    "pareto_front",
    "pareto_fronts",
    "plot_pareto",
    "rectangular",
    "run_point",
    "run_sweep",
    "shippable_hw_model",
    "with_speedups",
    "write_sweep",
]
