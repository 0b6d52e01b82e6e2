"""The DRAM energy model (:mod:`hw_model.energy`) against DRAMPower's figures for well-defined command streams
(``calibration/dram_energy/streams.csv``, the memspecs beside it; see its README).

Two checks per row, each on the row's own memspec (its currents and timings, read from the JSON):

- ``dram_energy``: the current method with DRAMPower's own command counts and state times (ACT, PRE, RD, WR, REF
  counts; cycles with a bank open, cycles precharged): a check of the formula;
- ``dram_energy/from bytes`` (sequential streams and the idle and refresh-only rows): the commands derived the way
  the simulator derives them from bytes (one ACT/PRE per row of ``devices x page`` bytes, one RD per burst, one
  REF per tREFI when the stream refreshes, a bank open while it streams): a check of the derivation.

Core energy only, as DRAMPower reports it (no I/O). The DDR5 memspec's currents were constructed (its IDD0 is below
its IDD3N, so an ACT "returns" energy in both models): the DDR5 rows check the method, not the device.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hw_model.energy import CommandCounts, DramTiming, command_energy_j
from hw_model.energy_spec import NdpEnergySpec
from hw_model.errors import CalibrationDataError, HwModelError

DRAM_ENERGY_COLUMNS = (
    "standard",
    "memspec",
    "stream",
    "duration_ns",
    "n_act",
    "n_pre",
    "n_rd",
    "n_wr",
    "n_ref",
    "bytes_read",
    "E_total_pJ",
    "rank_act_cycles",
    "rank_pre_cycles",
)
# streams whose commands follow from their bytes as the simulator's do: (refreshes, banks open while streaming)
_FROM_BYTES = {"a_idle": False, "c_seq_read": False, "d_seq_read": False, "f_refresh": True, "g_seq_read": True}


def memspec_energy(path: Path) -> tuple[NdpEnergySpec, DramTiming, Mapping[str, Any]]:
    """A DRAMPower JSON memspec's currents (as an :class:`NdpEnergySpec` of one rank), timings and architecture."""
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))["memspec"]
        power, timing, arch = spec["mempowerspec"], spec["memtimingspec"], spec["memarchitecturespec"]
        tck_ns = timing["tCK"] * 1e9
        energy = NdpEnergySpec(
            core_pj_per_flop={"bf16": 1.0},
            core_static_w=0.0,
            vdd_v=power["vdd"],
            idd0_a=power["idd0"],
            idd2n_a=power["idd2n"],
            idd2p_a=power.get("idd2p", 0.0),
            idd3n_a=power["idd3n"],
            idd4r_a=power["idd4r"],
            idd4w_a=power["idd4w"],
            idd5b_a=power.get("idd5B", power.get("idd5b", 0.0)),
            vpp_v=power.get("vpp", 0.0),
            ipp0_a=power.get("ipp0", 0.0),
            ipp2n_a=power.get("ipp2n", 0.0),
            ipp2p_a=power.get("ipp2p", 0.0),
            ipp3n_a=power.get("ipp3n", 0.0),
            ipp4r_a=power.get("ipp4r", 0.0),
            ipp4w_a=power.get("ipp4w", 0.0),
            ipp5b_a=power.get("ipp5B", power.get("ipp5b", 0.0)),
            devices=int(arch["nbrOfDevices"]),
            page_bytes=int(arch["nbrOfColumns"] * arch["width"] // 8),
            tras_ns=timing["RAS"] * tck_ns,
        )
        burst_ns = arch["burstLength"] / arch["dataRate"] * tck_ns
        refi = timing.get("REFI", timing.get("REFI1"))
        timings = DramTiming(energy.tras_ns, timing["RP"] * tck_ns, burst_ns, timing["RFC1"] * tck_ns, refi * tck_ns)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CalibrationDataError(f"{path}: not a DRAMPower memspec this check reads ({exc})") from None
    except HwModelError as exc:
        raise CalibrationDataError(f"{path}: {exc}") from None
    return energy, timings, arch


def _number(path: Path, line: int, row: Mapping[str, str], column: str) -> float:
    try:
        return float(row[column])
    except (KeyError, ValueError):
        problem = f"column {column!r} must be a number, got {row.get(column)!r}"
        raise CalibrationDataError(f"{path}:{line}: {problem}") from None


def load_energy_predictions(path: str | Path) -> list[tuple[str, str, float, float, int, str]]:
    """``(kind, label, DRAMPower J, ours J, line, "J")`` per check of each row of a streams CSV (module docstring)."""
    path = Path(path)
    specs: dict[str, tuple[NdpEnergySpec, DramTiming, Mapping[str, Any]]] = {}
    out: list[tuple[str, str, float, float, int, str]] = []
    with path.open(newline="", encoding="utf-8") as handle:
        for line, raw in enumerate(csv.DictReader(handle), start=2):
            row = {k.strip(): (v or "").strip() for k, v in raw.items() if k}
            name = row["memspec"]
            if name not in specs:
                specs[name] = memspec_energy(path.parent / "memspecs" / name)
            spec, timing, arch = specs[name]
            n = {c: _number(path, line, row, c) for c in DRAM_ENERGY_COLUMNS[3:]}
            tck_s = timing.tburst_ns * 1e-9 / (arch["burstLength"] / arch["dataRate"])
            measured = n["E_total_pJ"] * 1e-12
            label = f"{row['standard']} {row['stream']}"
            counts = CommandCounts(
                acts=n["n_act"],
                pres=n["n_pre"],
                reads=n["n_rd"],
                writes=n["n_wr"],
                refreshes=n["n_ref"],
                active_s=n["rank_act_cycles"] * tck_s,
                precharged_s=n["rank_pre_cycles"] * tck_s,
            )
            ours = sum(command_energy_j(spec, timing, counts).values())
            out.append(("dram_energy", label, measured, ours, line, "J"))
            prefix = next((p for p in _FROM_BYTES if row["stream"].startswith(p)), None)
            if prefix is not None:
                derived = _from_bytes(spec, timing, arch, n, _FROM_BYTES[prefix])
                ours = sum(command_energy_j(spec, timing, derived).values())
                out.append(("dram_energy/from bytes", label, measured, ours, line, "J"))
    if not out:
        raise CalibrationDataError(f"{path}: no data rows")
    return out


def _from_bytes(
    spec: NdpEnergySpec, timing: DramTiming, arch: Mapping[str, Any], n: Mapping[str, float], refreshes: bool
) -> CommandCounts:
    """The commands of a stream of ``bytes_read`` over ``duration_ns`` as the simulator derives them."""
    moved = n["bytes_read"]
    duration_s = n["duration_ns"] * 1e-9
    burst = spec.devices * arch["width"] / 8 * arch["burstLength"]
    refs = int(duration_s / (timing.trefi_ns * 1e-9)) + (0 if moved else 1) if refreshes else 0  # f counts k = 0 too
    refresh_s = refs * timing.trfc_ns * 1e-9
    active_s = duration_s if moved else min(duration_s, refresh_s)  # a streaming rank keeps a bank open throughout
    return CommandCounts(
        acts=moved / (spec.devices * spec.page_bytes),
        pres=moved / (spec.devices * spec.page_bytes),
        reads=moved / burst,
        refreshes=refs,
        active_s=active_s,
        precharged_s=duration_s - active_s,
    )
