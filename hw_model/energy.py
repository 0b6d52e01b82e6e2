"""Energy of a simulated run, beside the cost model: joules per resource from the work the timeline did and the time
it took, with the constants of each resource's ``[... .energy]`` preset table (:mod:`hw_model.energy_spec`).

    resource     dynamic (per unit of work)                         static (per second of the run)
    gpu          pJ/FLOP[dtype] x FLOPs                             static_w x elapsed (idle time included)
    gpu_memory   pJ/byte x bytes its kernels and copies move        -
    ndp_core     pJ/FLOP[dtype] x FLOPs                             core_static_w x elapsed x units (NDP policies)
    ndp_dram     IDD method below, per ACT/PRE/RD/WR/REF and I/O    background: active standby while streaming,
                                                                    power-down (or standby) otherwise, refresh
    pcie         pJ/byte x bytes both ways                          static_w x elapsed
    ndp_link     pJ/byte x bytes                                    static_w x elapsed
    host         host_copy_pj_per_byte x bytes copied from DIMMs    -

DRAM, the way Micron's DDR4 power note (TN-40-07) and DRAMPower compute it from datasheet currents, per command
(``n`` devices answer it; each term has its VPP twin with the ``IPP`` currents)::

    ACT      n VDD (IDD0 - IDD3N) tRAS           PRE      n VDD (IDD0 - IDD2N) tRP
    RD / WR  n VDD (IDD4R/W - IDD3N) tBURST      REF      n VDD (IDD5B - IDD3N) tRFC
    background  n VDD IDD3N while a bank is open or refreshing, IDD2N precharged, IDD2P powered down

(ACT + PRE is Micron's row cycle ``IDD0 tRC - IDD3N tRAS - IDD2N tRP``; DRAMPower splits it this way.) The run's
commands come from the bytes and row behaviour :mod:`hw_model.dram` has the timing side use: streams interleaved
over the bank groups read whole rows, so one ACT/PRE per ``devices x page_bytes`` bytes and one RD per burst
(``bus width / sub-channels x BL`` bytes); a rank streams at its achievable bandwidth and is active for that time;
every rank refreshes once per tREFI for the whole run. I/O (DQ driver and termination) is ``io_pj_per_bit`` per
bit, which DRAMPower leaves out. A policy that uses no NDP unit has plain DIMMs: the same DRAM, no core power.

``tests/hw_model/test_energy.py`` checks the DRAM part against a hand computation of the Micron formula, and
``ndp-ep validate`` against DRAMPower's own figures (``calibration/dram_energy``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from hw_model.dram import DdrStandard, get_standard
from hw_model.energy_spec import NdpEnergySpec, per_flop_pj
from hw_model.hardware import NdpUnitSpec, SystemSpec

PJ = 1e-12
NS = 1e-9
# what one invocation's (or a run's) work vector holds, in this order (hw_model.timeline.LayerTimeline.work)
WORK_FIELDS = ("gpu_flops", "gpu_memory_bytes", "ndp_flops", "ndp_dram_bytes", "copy_dram_bytes", "ndp_link_bytes")
GPU_FLOPS, GPU_BYTES, NDP_FLOPS, NDP_DRAM_BYTES, COPY_DRAM_BYTES, LINK_BYTES = range(len(WORK_FIELDS))
RESOURCES = ("gpu", "gpu_memory", "ndp_core", "ndp_dram", "pcie", "ndp_link", "host")
DRAM_TERMS = ("act", "pre", "read", "write", "refresh", "background", "io")


@dataclass(frozen=True)
class DramTiming:
    """The timings the energy of DRAM commands needs, in ns."""

    tras_ns: float
    trp_ns: float
    tburst_ns: float
    trfc_ns: float
    trefi_ns: float

    @classmethod
    def of(cls, standard: DdrStandard, spec: NdpEnergySpec) -> DramTiming:
        """A standard's timings with the energy table's tRAS (JEDEC gives it per speed bin beside the currents)."""
        return cls(spec.tras_ns, standard.trp_ns, standard.tbl_ns, standard.trfc_ns, standard.trefi_ns)


@dataclass(frozen=True)
class CommandCounts:
    """Commands issued to one group of ``devices`` (summed over groups if several), and the time (seconds, summed
    likewise) spent active (a bank open, or refreshing), precharged in standby, and precharged in power-down."""

    acts: float = 0.0
    pres: float = 0.0
    reads: float = 0.0
    writes: float = 0.0
    refreshes: float = 0.0
    active_s: float = 0.0
    precharged_s: float = 0.0
    power_down_s: float = 0.0


def command_energy_j(spec: NdpEnergySpec, timing: DramTiming, counts: CommandCounts) -> dict[str, float]:
    """Joules of ``counts`` by the Micron/DRAMPower current method (the module docstring), per term: ``act``,
    ``pre``, ``read``, ``write``, ``refresh``, ``background`` (active + standby + power-down)."""
    n, vdd, vpp = spec.devices, spec.vdd_v, spec.vpp_v

    def above(idd: float, idd_base: float, ipp: float, ipp_base: float) -> float:  # watts above a base state
        return n * (vdd * (idd - idd_base) + vpp * (ipp - ipp_base))

    act = above(spec.idd0_a, spec.idd3n_a, spec.ipp0_a, spec.ipp3n_a) * timing.tras_ns * NS
    pre = above(spec.idd0_a, spec.idd2n_a, spec.ipp0_a, spec.ipp2n_a) * timing.trp_ns * NS
    read = above(spec.idd4r_a, spec.idd3n_a, spec.ipp4r_a, spec.ipp3n_a) * timing.tburst_ns * NS
    write = above(spec.idd4w_a, spec.idd3n_a, spec.ipp4w_a, spec.ipp3n_a) * timing.tburst_ns * NS
    refresh = above(spec.idd5b_a, spec.idd3n_a, spec.ipp5b_a, spec.ipp3n_a) * timing.trfc_ns * NS
    active_w = above(spec.idd3n_a, 0.0, spec.ipp3n_a, 0.0)
    standby_w = above(spec.idd2n_a, 0.0, spec.ipp2n_a, 0.0)
    power_down_w = above(spec.idd2p_a, 0.0, spec.ipp2p_a, 0.0)
    background = active_w * counts.active_s + standby_w * counts.precharged_s + power_down_w * counts.power_down_s
    return {
        "act": counts.acts * act,
        "pre": counts.pres * pre,
        "read": counts.reads * read,
        "write": counts.writes * write,
        "refresh": counts.refreshes * refresh,
        "background": background,
    }


def burst_bytes(standard: DdrStandard, spec: NdpEnergySpec) -> float:
    """Bytes one RD or WR moves: a sub-channel's data lanes x the burst length (DDR4: 64 x BL8, DDR5: 32 x BL16)."""
    burst_length = round(standard.tbl_ns * standard.data_rate_mtps / 1000.0)
    return standard.bus_width_bits / spec.subchannels / 8.0 * burst_length


def stream_counts(
    unit: NdpUnitSpec, dimms: int, read_bytes: float, write_bytes: float, elapsed_s: float
) -> tuple[CommandCounts, DramTiming]:
    """The commands and states of ``dimms`` DIMMs of ``unit`` over a run of ``elapsed_s`` in which their NDP cores
    and copies streamed ``read_bytes`` and wrote ``write_bytes`` (whole rows, bank groups interleaved)."""
    spec = unit.energy
    assert isinstance(spec, NdpEnergySpec)
    standard = get_standard(unit.dram)
    timing = DramTiming.of(standard, spec)
    groups = dimms * unit.ranks * spec.subchannels  # command groups of ``spec.devices`` devices
    moved = read_bytes + write_bytes
    acts = moved / (spec.devices * spec.page_bytes)
    burst = burst_bytes(standard, spec)
    refreshes = groups * elapsed_s / (timing.trefi_ns * NS)
    # each DIMM's groups all stream while it does; its streaming time is its bytes at its achievable bandwidth
    streaming_s = moved / unit.achievable_bandwidth_bytes_per_s * unit.ranks * spec.subchannels
    total_s = groups * elapsed_s
    active_s = min(total_s, streaming_s + refreshes * timing.trfc_ns * NS)
    idle_s = total_s - active_s
    counts = CommandCounts(
        acts=acts,
        pres=acts,
        reads=read_bytes / burst,
        writes=write_bytes / burst,
        refreshes=refreshes,
        active_s=active_s,
        precharged_s=idle_s if spec.idle == "standby" else 0.0,
        power_down_s=idle_s if spec.idle == "power-down" else 0.0,
    )
    return counts, timing


def dram_energy_j(
    unit: NdpUnitSpec, dimms: int, read_bytes: float, write_bytes: float, elapsed_s: float
) -> dict[str, float]:
    """Joules of ``dimms`` DIMMs of ``unit`` over a run, per :data:`DRAM_TERMS`."""
    spec = unit.energy
    assert isinstance(spec, NdpEnergySpec)
    bits = 8.0 * (read_bytes + write_bytes)
    if not spec.uses_currents:  # flat figures (no JEDEC standard)
        terms = dict.fromkeys(DRAM_TERMS, 0.0)
        terms["read"] = bits * spec.dram_pj_per_bit * PJ
        terms["background"] = dimms * spec.dram_background_w * elapsed_s
        return terms
    counts, timing = stream_counts(unit, dimms, read_bytes, write_bytes, elapsed_s)
    terms = command_energy_j(spec, timing, counts)
    terms["io"] = bits * spec.io_pj_per_bit * PJ
    return terms


@dataclass(frozen=True)
class EnergyReport:
    """A run's energy: joules per resource (:data:`RESOURCES`), the part of each that is static power (idle time
    included), the GPU's and NDP cores' idle share, and the DRAM's terms; ``elapsed_s`` the time it spans."""

    elapsed_s: float
    by_resource_j: Mapping[str, float]
    static_j: Mapping[str, float]
    idle_j: Mapping[str, float]
    dram_j: Mapping[str, float]
    work: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("by_resource_j", "static_j", "idle_j", "dram_j", "work"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    @property
    def total_j(self) -> float:
        return sum(self.by_resource_j.values())

    @property
    def avg_power_w(self) -> float:
        return self.total_j / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def dominant(self) -> str:
        """The resource that takes the most energy."""
        return max(self.by_resource_j, key=self.by_resource_j.__getitem__)

    def to_json(self) -> dict[str, Any]:
        return {
            "energy_j": self.total_j,
            "avg_power_w": self.avg_power_w,
            "elapsed_s": self.elapsed_s,
            "by_resource_j": dict(self.by_resource_j),
            "static_j": dict(self.static_j),
            "idle_j": dict(self.idle_j),
            "dram_j": dict(self.dram_j),
            "dominant": self.dominant,
        }


def has_energy(system: SystemSpec) -> bool:
    """Whether every resource of ``system`` has its energy table."""
    return all(spec.energy is not None for spec in (system.gpu, system.ndp_unit, system.host_link, system.ndp_link))


def run_energy(
    system: SystemSpec,
    work: Sequence[float],
    *,
    pcie_bytes: float,
    elapsed_s: float,
    busy_s: Mapping[str, float],
    dtype: str,
    uses_ndp: bool,
    extra_gpu_busy_s: float = 0.0,
) -> EnergyReport | None:
    """The energy of a run (or one invocation) that did ``work`` (per :data:`WORK_FIELDS`), moved ``pcie_bytes``
    over PCIe and spanned ``elapsed_s``; ``busy_s`` per resource (for the idle shares); ``uses_ndp``: the policy
    runs work on the NDP cores (else the DIMMs are plain ones and the cores draw nothing);
    ``extra_gpu_busy_s``: GPU time outside the experts (attention, norms), priced as memory-bound (its bytes at the
    GPU's achievable bandwidth). ``None`` when the system lacks an energy table."""
    if not has_energy(system):
        return None
    gpu, unit, host, link = system.gpu, system.ndp_unit, system.host_link, system.ndp_link
    g, n, h, k = gpu.energy, unit.energy, host.energy, link.energy
    assert g is not None and isinstance(n, NdpEnergySpec) and h is not None and k is not None
    units = system.num_ndp_units
    dimms = max(units, 1)  # a GPU-only system keeps its experts on (at least one) plain DIMM of the same DRAM
    extra_bytes = extra_gpu_busy_s * gpu.achievable_bandwidth_bytes_per_s
    dram = dram_energy_j(unit, dimms, work[NDP_DRAM_BYTES] + work[COPY_DRAM_BYTES], 0.0, elapsed_s)
    dram_static = dram["background"] + dram["refresh"]
    core_units = units if uses_ndp else 0
    static = {
        "gpu": g.static_w * elapsed_s,
        "ndp_core": n.core_static_w * core_units * elapsed_s,
        "ndp_dram": dram_static,
        "pcie": h.static_w * elapsed_s,
        "ndp_link": k.static_w * elapsed_s if core_units > 1 else 0.0,
    }
    by_resource = {
        "gpu": static["gpu"] + work[GPU_FLOPS] * per_flop_pj(g.pj_per_flop, dtype) * PJ,
        "gpu_memory": (work[GPU_BYTES] + extra_bytes) * g.memory_pj_per_byte * PJ,
        "ndp_core": static["ndp_core"] + work[NDP_FLOPS] * per_flop_pj(n.core_pj_per_flop, dtype) * PJ,
        "ndp_dram": sum(dram.values()),
        "pcie": static["pcie"] + pcie_bytes * h.pj_per_byte * PJ,
        "ndp_link": static["ndp_link"] + work[LINK_BYTES] * k.pj_per_byte * PJ,
        "host": work[COPY_DRAM_BYTES] * h.host_copy_pj_per_byte * PJ,
    }
    gpu_busy = busy_s.get("gpu", 0.0) + extra_gpu_busy_s
    ndp_busy = sum(s for r, s in busy_s.items() if r.startswith("ndp") and r != "ndp_link")
    idle = {
        "gpu": g.static_w * max(0.0, elapsed_s - gpu_busy),
        "ndp_core": n.core_static_w * max(0.0, core_units * elapsed_s - ndp_busy) if core_units else 0.0,
        "pcie": h.static_w * max(0.0, elapsed_s - busy_s.get("pcie", 0.0)),
    }
    named_work = dict(zip(WORK_FIELDS, work, strict=True))
    named_work["pcie_bytes"] = pcie_bytes
    return EnergyReport(elapsed_s, by_resource, static, idle, dram, named_work)


def resource_power_w(system: SystemSpec, resource: str, *, busy: bool, uses_ndp: bool = True) -> float:
    """A rough power level of one timeline resource for trace counters: its static power, plus, while ``busy``, what
    streaming at its achievable bandwidth draws (GPU: device memory at full bandwidth; an NDP unit: its DRAM reads at
    its bandwidth and its core at its FLOP/s for bf16; PCIe / the DIMM-link: their bandwidth x pJ/byte)."""
    if not has_energy(system):
        return 0.0
    g, n = system.gpu.energy, system.ndp_unit.energy
    h, k = system.host_link.energy, system.ndp_link.energy
    assert g is not None and isinstance(n, NdpEnergySpec) and h is not None and k is not None
    if resource == "gpu":
        dynamic = system.gpu.achievable_bandwidth_bytes_per_s * g.memory_pj_per_byte * PJ
        return g.static_w + (dynamic if busy else 0.0)
    if resource in ("pcie", "pcie_d2h"):
        static = h.static_w / 2  # one direction each
        return static + (system.host_link.bandwidth_bytes_per_s * h.pj_per_byte * PJ if busy else 0.0)
    if resource == "ndp_link":
        return k.static_w + (system.ndp_link.bandwidth_bytes_per_s * k.pj_per_byte * PJ if busy else 0.0)
    unit = system.ndp_unit
    seconds = 1.0
    bandwidth = unit.achievable_bandwidth_bytes_per_s
    dram = dram_energy_j(unit, 1, bandwidth * seconds if busy else 0.0, 0.0, seconds)
    core = n.core_static_w if uses_ndp else 0.0
    if busy:
        core += unit.achievable_flops_per_s("bf16") * per_flop_pj(n.core_pj_per_flop, "bf16") * PJ
    return sum(dram.values()) + core
