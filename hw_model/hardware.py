"""Hardware description of a GPU + NDP-DIMM system, loaded from TOML presets or user files.

    host CPU/DRAM ──PCIe (host_link)── GPU (HBM/GDDR, tensor cores)
         │
         ├── NDP unit 0 (DIMM: DRAM + small compute core, buffer)
         ├── NDP unit 1        ... linked to each other by ndp_link
         └── NDP unit N-1

Every numeric field carries its unit in its name. Presets live in ``hw_model/presets/*.toml``; in a preset
each number has a sibling ``<field>_source`` string that cites where it came from or says it is an
assumption. User files may omit the sources.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from hw_model.energy_spec import GpuEnergySpec, LinkEnergySpec, NdpEnergySpec, energy_from_table, energy_to_dict
from hw_model.errors import HardwareConfigError
from hw_model.spec_numbers import MAX_GEMM_TILE_M, require_per_dtype, require_positive, shown_number
from ndp_io.limits import MAX_DESCRIPTION_CHARS, MAX_NAME_CHARS, MAX_PATH_BYTES, limit_note
from ndp_io.parsing import read_toml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

PRESET_DIR = Path(__file__).parent / "presets"
DTYPE_BYTES: Mapping[str, int] = MappingProxyType({"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1})
# A host has at most a few dozen DIMM slots; the simulator's state grows with the unit count (10,000 units took
# 113 s, 10^8 exhausted memory). 0 units is a GPU-only system.
MAX_NDP_UNITS = 64
MAX_RANKS = 64  # ranks per NDP unit: a DIMM has 1-8; the derived bandwidth is ranks x one rank's


def _require_unit_count(where: str, value: Any, low: int) -> None:
    """``value`` is an integer from ``low`` to :data:`MAX_NDP_UNITS`."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_NDP_UNITS:
        raise HardwareConfigError(
            f"{where} must be an integer from {low} to {MAX_NDP_UNITS}, got {shown_number(value)}"
        )


@dataclass(frozen=True)
class ComputeSpec:
    """Anything that runs kernels: a roofline (peak FLOP/s per dtype, memory bandwidth) and fixed costs.

    The cost form (see :mod:`hw_model.cost`) is shared by every device; the fields below only set its
    constants. Peaks are vendor figures; ``achievable_*_fraction`` scale them to what a large, well-shaped
    kernel reaches (measured ceilings); the remaining fields describe small-kernel behaviour:

    - ``kernel_overhead_s``: fixed cost of one kernel launched from a captured graph (launch gap + the
      shortest possible kernel);
    - ``reduction_latency_s``: extra fixed cost of a matrix product per doubling of its reduction length K;
    - ``gemm_tile_m``: the row-tile a matrix-product kernel pads the token count M up to (1 = no padding);
      a single-row product (M = 1) runs as a matrix-vector kernel and is never padded;
    - ``gemm_fixed_k_elements``: per-tile prologue/epilogue cost expressed as that many extra reduction steps
      (compute efficiency of a product with reduction length K is ``K / (K + gemm_fixed_k_elements)``);
    - ``launch_overhead_eager_s``: host time to launch one operator eagerly from Python;
    - ``sync_overhead_s``: one host<->device round trip (an event-timed region, a ``nonzero`` that syncs).
    """

    name: str
    peak_flops_per_s: Mapping[str, float]
    memory_bandwidth_bytes_per_s: float
    memory_capacity_bytes: float
    kernel_overhead_s: float
    achievable_flops_fraction: float = 1.0
    achievable_bandwidth_fraction: float = 1.0
    reduction_latency_s: float = 0.0
    gemm_tile_m: int = 1
    gemm_fixed_k_elements: float = 0.0
    launch_overhead_eager_s: float = 0.0
    sync_overhead_s: float = 0.0
    energy: Any = None  # GpuEnergySpec / NdpEnergySpec (hw_model.energy_spec), None: no energy figures

    _energy_class: ClassVar[type] = GpuEnergySpec

    def __post_init__(self) -> None:
        if self.energy is not None and not isinstance(self.energy, self._energy_class):
            raise HardwareConfigError(f"{self._section}.energy must be a {self._energy_class.__name__}")
        object.__setattr__(self, "peak_flops_per_s", MappingProxyType(dict(self.peak_flops_per_s)))
        require_per_dtype(f"{self._section}.peak_flops_per_s", self.peak_flops_per_s, DTYPE_BYTES, "peak FLOP/s")
        require_positive(f"{self._section}.memory_bandwidth_bytes_per_s", self.memory_bandwidth_bytes_per_s)
        require_positive(f"{self._section}.memory_capacity_bytes", self.memory_capacity_bytes)
        for name in ("kernel_overhead_s", "reduction_latency_s", "gemm_fixed_k_elements"):
            require_positive(f"{self._section}.{name}", getattr(self, name), allow_zero=True)
        for name in ("launch_overhead_eager_s", "sync_overhead_s"):
            require_positive(f"{self._section}.{name}", getattr(self, name), allow_zero=True)
        for name in ("achievable_flops_fraction", "achievable_bandwidth_fraction"):
            value = getattr(self, name)
            require_positive(f"{self._section}.{name}", value)
            if value > 1:
                raise HardwareConfigError(f"{self._section}.{name} must be in (0, 1], got {value!r}")
        tile = self.gemm_tile_m
        if not isinstance(tile, int) or isinstance(tile, bool) or not 1 <= tile <= MAX_GEMM_TILE_M:
            shown = repr(tile) if not isinstance(tile, int) or abs(tile) < 10**30 else "an integer beyond range"
            raise HardwareConfigError(
                f"{self._section}.gemm_tile_m must be an integer from 1 to {MAX_GEMM_TILE_M:,}, got {shown}"
            )

    _section = "device"

    def flops_per_s(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``; a dtype the preset does not list falls back to the slowest listed."""
        if dtype in self.peak_flops_per_s:
            return self.peak_flops_per_s[dtype]
        return min(self.peak_flops_per_s.values())

    def achievable_flops_per_s(self, dtype: str) -> float:
        """FLOP/s a large matrix product of ``dtype`` reaches (peak x ``achievable_flops_fraction``)."""
        return self.flops_per_s(dtype) * self.achievable_flops_fraction

    @property
    def achievable_bandwidth_bytes_per_s(self) -> float:
        """Memory bandwidth a streaming kernel reaches (peak x ``achievable_bandwidth_fraction``)."""
        return self.memory_bandwidth_bytes_per_s * self.achievable_bandwidth_fraction


@dataclass(frozen=True)
class GpuSpec(ComputeSpec):
    """The GPU: tensor-core peak per dtype, device-memory bandwidth and capacity, per-kernel launch cost."""

    _section = "gpu"


@dataclass(frozen=True)
class NdpUnitSpec(ComputeSpec):
    """One NDP unit (an NDP-DIMM): near-data bandwidth, its compute core and its on-chip buffer.

    With ``dram`` (a standard of :data:`hw_model.dram.DDR_STANDARDS`), the loader derives the DRAM side from
    JEDEC timings: ``memory_bandwidth_bytes_per_s = ranks x rank peak``, ``achievable_bandwidth_fraction`` =
    the interleaved streaming efficiency, ``kernel_overhead_s = control_overhead_s`` (host<->NDP command and
    completion, a separate assumed constant) + the DRAM's first-access time. ``host_read_bandwidth_bytes_per_s``
    is then what a host copy reading this DIMM reaches (its channel at the streaming efficiency).
    """

    buffer_bytes: float = 256 * 1024
    dram: str = ""
    ranks: int = 1
    control_overhead_s: float = 0.0

    _section = "ndp_unit"
    _energy_class = NdpEnergySpec

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive("ndp_unit.buffer_bytes", self.buffer_bytes)
        require_positive("ndp_unit.control_overhead_s", self.control_overhead_s, allow_zero=True)
        if not isinstance(self.ranks, int) or isinstance(self.ranks, bool) or not 1 <= self.ranks <= MAX_RANKS:
            raise HardwareConfigError(
                f"ndp_unit.ranks must be an integer from 1 to {MAX_RANKS}, got {shown_number(self.ranks)}"
            )
        trp_ns = 0.0
        if self.dram:
            from hw_model.dram import get_standard

            trp_ns = get_standard(self.dram).trp_ns
        if self.energy is not None:
            self.energy.check_timing(trp_ns, bool(self.dram))

    @property
    def host_read_bandwidth_bytes_per_s(self) -> float:
        """Bandwidth of a host copy reading this DIMM (channel-capped); unbounded without a ``dram`` standard."""
        if not self.dram:
            return math.inf
        from hw_model.dram import get_standard

        return get_standard(self.dram).host_read_bandwidth_bytes_per_s()


def _check_link_energy(section: str, energy: object) -> None:
    if energy is not None and not isinstance(energy, LinkEnergySpec):
        raise HardwareConfigError(f"{section}.energy must be a LinkEnergySpec")


@dataclass(frozen=True)
class HostLinkSpec:
    """The host↔GPU link (PCIe): bandwidth per direction and a fixed cost per transfer."""

    bandwidth_bytes_per_s: float
    latency_s: float
    pageable_bandwidth_bytes_per_s: float | None = None
    energy: LinkEnergySpec | None = None

    def __post_init__(self) -> None:
        _check_link_energy("host_link", self.energy)
        require_positive("host_link.bandwidth_bytes_per_s", self.bandwidth_bytes_per_s)
        require_positive("host_link.latency_s", self.latency_s, allow_zero=True)
        if self.pageable_bandwidth_bytes_per_s is not None:
            require_positive("host_link.pageable_bandwidth_bytes_per_s", self.pageable_bandwidth_bytes_per_s)

    def transfer_time_s(self, num_bytes: float, pinned: bool = True) -> float:
        """``latency + bytes / bandwidth``; pageable host memory uses ``pageable_bandwidth_bytes_per_s``
        (the driver stages it through a pinned buffer) when the preset gives one."""
        if num_bytes <= 0:
            return 0.0
        bandwidth = self.bandwidth_bytes_per_s
        if not pinned and self.pageable_bandwidth_bytes_per_s is not None:
            bandwidth = self.pageable_bandwidth_bytes_per_s
        return self.latency_s + num_bytes / bandwidth


@dataclass(frozen=True)
class NdpLinkSpec:
    """The link between NDP units (DIMM-link), used to reduce tensor-parallel partial sums."""

    bandwidth_bytes_per_s: float
    latency_s: float
    energy: LinkEnergySpec | None = None

    def __post_init__(self) -> None:
        _check_link_energy("ndp_link", self.energy)
        require_positive("ndp_link.bandwidth_bytes_per_s", self.bandwidth_bytes_per_s)
        require_positive("ndp_link.latency_s", self.latency_s, allow_zero=True)

    def transfer_time_s(self, num_bytes: float) -> float:
        return 0.0 if num_bytes <= 0 else self.latency_s + num_bytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class SystemSpec:
    """A whole system: one GPU, its host link, ``num_ndp_units`` identical NDP units and their link."""

    name: str
    gpu: GpuSpec
    host_link: HostLinkSpec
    ndp_unit: NdpUnitSpec
    num_ndp_units: int
    ndp_link: NdpLinkSpec
    description: str = ""
    supported_ndp_units: tuple[int, ...] = ()
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for where, text in (("name", self.name), ("description", self.description)):
            if not isinstance(text, str):
                raise HardwareConfigError(f"{where} must be a string, got {type(text).__name__}")
        if len(self.name) > MAX_NAME_CHARS:
            raise HardwareConfigError(f"name is {len(self.name):,} characters long {limit_note('MAX_NAME_CHARS')}")
        if len(self.description) > MAX_DESCRIPTION_CHARS:
            raise HardwareConfigError(
                f"description is {len(self.description):,} characters long {limit_note('MAX_DESCRIPTION_CHARS')}"
            )
        _require_unit_count("num_ndp_units", self.num_ndp_units, 0)
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))
        object.__setattr__(self, "supported_ndp_units", tuple(self.supported_ndp_units))
        for count in self.supported_ndp_units:  # the counts ``ndp-ep bench`` runs by default: each needs a unit
            _require_unit_count("supported_ndp_units: every count", count, 1)

    def with_ndp_units(self, count: int) -> SystemSpec:
        """The same system with ``count`` NDP units."""
        return replace(self, num_ndp_units=count)

    def to_dict(self) -> dict[str, Any]:
        def section(spec: Any) -> dict[str, Any]:
            out = {}
            for f in fields(spec):
                if f.name.startswith("_"):
                    continue
                value = getattr(spec, f.name)
                if f.name == "energy":
                    out[f.name] = energy_to_dict(value)
                    continue
                out[f.name] = dict(value) if isinstance(value, Mapping) else value
            return out

        return {
            "name": self.name,
            "description": self.description,
            "num_ndp_units": self.num_ndp_units,
            "gpu": section(self.gpu),
            "host_link": section(self.host_link),
            "ndp_unit": section(self.ndp_unit),
            "ndp_link": section(self.ndp_link),
        }


def list_presets() -> list[str]:
    """Names of the bundled hardware presets."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def _section_fields(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A TOML section's required and optional field names: its dataclass's fields without, then with, a default."""
    required = tuple(f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING)
    return required, tuple(f.name for f in fields(cls) if f.name not in required)


# The cost form's constants beyond the roofline (every preset sets them; a user file may omit them).
COMPUTE_OPTIONAL_FIELDS = tuple(name for name in _section_fields(ComputeSpec)[1] if name != "energy")
# section -> (class, required fields, optional fields)
_SECTIONS: dict[str, tuple[type, tuple[str, ...], tuple[str, ...]]] = {
    key: (cls, *_section_fields(cls))
    for key, cls in (
        ("gpu", GpuSpec),
        ("ndp_unit", NdpUnitSpec),
        ("host_link", HostLinkSpec),
        ("ndp_link", NdpLinkSpec),
    )
}


def _build_section(key: str, table: Any, sources: dict[str, str]) -> Any:
    cls, required, optional = _SECTIONS[key]
    if not isinstance(table, dict):
        raise HardwareConfigError(f"[{key}] must be a table")
    values: dict[str, Any] = {}
    for name, value in table.items():
        if name.endswith("_source"):
            sources[f"{key}.{name[: -len('_source')]}"] = str(value)
            continue
        if name not in required and name not in optional:
            known = ", ".join((*required, *optional))
            raise HardwareConfigError(f"{key}.{name}: unknown field (expected one of: {known})")
        if name == "energy":
            value = energy_from_table(key, value, sources)
        values[name] = value
    if key == "ndp_unit" and "dram" in values:
        _derive_dram_side(values, sources)
    missing = [name for name in required if name not in values]
    if missing:
        raise HardwareConfigError(f"{key}.{missing[0]}: missing field")
    if "peak_flops_per_s" in values:
        flops = values["peak_flops_per_s"]
        if not isinstance(flops, dict):
            raise HardwareConfigError(f"{key}.peak_flops_per_s must be a table of dtype = FLOP/s")
        for dtype, v in list(flops.items()):
            if dtype.endswith("_source"):
                sources[f"{key}.peak_flops_per_s.{dtype[: -len('_source')]}"] = str(v)
                del flops[dtype]
    try:
        return cls(**values)
    except TypeError as exc:  # wrong value types that slipped past the checks above
        raise HardwareConfigError(f"[{key}]: {exc}") from None


DRAM_DERIVED_FIELDS = ("memory_bandwidth_bytes_per_s", "achievable_bandwidth_fraction", "kernel_overhead_s")


def _derive_dram_side(values: dict[str, Any], sources: dict[str, str]) -> None:
    """Fill the NDP unit's bandwidth, streaming efficiency and fixed cost from its DDR standard."""
    from hw_model.dram import get_standard

    standard = get_standard(str(values["dram"]))
    given = [name for name in DRAM_DERIVED_FIELDS if name in values]
    if given:
        raise HardwareConfigError(f"ndp_unit.{given[0]}: derived from ndp_unit.dram = {standard.name!r}; remove it")
    ranks = values.get("ranks", 1)
    if not isinstance(ranks, int) or isinstance(ranks, bool) or not 1 <= ranks <= MAX_RANKS:
        raise HardwareConfigError(f"ndp_unit.ranks must be an integer from 1 to {MAX_RANKS}, got {shown_number(ranks)}")
    control = values.get("control_overhead_s", 0.0)
    require_positive("ndp_unit.control_overhead_s", control, allow_zero=True)
    values["dram"] = standard.name
    values["memory_bandwidth_bytes_per_s"] = ranks * standard.rank_peak_bytes_per_s
    values["achievable_bandwidth_fraction"] = standard.streaming_efficiency("interleaved")
    values["kernel_overhead_s"] = control + standard.first_access_s
    derived = f"derived (hw_model/dram.py) from {standard.source}"
    sources["ndp_unit.memory_bandwidth_bytes_per_s"] = f"{ranks} ranks x data rate x bus width; {derived}"
    sources["ndp_unit.achievable_bandwidth_fraction"] = f"1 - (tRFC + tRP) / tREFI; {derived}"
    sources["ndp_unit.kernel_overhead_s"] = f"control_overhead_s + tRCD + CL + tBL; {derived}"


def system_from_dict(data: Mapping[str, Any], origin: str = "<dict>") -> SystemSpec:
    """Build and validate a :class:`SystemSpec` from parsed TOML; errors name the bad field."""
    data = dict(data)
    sources: dict[str, str] = {}
    for key in _SECTIONS:
        if key not in data:
            raise HardwareConfigError(f"{origin}: missing [{key}] table")
    known = set(_SECTIONS) | {"name", "description", "num_ndp_units", "supported_ndp_units"}
    for key in data:
        if key not in known and not key.endswith("_source"):
            raise HardwareConfigError(f"{origin}: unknown top-level field '{key}'")
    sections = {key: _build_section(key, data[key], sources) for key in _SECTIONS}
    num_units = data.get("num_ndp_units", 0)
    supported = data.get("supported_ndp_units", [])
    if not isinstance(supported, list):
        raise HardwareConfigError(f"supported_ndp_units must be a list of integers, got {shown_number(supported)}")
    return SystemSpec(
        name=str(data.get("name", Path(origin).stem)),
        description=str(data.get("description", "")),
        num_ndp_units=num_units,
        supported_ndp_units=tuple(supported),
        sources=sources,
        **sections,
    )


def hardware_file(text: str) -> Path:
    """The hardware file ``text`` names (not a preset), or :class:`HardwareConfigError` saying why it cannot be
    one: too long a path, a directory, a missing file."""
    shown = text if len(text) <= 200 else text[:197] + "..."
    if len(text.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES or "\0" in text:
        raise HardwareConfigError(
            f"unknown hardware '{shown}': not a preset and not a usable file name {limit_note('MAX_PATH_BYTES')}"
        )
    path = Path(text)
    try:
        if path.is_dir():
            raise HardwareConfigError(f"hardware file {shown}: is a directory, not a TOML file")
        if path.is_file():
            return path
    except OSError as exc:  # a component too long for the file system
        raise HardwareConfigError(f"unknown hardware '{shown}': {exc.strerror or type(exc).__name__}") from None
    raise HardwareConfigError(
        f"unknown hardware '{shown}': not a preset ({', '.join(list_presets())}) and no such file"
    )


def load_system(name_or_path: str | Path, ndp_units: int | None = None) -> SystemSpec:
    """Load a preset by name (``paper``, ``edge``, ``h200``) or a TOML file by path.

    ``ndp_units`` overrides the preset's default NDP-unit count. A file that keeps a preset's ``name`` (an edited
    copy of the preset) but whose GPU, links or NDP unit differ from it is named ``"<name> (<file name>)"``, so
    reports and tables never show the edited design as the preset.
    """
    text_name = str(name_or_path)
    presets = list_presets()
    path = PRESET_DIR / f"{text_name}.toml" if text_name in presets else hardware_file(text_name)
    data = read_toml(
        path, HardwareConfigError, tomllib.loads
    )  # size- and depth-bounded (ndp_io/limits.py), a BOM accepted
    system = system_from_dict(data, origin=str(path))
    if text_name not in presets and system.name in presets:
        preset = load_system(system.name)
        if any(getattr(system, key) != getattr(preset, key) for key in _SECTIONS):
            system = replace(system, name=f"{system.name} ({path.name})")
    if ndp_units is not None:
        system = system.with_ndp_units(ndp_units)
    return system
