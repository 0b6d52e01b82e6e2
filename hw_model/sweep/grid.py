"""The sweep grid's schema and its validation (:class:`SweepGrid`, read from TOML by :func:`load_grid`), and its
expansion into self-contained points (:class:`SweepPoint`, :func:`expand`); see :mod:`hw_model.sweep` for the file
format."""

from __future__ import annotations

import copy
import itertools
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

import tomli_w

from hw_model.bench import BenchConfig
from hw_model.errors import HardwareConfigError, HwModelError, WorkloadError
from hw_model.hardware import MAX_NDP_UNITS, PRESET_DIR, list_presets, system_from_dict
from hw_model.models import get_model
from hw_model.settings import DEFAULT_HW
from hw_model.sweep.guard import check_grid_size, read_toml
from hw_model.traces import DEFAULT_SKEW_LEVELS, skew_for

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
    return read_toml(path, HardwareConfigError)  # size- and depth-bounded (hw_model/sweep/guard.py)


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
    """TOML text of nested tables of strings, numbers, booleans and lists (what hardware presets hold), by tomli-w."""
    try:
        return tomli_w.dumps(data)
    except TypeError as exc:  # a value TOML has no type for
        raise SweepGridError(f"cannot write as TOML: {exc}") from None


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
        shown = [level if isinstance(level, str) else f"{level:g}" for level in self.skew]
        if len(set(shown)) != len(shown):  # a level names a workload (its Pareto front, its block of points)
            raise SweepGridError(f"skew: two values show as the same level: {shown}")
        for name in ("prompt_tokens", "generated_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_TOKENS:
                raise SweepGridError(f"{name} must be a positive integer of at most {MAX_TOKENS:,}, got {value!r}")
        if self.baseline is not None and self.baseline not in self.policies:
            raise SweepGridError(f"baseline {self.baseline!r} is not one of the grid's policies")
        for trace in self.traces:
            if trace != SYNTHETIC and not Path(trace).is_file():
                raise SweepGridError(f"traces: no such trace file {trace!r}")
        from hw_model.sweep.captured import captured_traces  # routing traces of their own model (--save-routing)

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
            given = list(values) if isinstance(values, list | tuple) else values  # a scalar is one value
            hardware[path] = tuple(_as_tuple(f"hardware.{path}", given, (int, float)))
        object.__setattr__(self, "hardware", MappingProxyType(hardware))
        check_grid_size(self, SweepGridError)  # the product of the axis lengths, before anything is expanded
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
    data = read_toml(path, SweepGridError)  # size- and depth-bounded (hw_model/sweep/guard.py)
    return grid_from_dict(data, base_dir=path.parent)


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
    """Every point of ``grid`` as a list (:func:`iter_points` in a list: tests and small grids; a sweep streams)."""
    return list(iter_points(grid))


def iter_points(grid: SweepGrid) -> Iterator[SweepPoint]:
    """Every point of ``grid``, made one at a time (a grid is never held as a list), in a fixed order: model, hw,
    hardware axes, NDP count, trace, skew, seed, residency fraction, policy (policies of one configuration are
    neighbours; the seeds of one configuration fall within one block of model, hardware, NDP count, trace and
    skew level, which :class:`hw_model.sweep.pareto.FrontBuilder` relies on), then the captured traces' points."""
    index = itertools.count()
    for name in grid.models:
        model = get_model(name)
        for hw, overrides, hw_toml in _hardware_configs(grid):
            for units in grid.ndp_units:
                for trace in grid.traces:
                    if trace in grid.captured:  # a workload of its own model: its points follow
                        continue
                    for level, skew, seed in _variants(grid, model.name, trace):
                        for fraction in grid.residency_fractions:
                            for policy in grid.policies:
                                yield SweepPoint(
                                    next(index), model.name, hw, units, policy, level, skew, trace, seed, fraction,
                                    overrides, hw_toml, grid.prompt_tokens, grid.generated_tokens,
                                    float(grid.locality), grid.shift_at,
                                )  # fmt: skip
    yield from _captured_points(grid, index)


def _variants(grid: SweepGrid, model: str, trace: str) -> Iterator[tuple[str, float, int]]:
    """The (skew level, skew, seed) of a trace's points: every skew x seed of a synthetic one, one of a file."""
    if trace != SYNTHETIC:
        yield FILE_TRACE_SKEW_LEVEL, 0.0, 0
        return
    for lvl in grid.skew:
        level = lvl if isinstance(lvl, str) else f"{lvl:g}"
        for seed in grid.seeds:
            yield level, skew_for(model, lvl) if isinstance(lvl, str) else float(lvl), seed


def _captured_points(grid: SweepGrid, index: Iterator[int]) -> Iterator[SweepPoint]:
    """The points of each captured routing trace (hw_model/sweep/captured.py): the trace's own model, not crossed
    with ``models``, skews or seeds."""
    from hw_model.sweep.captured import CAPTURED_LEVEL, captured_model

    for trace in grid.captured:
        name = captured_model(trace)
        for hw, overrides, hw_toml in _hardware_configs(grid):
            for units in grid.ndp_units:
                for fraction in grid.residency_fractions:
                    for policy in grid.policies:
                        yield SweepPoint(
                            next(index), name, hw, units, policy, CAPTURED_LEVEL, 0.0, trace, 0, fraction,
                            overrides, hw_toml, grid.prompt_tokens, grid.generated_tokens,
                            float(grid.locality), grid.shift_at,
                        )  # fmt: skip


def _hardware_configs(grid: SweepGrid) -> Iterator[tuple[str, tuple[tuple[str, float], ...], str | None]]:
    """Each hardware configuration of ``grid``, made lazily (the hardware axes' product): the preset or file, its
    field overrides, and the TOML text of the edited system (None without hardware axes)."""
    hardware_paths = list(grid.hardware)
    for hw in grid.hw:
        data = _preset_data(hw) if hardware_paths else None
        for combo in itertools.product(*(grid.hardware[path] for path in hardware_paths)):
            overrides = tuple(zip(hardware_paths, combo, strict=True))
            yield hw, overrides, dump_toml(_with_overrides(data, overrides)) if data is not None else None
