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
"""

from __future__ import annotations

import copy
import math
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hw_model.bench import BenchConfig, Job, run_job, write_json_atomic
from hw_model.errors import HardwareConfigError, HwModelError, WorkloadError
from hw_model.figures import save_png
from hw_model.hardware import MAX_NDP_UNITS, PRESET_DIR, list_presets, load_system, system_from_dict
from hw_model.models import get_model
from hw_model.settings import DEFAULT_HW, SimulationSettings
from hw_model.traces import DEFAULT_SKEW_LEVELS, skew_for
from ndp_io import atomic_write

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

SYNTHETIC = "synthetic"
DEFAULT_BASELINE = "monde"  # the grid's baseline when it lists this policy and names none
FILE_TRACE_SKEW_LEVEL = "trace"
HARDWARE_COLUMN_PREFIX = "hw."
LATENCY_KEY = "latency_s"
FEASIBLE_KEY = "feasible"  # false: the experts do not fit the system's memory (the bench's n/f), latency moot
WALL_KEY = "sim_wall_s"  # measured wall time of a point's simulation (differs between runs)
# columns that hold measured wall time (or anything else that differs between runs of the same point)
NONDETERMINISTIC_KEY = re.compile(r"wall|decision_time")
# a request's prompt or generated tokens: its synthetic trace holds a Gumbel draw per token and expert of every
# layer (10^9 tokens exhausted memory); 65,536 is a long context, and each decode step is simulated
MAX_TOKENS = 65_536


class SweepGridError(WorkloadError):
    """A sweep grid file or grid value is invalid (the message names the key)."""


# -- grid -----------------------------------------------------------------------------------------------


def _as_tuple(key: str, value: Any, kind: type | tuple[type, ...]) -> tuple:
    values = tuple(value) if isinstance(value, list) else (value,)
    if not values:
        raise SweepGridError(f"{key}: needs at least one value")
    for v in values:
        if not isinstance(v, kind) or isinstance(v, bool):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise SweepGridError(f"{key}: expected {names} values, got {v!r}")
    if len(set(values)) != len(values):
        raise SweepGridError(f"{key}: repeated values {list(values)}")
    return values


def _preset_data(hw: str) -> dict[str, Any]:
    """The parsed TOML of a hardware preset name or file (as :func:`hw_model.hardware.load_system` reads it)."""
    path = PRESET_DIR / f"{hw}.toml" if hw in list_presets() else Path(hw)
    if not path.is_file():
        raise HardwareConfigError(
            f"unknown hardware '{hw}': not a preset ({', '.join(list_presets())}) and no such file"
        )
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise HardwareConfigError(f"{path}: not valid TOML ({exc})") from None


def _with_overrides(data: Mapping[str, Any], overrides: Iterable[tuple[str, float]]) -> dict[str, Any]:
    """A deep copy of preset ``data`` with the values at dotted paths (``gpu.peak_flops_per_s.bf16``) replaced."""
    out = copy.deepcopy(dict(data))
    for path, value in overrides:
        *tables, name = path.split(".")
        table = out
        for depth, part in enumerate(tables):
            table = table.get(part)
            if not isinstance(table, dict):
                raise SweepGridError(f"hardware.{path}: the preset has no [{'.'.join(tables[: depth + 1])}] table")
        table[name] = value
    return out


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables as dotted keys (grid axes, result records):
    ``{"gpu": {"peak_flops_per_s": {"bf16": [..]}}}`` -> ``{"gpu.peak_flops_per_s.bf16": [..]}``."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def dump_toml(data: Mapping[str, Any]) -> str:
    """TOML text of nested tables of strings, numbers, booleans and lists (what hardware presets hold)."""

    def key(k: str) -> str:
        return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _string(k)

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, float):
            return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
        if isinstance(v, str):
            return _string(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise SweepGridError(f"cannot write {v!r} ({type(v).__name__}) as TOML")

    def table(data: Mapping[str, Any], prefix: tuple[str, ...]) -> list[str]:
        lines = [f"{key(k)} = {value(v)}" for k, v in data.items() if not isinstance(v, Mapping)]
        for k, v in data.items():
            if isinstance(v, Mapping):
                lines += ["", "[" + ".".join(key(p) for p in (*prefix, k)) + "]", *table(v, (*prefix, k))]
        return lines

    return "\n".join(table(data, ())) + "\n"


def _string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\u{ord(m.group()):04x}", escaped)
    return f'"{escaped}"'


@dataclass(frozen=True)
class SweepGrid:
    """The axes of a sweep (see the module docstring); validated on construction."""

    models: tuple[str, ...]
    hw: tuple[str, ...] = (DEFAULT_HW,)
    ndp_units: tuple[int, ...] = (4,)
    policies: tuple[str, ...] = ("tp+lb+prefetch",)
    skew: tuple[str | float, ...] = ("typical",)
    traces: tuple[str, ...] = (SYNTHETIC,)
    seeds: tuple[int, ...] = (0,)
    residency_fractions: tuple[float, ...] = (1.0,)
    hardware: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    prompt_tokens: int = 128
    generated_tokens: int = 128
    locality: float = 0.0
    shift_at: float | None = 0.5
    baseline: str | None = None
    captured: tuple[str, ...] = field(init=False, repr=False, compare=False)  # traces captured by --save-routing

    def __post_init__(self) -> None:
        for name in ("models", "hw", "policies", "traces"):
            object.__setattr__(self, name, _as_tuple(name, list(getattr(self, name)), str))
        object.__setattr__(self, "ndp_units", _as_tuple("ndp_units", list(self.ndp_units), int))
        object.__setattr__(self, "seeds", _as_tuple("seeds", list(self.seeds), int))
        object.__setattr__(self, "skew", _as_tuple("skew", list(self.skew), (str, int, float)))
        fractions = _as_tuple("residency_fractions", list(self.residency_fractions), (int, float))
        object.__setattr__(self, "residency_fractions", tuple(float(f) for f in fractions))
        for units in self.ndp_units:  # 0: a GPU-only system (hw_model.hardware.SystemSpec's range)
            if not 0 <= units <= MAX_NDP_UNITS:
                raise SweepGridError(f"ndp_units: expected integers from 0 to {MAX_NDP_UNITS}, got {units!r}")
        for seed in self.seeds:
            if seed < 0:
                raise SweepGridError(f"seeds: expected non-negative integers, got {seed}")
        if any(not 0.0 <= f <= 1.0 for f in self.residency_fractions):
            raise SweepGridError(f"residency_fractions must be in [0, 1], got {list(self.residency_fractions)}")
        for level in self.skew:
            if isinstance(level, str) and level not in DEFAULT_SKEW_LEVELS:
                raise SweepGridError(
                    f"skew: {level!r} is neither a level ({', '.join(DEFAULT_SKEW_LEVELS)}) nor a number"
                )
            if not isinstance(level, str) and (not math.isfinite(level) or level < 0):
                raise SweepGridError(f"skew: Zipf exponents must be finite and non-negative, got {level!r}")
        for name in ("prompt_tokens", "generated_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_TOKENS:
                raise SweepGridError(f"{name} must be a positive integer of at most {MAX_TOKENS:,}, got {value!r}")
        if self.baseline is not None and self.baseline not in self.policies:
            raise SweepGridError(f"baseline {self.baseline!r} is not one of the grid's policies")
        for trace in self.traces:
            if trace != SYNTHETIC and not Path(trace).is_file():
                raise SweepGridError(f"traces: no such trace file {trace!r}")
        from hw_model.sweep_captured import captured_traces  # routing traces of their own model (--save-routing)

        object.__setattr__(self, "captured", captured_traces(self.traces, SYNTHETIC))
        # models, policies and the scalar knobs: the bench's own checks
        try:
            BenchConfig(
                models=self.models,
                policies=self.policies,
                ndp_units=self.ndp_units,
                prompt_tokens=self.prompt_tokens,
                generated_tokens=self.generated_tokens,
                locality=self.locality,
                shift_at=self.shift_at,
            )
        except HwModelError as exc:
            raise SweepGridError(str(exc)) from None
        hardware: dict[str, tuple[float, ...]] = {}
        for path, values in dict(self.hardware).items():
            if "." not in path:
                raise SweepGridError(f"hardware.{path}: name a field as section.field (e.g. gpu.memory_capacity_bytes)")
            hardware[path] = tuple(_as_tuple(f"hardware.{path}", list(values), (int, float)))
        object.__setattr__(self, "hardware", MappingProxyType(hardware))
        for hw in self.hw:  # every hardware value on every preset must make a valid system
            data = _preset_data(hw)
            for path, values in hardware.items():
                for value in values:
                    try:
                        system_from_dict(_with_overrides(data, [(path, value)]), origin=hw)
                    except HardwareConfigError as exc:
                        raise SweepGridError(f"hardware.{path} = {value!r} on {hw}: {exc}") from None

    def input_files(self) -> tuple[str, ...]:
        """The files the sweep reads: hardware TOML files (not presets) and routing-trace files."""
        presets = set(list_presets())
        return tuple(hw for hw in self.hw if hw not in presets) + tuple(t for t in self.traces if t != SYNTHETIC)

    @property
    def varied_axes(self) -> tuple[str, ...]:
        """Numeric hardware axes with more than one value: ``ndp_units`` and ``hw.<section.field>`` columns."""
        axes = ["ndp_units"] if len(self.ndp_units) > 1 else []
        axes += [HARDWARE_COLUMN_PREFIX + path for path, values in self.hardware.items() if len(values) > 1]
        return tuple(axes)

    def to_json(self) -> dict[str, Any]:
        out = {name: list(getattr(self, name)) for name in ("models", "hw", "ndp_units", "policies", "skew")}
        out.update(traces=list(self.traces), seeds=list(self.seeds), residency_fractions=list(self.residency_fractions))
        out["hardware"] = {path: list(values) for path, values in self.hardware.items()}
        for name in ("prompt_tokens", "generated_tokens", "locality", "shift_at", "baseline"):
            out[name] = getattr(self, name)
        return out


_GRID_KEYS = frozenset(f.name for f in fields(SweepGrid))  # a grid file's keys are the fields


def grid_from_dict(data: Mapping[str, Any], base_dir: str | Path = ".") -> SweepGrid:
    """Build a :class:`SweepGrid` from parsed TOML; relative file paths are taken from ``base_dir``."""
    unknown = sorted(set(data) - _GRID_KEYS)
    if unknown:
        raise SweepGridError(f"unknown grid key {unknown[0]!r} (known: {', '.join(sorted(_GRID_KEYS))})")
    if "models" not in data:
        raise SweepGridError("the grid needs a 'models' list")
    base = Path(base_dir)

    def resolve(name: str) -> str:
        if name == SYNTHETIC or name in list_presets() or Path(name).is_absolute():
            return name
        return str(base / name)

    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key == "hardware":
            if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
                raise SweepGridError("hardware: expected tables [hardware.SECTION] of field = [values]")
            kwargs[key] = _flatten(value)
        elif key in ("models", "hw", "ndp_units", "policies", "skew", "traces", "seeds", "residency_fractions"):
            values = list(value) if isinstance(value, list) else [value]
            if key in ("hw", "traces"):
                values = [resolve(v) if isinstance(v, str) else v for v in values]
            kwargs[key] = values
        elif key == "shift_at" and value is False:
            kwargs[key] = None
        else:
            kwargs[key] = value
    for key in ("prompt_tokens", "generated_tokens"):
        if key in kwargs and not isinstance(kwargs[key], int):
            raise SweepGridError(f"{key} must be a positive integer, got {kwargs[key]!r}")
    for key in ("locality", "shift_at"):
        if kwargs.get(key) is not None and (not isinstance(kwargs[key], (int, float)) or isinstance(kwargs[key], bool)):
            raise SweepGridError(f"{key} must be a number, got {kwargs[key]!r}")
    if "baseline" in kwargs and kwargs["baseline"] is not None and not isinstance(kwargs["baseline"], str):
        raise SweepGridError(f"baseline must be a policy name, got {kwargs['baseline']!r}")
    if "baseline" not in kwargs:
        kwargs["baseline"] = DEFAULT_BASELINE if DEFAULT_BASELINE in kwargs.get("policies", ()) else None
    return SweepGrid(**kwargs)


def load_grid(path: str | Path) -> SweepGrid:
    """Read a grid TOML file (see the module docstring)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SweepGridError(f"{path}: not valid TOML ({exc})") from None
    return grid_from_dict(data, base_dir=path.parent)


# -- points ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepPoint:
    """One simulation of the sweep, self-contained so that it can run on any worker."""

    index: int
    model: str
    hw: str
    ndp_units: int
    policy: str
    skew_level: str
    skew: float
    trace: str
    seed: int
    residency_fraction: float
    hardware: tuple[tuple[str, float], ...]
    hw_toml: str | None  # the hardware file's text when hardware axes apply, else None (``hw`` is used)
    prompt_tokens: int
    generated_tokens: int
    locality: float
    shift_at: float | None

    def __post_init__(self) -> None:
        if self.index < 0 or self.ndp_units < 0:
            raise SweepGridError("point index and ndp_units must be non-negative")
        if not math.isfinite(self.skew) or not 0.0 <= self.residency_fraction <= 1.0:
            raise SweepGridError(f"point {self.index}: bad skew or residency fraction")

    def params(self) -> dict[str, Any]:
        """The point's coordinates as record columns."""
        out: dict[str, Any] = {
            "point": self.index,
            "model": self.model,
            "hw": self.hw,
            "ndp_units": self.ndp_units,
            "policy": self.policy,
            "skew_level": self.skew_level,
            "skew": self.skew,
            "trace": self.trace,
            "seed": self.seed,
            "residency_fraction": self.residency_fraction,
        }
        out.update({HARDWARE_COLUMN_PREFIX + path: value for path, value in self.hardware})
        return out


def expand(grid: SweepGrid) -> list[SweepPoint]:
    """Every point of ``grid`` in a fixed order: model, hw, hardware axes, NDP count, trace, skew, seed,
    residency fraction, policy (policies of one configuration are neighbours)."""
    hardware_paths = list(grid.hardware)
    hardware_combos: list[tuple[float, ...]] = [()]
    for path in hardware_paths:
        hardware_combos = [(*combo, v) for combo in hardware_combos for v in grid.hardware[path]]
    points: list[SweepPoint] = []
    for name in grid.models:
        model = get_model(name)
        for hw in grid.hw:
            data = _preset_data(hw) if hardware_paths else None
            for combo in hardware_combos:
                overrides = tuple(zip(hardware_paths, combo, strict=True))
                hw_toml = dump_toml(_with_overrides(data, overrides)) if data is not None else None
                for units in grid.ndp_units:
                    for trace in grid.traces:
                        if trace in grid.captured:  # a workload of its own model: its points follow
                            continue
                        if trace == SYNTHETIC:
                            variants = [
                                (
                                    lvl if isinstance(lvl, str) else f"{lvl:g}",
                                    skew_for(model.name, lvl) if isinstance(lvl, str) else float(lvl),
                                    seed,
                                )
                                for lvl in grid.skew
                                for seed in grid.seeds
                            ]
                        else:
                            variants = [(FILE_TRACE_SKEW_LEVEL, 0.0, 0)]
                        for level, skew, seed in variants:
                            for fraction in grid.residency_fractions:
                                for policy in grid.policies:
                                    points.append(
                                        SweepPoint(
                                            len(points),
                                            model.name,
                                            hw,
                                            units,
                                            policy,
                                            level,
                                            skew,
                                            trace,
                                            seed,
                                            fraction,
                                            overrides,
                                            hw_toml,
                                            grid.prompt_tokens,
                                            grid.generated_tokens,
                                            float(grid.locality),
                                            grid.shift_at,
                                        )
                                    )
    for trace in grid.captured:  # hw_model/sweep_captured.py: the trace's own model, not crossed with ``models``
        from hw_model.sweep_captured import CAPTURED_LEVEL, captured_model

        name = captured_model(trace)
        for hw in grid.hw:
            data = _preset_data(hw) if hardware_paths else None
            for combo in hardware_combos:
                overrides = tuple(zip(hardware_paths, combo, strict=True))
                hw_toml = dump_toml(_with_overrides(data, overrides)) if data is not None else None
                for units in grid.ndp_units:
                    for fraction in grid.residency_fractions:
                        for policy in grid.policies:
                            points.append(
                                SweepPoint(
                                    len(points), name, hw, units, policy, CAPTURED_LEVEL, 0.0, trace, 0, fraction,
                                    overrides, hw_toml, grid.prompt_tokens, grid.generated_tokens,
                                    float(grid.locality), grid.shift_at,
                                )
                            )  # fmt: skip
    return points


# -- running --------------------------------------------------------------------------------------------

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


def rectangular(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The records with one set of columns (first-seen order), None where a record has no value: policies
    report different counters (prefetch, cache), and a table needs every column in every row."""
    columns = list(dict.fromkeys(k for r in records for k in r))
    columns = [k for k in columns if k != WALL_KEY] + [k for k in columns if k == WALL_KEY]  # measured time last
    return [{k: r.get(k) for k in columns} for r in records]


def add_speedups(records: Sequence[dict[str, Any]], baseline: str | None) -> None:
    """Set ``speedup_vs_baseline`` = the baseline policy's latency / this latency at the same coordinates."""
    if baseline is None:
        return

    def key(r: Mapping[str, Any]) -> tuple:
        return tuple(sorted((k, v) for k, v in r.items() if k in _coordinate_keys(r) and k != "policy"))

    base = {key(r): r[LATENCY_KEY] for r in records if r["policy"] == baseline and r.get(LATENCY_KEY)}
    for r in records:
        reference = base.get(key(r))
        r["speedup_vs_baseline"] = reference / r[LATENCY_KEY] if reference and r.get(LATENCY_KEY) else None


_COORDINATES = ("model", "hw", "ndp_units", "policy", "skew_level", "skew", "trace", "seed", "residency_fraction")
WORKLOAD_KEYS = ("model", "trace", "skew_level")  # what is simulated; a Pareto front is per workload
DESIGN_KEYS = ("hw", "ndp_units", "policy", "residency_fraction")  # what is chosen (plus the hw.* axes)


def _coordinate_keys(record: Mapping[str, Any]) -> set[str]:
    return set(_COORDINATES) | {k for k in record if k.startswith(HARDWARE_COLUMN_PREFIX)}


def pareto_front(rows: Sequence[Mapping[str, Any]], x: str, y: str = LATENCY_KEY) -> list[Mapping[str, Any]]:
    """Rows no other row beats on both ``x`` (a resource: less is better) and ``y`` (latency), sorted by
    ``x``; of rows with equal ``x`` and ``y`` the first given is kept."""
    usable = [(r[x], r[y], i, r) for i, r in enumerate(rows) if r.get(x) is not None and r.get(y) is not None]
    front: list[Mapping[str, Any]] = []
    best = math.inf
    for _, value, _, row in sorted(usable, key=lambda t: t[:3]):
        if value < best:
            front.append(row)
            best = value
    return front


def _design_keys(record: Mapping[str, Any]) -> list[str]:
    return [*DESIGN_KEYS, *sorted(k for k in record if k.startswith(HARDWARE_COLUMN_PREFIX))]


def configurations(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (workload, design) configuration: its coordinates, the mean latency over its seeds,
    how many seeds and which points; rows in the order of their first point. Failed points are left out, and
    so is a configuration any of whose points is infeasible (as ``ndp-ep bench`` leaves them out: n/f)."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    infeasible: set[tuple] = set()
    for r in records:
        if r.get(LATENCY_KEY) is not None:
            key = tuple((k, r[k]) for k in (*WORKLOAD_KEYS, *_design_keys(r)))
            groups.setdefault(key, []).append(r)
            if r.get(FEASIBLE_KEY) is False:
                infeasible.add(key)
    rows = []
    for key, members in groups.items():
        if key in infeasible:
            continue
        row: dict[str, Any] = dict(key)
        row[LATENCY_KEY] = sum(m[LATENCY_KEY] for m in members) / len(members)
        row["seeds"] = len(members)
        row["points"] = [m["point"] for m in members]
        rows.append(row)
    return rows


def pareto_fronts(records: Sequence[Mapping[str, Any]], axes: Sequence[str]) -> list[dict[str, Any]]:
    """For each workload (model, trace, skew level) and each resource axis, the configurations on the
    latency/resource Pareto front (latency averaged over seeds): ``{model, trace, skew_level, axis, front}``;
    a workload none of whose configurations is feasible has an empty front."""
    rows = configurations(records)
    workloads = list(dict.fromkeys(tuple(r[k] for k in WORKLOAD_KEYS) for r in records))
    out = []
    for workload in workloads:
        mine = [r for r in rows if tuple(r[k] for k in WORKLOAD_KEYS) == workload]
        for axis in axes:
            out.append(
                {**dict(zip(WORKLOAD_KEYS, workload, strict=True)), "axis": axis, "front": pareto_front(mine, axis)}
            )
    return out


def comparable_records(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The records without measured wall-time columns: equal for equal inputs, whichever backend ran them."""
    return [{k: v for k, v in r.items() if not NONDETERMINISTIC_KEY.search(k)} for r in records]


# -- output ---------------------------------------------------------------------------------------------


SWEEP_FILES = ("sweep.json", "pareto.json", "sweep.parquet", "pareto.png")


def output_files(out_dir: str | Path) -> list[Path]:
    """Every file :func:`write_sweep` may write in ``out_dir`` (to check against the inputs before a sweep)."""
    return [Path(out_dir) / name for name in SWEEP_FILES]


def write_sweep(result: SweepResult, out_dir: str | Path) -> list[Path]:
    """Write ``sweep.json``, ``pareto.json`` and, when their packages are installed, ``sweep.parquet`` and
    ``pareto.png``; returns the paths written. Missing pyarrow or matplotlib is a warning on stderr."""
    table_path, pareto_path, parquet_path, png_path = output_files(out_dir)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    records = [dict(r) for r in result.records]
    written = [table_path, pareto_path]
    write_json_atomic(table_path, records)
    write_json_atomic(pareto_path, list(result.fronts))
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        print("ndp-ep sweep: pyarrow is not installed, sweep.parquet skipped (pip install pyarrow)", file=sys.stderr)
    else:
        with atomic_write(parquet_path) as handle:
            pq.write_table(pa.Table.from_pylist(records), handle)
        written.append(parquet_path)
    if result.fronts:
        try:
            written.append(plot_pareto(records, result.fronts, png_path))
        except ImportError:
            print(
                "ndp-ep sweep: matplotlib is not installed, pareto.png skipped (pip install 'ndp-ep[plot]')",
                file=sys.stderr,
            )
    return written


def plot_pareto(records: Sequence[Mapping[str, Any]], fronts: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
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


__all__ = [
    "SweepGrid",
    "SweepGridError",
    "SweepPoint",
    "SweepResult",
    "add_speedups",
    "comparable_records",
    "dump_toml",
    "expand",
    "grid_from_dict",
    "load_grid",
    "output_files",
    "configurations",
    "pareto_front",
    "pareto_fronts",
    "rectangular",
    "plot_pareto",
    "run_point",
    "run_sweep",
    "write_sweep",
]
