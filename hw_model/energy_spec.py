"""Energy constants of each resource, as the hardware presets give them (``[gpu.energy]``, ``[ndp_unit.energy]``,
``[host_link.energy]``, ``[ndp_link.energy]``), each a frozen dataclass validated in ``__post_init__``.

The model that uses them is :mod:`hw_model.energy`. Units are in the field names: ``_pj_per_flop``,
``_pj_per_byte``, ``_pj_per_bit``, ``_w``, ``_a`` (amperes), ``_v`` (volts), ``_ns``. In a preset every number has
a sibling ``<field>_source`` string (the paper or datasheet it is from, or "assumption: ..."); a user file may omit
the sources, or a whole ``[... .energy]`` table (the run then reports no energy).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from types import MappingProxyType
from typing import Any

from hw_model.errors import HardwareConfigError
from hw_model.spec_numbers import require_per_dtype, require_positive, shown_number

ENERGY_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8")
IDLE_STATES = ("power-down", "standby")
# A rank has at most a few dozen DRAM devices, a DIMM 1-4 subchannels, a DRAM row a few KiB: wide enough for any
# real part, narrow enough that every energy product stays a normal float.
_INTEGER_LIMITS = {"devices": 64, "subchannels": 16, "page_bytes": 1 << 20}


def per_flop_pj(table: Mapping[str, float], dtype: str) -> float:
    """pJ per FLOP of ``dtype``; a dtype the table does not list costs the most expensive listed one."""
    if dtype in table:
        return table[dtype]
    return max(table.values())


@dataclass(frozen=True)
class GpuEnergySpec:
    """The GPU: tensor-core energy per FLOP per dtype, energy per byte of its device memory (DRAM core and I/O),
    and the power it draws whatever it does (``static_w``: a card holding a model with its clocks up)."""

    pj_per_flop: Mapping[str, float]
    memory_pj_per_byte: float
    static_w: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "pj_per_flop", MappingProxyType(dict(self.pj_per_flop)))
        require_per_dtype("gpu.energy.pj_per_flop", self.pj_per_flop, ENERGY_DTYPES, "pJ/FLOP")
        require_positive("gpu.energy.memory_pj_per_byte", self.memory_pj_per_byte, allow_zero=True)
        require_positive("gpu.energy.static_w", self.static_w, allow_zero=True)


@dataclass(frozen=True)
class LinkEnergySpec:
    """A link (PCIe, the DIMM-link): energy per byte moved (both ends' PHYs and controllers) and its idle power.
    ``host_copy_pj_per_byte`` (PCIe only): what a host-side copy adds per byte beyond the DRAM read and the link
    (the host memory controller, the channel beyond the DIMM, the DMA engine)."""

    pj_per_byte: float
    static_w: float
    host_copy_pj_per_byte: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            require_positive(f"energy.{f.name}", getattr(self, f.name), allow_zero=True)


@dataclass(frozen=True)
class NdpEnergySpec:
    """One NDP unit: its core (dynamic pJ/FLOP per dtype, static W) and its DRAM.

    The DRAM is costed one of two ways. With the unit's ``dram`` standard (JEDEC timings, :mod:`hw_model.dram`),
    from datasheet currents of one device the way Micron's DDR4 power note (TN-40-07) and DRAMPower do: ``vdd_v``,
    ``idd0_a`` (one ACT-PRE row cycle every tRC), ``idd2n_a`` / ``idd2p_a`` (precharged standby / power-down),
    ``idd3n_a`` (active standby), ``idd4r_a`` / ``idd4w_a`` (read / write bursts), ``idd5b_a`` (refresh), the
    same on VPP (``ipp*``, 0 where the datasheet gives none); ``devices`` x8 devices answer one command (a 64-bit
    DDR4 rank: 8; a 32-bit DDR5 sub-channel: 4), ``subchannels`` per rank (DDR5: 2), ``page_bytes`` per device
    per ACT, ``tras_ns``; ``io_pj_per_bit`` the DQ driver and termination energy per bit crossing the DRAM's pins
    (DRAMPower leaves it out). ``idle`` is the state of a rank with nothing to stream: ``power-down`` (IDD2P) or
    ``standby`` (IDD2N). Without a ``dram`` standard, flat figures: ``dram_pj_per_bit`` (everything per bit
    read) and ``dram_background_w`` (per unit).
    """

    core_pj_per_flop: Mapping[str, float]
    core_static_w: float
    io_pj_per_bit: float = 0.0
    vdd_v: float = 0.0
    idd0_a: float = 0.0
    idd2n_a: float = 0.0
    idd2p_a: float = 0.0
    idd3n_a: float = 0.0
    idd4r_a: float = 0.0
    idd4w_a: float = 0.0
    idd5b_a: float = 0.0
    vpp_v: float = 0.0
    ipp0_a: float = 0.0
    ipp2n_a: float = 0.0
    ipp2p_a: float = 0.0
    ipp3n_a: float = 0.0
    ipp4r_a: float = 0.0
    ipp4w_a: float = 0.0
    ipp5b_a: float = 0.0
    devices: int = 8
    subchannels: int = 1
    page_bytes: int = 1024
    tras_ns: float = 0.0
    idle: str = "power-down"
    dram_pj_per_bit: float = 0.0
    dram_background_w: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "core_pj_per_flop", MappingProxyType(dict(self.core_pj_per_flop)))
        require_per_dtype("ndp_unit.energy.core_pj_per_flop", self.core_pj_per_flop, ENERGY_DTYPES, "pJ/FLOP")
        for f in fields(self):
            if f.name in ("core_pj_per_flop", "idle", "devices", "subchannels", "page_bytes"):
                continue
            require_positive(f"ndp_unit.energy.{f.name}", getattr(self, f.name), allow_zero=True)
        for name, most in _INTEGER_LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                shown = shown_number(value)
                raise HardwareConfigError(f"ndp_unit.energy.{name} must be an integer from 1 to {most:,}, got {shown}")
        if self.idle not in IDLE_STATES:
            known = ", ".join(IDLE_STATES)
            raise HardwareConfigError(f"ndp_unit.energy.idle must be one of {known}, got {self.idle!r}")
        if self.uses_currents:
            order = (
                ("idd2p_a", "idd2n_a"),
                ("idd2n_a", "idd3n_a"),
                ("idd3n_a", "idd4r_a"),
                ("idd3n_a", "idd4w_a"),
                ("idd3n_a", "idd5b_a"),
            )
            for low, high in order:
                if getattr(self, low) > getattr(self, high):
                    raise HardwareConfigError(f"ndp_unit.energy: {low} must not exceed {high} (JEDEC IDD ordering)")
            if self.vdd_v <= 0 or self.tras_ns <= 0:
                raise HardwareConfigError("ndp_unit.energy: IDD currents need vdd_v and tras_ns > 0")

    @property
    def uses_currents(self) -> bool:
        """Whether the DRAM is costed from IDD currents (else from the flat figures)."""
        return self.idd0_a > 0 or self.idd3n_a > 0

    def check_timing(self, trp_ns: float, has_standard: bool) -> None:
        """With IDD currents the unit needs a ``dram`` standard, and one row cycle must cost energy:
        ``IDD0 tRC >= IDD3N tRAS + IDD2N tRP`` (``trp_ns`` from the standard); without, the flat figures."""
        if not self.uses_currents:
            if has_standard:
                raise HardwareConfigError("ndp_unit.energy: a unit with a dram standard needs its IDD currents")
            return
        if not has_standard:
            raise HardwareConfigError("ndp_unit.energy: IDD currents need ndp_unit.dram (a DDR standard)")
        row_cycle = self.idd0_a * (self.tras_ns + trp_ns) - self.idd3n_a * self.tras_ns - self.idd2n_a * trp_ns
        if row_cycle < 0:
            raise HardwareConfigError(
                "ndp_unit.energy: IDD0 x tRC < IDD3N x tRAS + IDD2N x tRP, so an ACT-PRE would return energy"
            )


_CLASSES: dict[str, type] = {
    "gpu": GpuEnergySpec,
    "ndp_unit": NdpEnergySpec,
    "host_link": LinkEnergySpec,
    "ndp_link": LinkEnergySpec,
}
_PER_DTYPE = {"pj_per_flop", "core_pj_per_flop"}


def energy_from_table(section: str, table: Any, sources: dict[str, str]) -> Any:
    """The ``[<section>.energy]`` table as its spec; ``*_source`` strings go to ``sources``."""
    cls = _CLASSES[section]
    where = f"{section}.energy"
    if not isinstance(table, dict):
        raise HardwareConfigError(f"[{where}] must be a table")
    known = {f.name for f in fields(cls)}
    required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    values: dict[str, Any] = {}
    for name, value in table.items():
        if name.endswith("_source"):
            sources[f"{where}.{name[: -len('_source')]}"] = str(value)
            continue
        if name not in known:
            raise HardwareConfigError(f"{where}.{name}: unknown field (expected one of: {', '.join(sorted(known))})")
        if name in _PER_DTYPE:
            if not isinstance(value, dict):
                raise HardwareConfigError(f"{where}.{name} must be a table of dtype = pJ/FLOP")
            value = dict(value)
            for key in [k for k in value if k.endswith("_source")]:
                sources[f"{where}.{name}.{key[: -len('_source')]}"] = str(value.pop(key))
        values[name] = value
    missing = [name for name in required if name not in values]
    if missing:
        raise HardwareConfigError(f"{where}.{missing[0]}: missing field")
    try:
        return cls(**values)
    except TypeError as exc:
        raise HardwareConfigError(f"[{where}]: {exc}") from None


def energy_to_dict(spec: Any) -> dict[str, Any] | None:
    """A spec as plain values (``None`` stays ``None``)."""
    if spec is None:
        return None
    out: dict[str, Any] = {}
    for f in fields(spec):
        value = getattr(spec, f.name)
        out[f.name] = dict(value) if isinstance(value, Mapping) else value
    return out
