"""DRAM side of an NDP-DIMM, derived from JEDEC timing facts (no per-row fits).

One table, :data:`DDR_STANDARDS`, holds each speed grade's datasheet timings (data rate, bus width, CAS
latency CL, tRCD, tRP, burst length on the bus, tCCD_S/L, tRFC and tREFI). Everything the simulator needs is
derived from it:

- streaming efficiency of a bank-group-interleaved layout: all-bank refresh blocks the rank for tRFC once
  every tREFI and the open rows must be precharged (tRP) before it, so ``eta = 1 - (tRFC + tRP) / tREFI``;
- a row-sequential layout is further limited by back-to-back reads in one bank group: ``tBL / tCCD_L``;
- the fixed cost of a stream (first data out): ``t0 = tRCD + CL + tBL``;
- peak bandwidth of a rank (one 64-bit channel's worth of data lanes) = data rate x bus width;
- a host copy reading a DIMM is capped at ``eta`` x the channel peak and takes that bandwidth from the NDP
  core streaming the same ranks (DRAM time is conserved: ``B_ndp = eta * P - B_host``).

``tests/hw_model/test_dram.py`` and ``ndp-ep validate --data`` compare these predictions with the Ramulator2
runs in the package's ``calibration/ndp_dram`` CSVs (DDR4-3200 with 16 Gb and 8 Gb chips, DDR5-4800).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from hw_model.errors import HardwareConfigError

LAYOUTS = ("interleaved", "row-sequential")


@dataclass(frozen=True)
class DdrStandard:
    """One DDR speed grade: JEDEC timings in nanoseconds, the data rate and one rank's data-bus width."""

    name: str
    data_rate_mtps: float
    bus_width_bits: int
    cl_ns: float
    trcd_ns: float
    trp_ns: float
    tbl_ns: float
    tccd_s_ns: float
    tccd_l_ns: float
    trfc_ns: float
    trefi_ns: float
    source: str

    def __post_init__(self) -> None:
        for name in ("data_rate_mtps", "cl_ns", "trcd_ns", "trp_ns", "tbl_ns", "tccd_s_ns", "tccd_l_ns"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise HardwareConfigError(f"DdrStandard {self.name}: {name} must be positive, got {value!r}")
        if not 0 < self.trfc_ns < self.trefi_ns:
            raise HardwareConfigError(f"DdrStandard {self.name}: need 0 < tRFC < tREFI")
        if self.bus_width_bits <= 0 or self.bus_width_bits % 8:
            raise HardwareConfigError(f"DdrStandard {self.name}: bus width must be a positive multiple of 8")

    @property
    def rank_peak_bytes_per_s(self) -> float:
        """Peak of one rank's data lanes (decimal): data rate x bus width."""
        return self.data_rate_mtps * 1e6 * self.bus_width_bits / 8

    @property
    def refresh_fraction(self) -> float:
        """Fraction of time all-bank refresh (and the precharge before it) blocks the rank."""
        return (self.trfc_ns + self.trp_ns) / self.trefi_ns

    def streaming_efficiency(self, layout: str = "interleaved", refresh: bool = True) -> float:
        """Sustained fraction of peak for a long sequential read stream in ``layout``."""
        if layout not in LAYOUTS:
            raise HardwareConfigError(f"unknown DRAM layout {layout!r} (known: {', '.join(LAYOUTS)})")
        eta = 1.0 - self.refresh_fraction if refresh else 1.0
        if layout == "row-sequential":
            eta *= min(1.0, self.tbl_ns / self.tccd_l_ns)
        return eta

    @property
    def first_access_s(self) -> float:
        """Fixed cost of a stream: activate, CAS latency, one burst (tRCD + CL + tBL)."""
        return (self.trcd_ns + self.cl_ns + self.tbl_ns) * 1e-9

    def stream_time_s(
        self, num_bytes: float, ranks: int = 1, layout: str = "interleaved", refresh: bool = True
    ) -> float:
        """Time to stream ``num_bytes`` from ``ranks`` ranks read in parallel (each with its own data path)."""
        peak = ranks * self.rank_peak_bytes_per_s
        return self.first_access_s + num_bytes / (peak * self.streaming_efficiency(layout, refresh))

    def host_read_bandwidth_bytes_per_s(self, layout: str = "interleaved") -> float:
        """What a host copy reading one DIMM reaches: the channel (one rank's lanes) at the streaming efficiency."""
        return self.rank_peak_bytes_per_s * self.streaming_efficiency(layout)


def _nck(n: float, tck_ns: float) -> float:
    return n * tck_ns


def _grade(
    name: str,
    rate: float,
    cl: int,
    rcd: int,
    rp: int,
    bl_nck: int,
    ccd_l_ns: float,
    trfc: float,
    trefi: float,
    source: str,
) -> DdrStandard:
    tck = 2000.0 / rate  # ns; two transfers per clock
    ccd_l = max(ccd_l_ns, _nck(bl_nck, tck))
    return DdrStandard(
        name=name,
        data_rate_mtps=rate,
        bus_width_bits=64,
        cl_ns=_nck(cl, tck),
        trcd_ns=_nck(rcd, tck),
        trp_ns=_nck(rp, tck),
        tbl_ns=_nck(bl_nck, tck),
        tccd_s_ns=_nck(bl_nck, tck),
        tccd_l_ns=ccd_l,
        trfc_ns=trfc,
        trefi_ns=trefi,
        source=source,
    )


_DDR4 = "JEDEC JESD79-4C: DDR4-3200AA speed bin (CL-tRCD-tRP 22-22-22), BL8, tCCD_L 5 ns, tREFI 7.8 us"
_DDR5 = "JEDEC JESD79-5: DDR5 speed bin {bin}, BL16 on two 32-bit sub-channels, tCCD_L max(8 nCK, 5 ns), tREFI 3.9 us"
DDR_STANDARDS: Mapping[str, DdrStandard] = MappingProxyType(
    {
        s.name: s
        for s in (
            _grade("DDR4-3200", 3200, 22, 22, 22, 4, 5.0, 550.0, 7800.0, _DDR4 + ", 16 Gb tRFC 550 ns"),
            _grade("DDR4-3200-8Gb", 3200, 22, 22, 22, 4, 5.0, 350.0, 7800.0, _DDR4 + ", 8 Gb tRFC 350 ns"),
            _grade(
                "DDR5-4800",
                4800,
                34,
                34,
                34,
                8,
                5.0,
                295.0,
                3906.0,
                _DDR5.format(bin="4800A (34-34-34)") + ", 16 Gb tRFC 295 ns",
            ),
            _grade(
                "DDR5-5600",
                5600,
                46,
                46,
                46,
                8,
                5.0,
                295.0,
                3906.0,
                _DDR5.format(bin="5600B (46-46-46)") + ", 16 Gb tRFC 295 ns",
            ),
            _grade(
                "DDR5-6400",
                6400,
                52,
                52,
                52,
                8,
                5.0,
                295.0,
                3906.0,
                _DDR5.format(bin="6400B (52-52-52)") + ", 16 Gb tRFC 295 ns",
            ),
        )
    }
)


def get_standard(name: str) -> DdrStandard:
    """The DDR speed grade ``name`` (case-insensitive: ``ddr4-3200`` works)."""
    for key, standard in DDR_STANDARDS.items():
        if key.lower() == str(name).lower():
            return standard
    raise HardwareConfigError(f"unknown DRAM standard {name!r} (known: {', '.join(DDR_STANDARDS)})")
