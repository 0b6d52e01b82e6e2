"""Sensitivity of the headline to each remaining assumed constant of the NDP side (issue 12).

For each assumed constant of the ``paper`` preset, one value at a time (everything else as shipped), runs
``ndp-ep bench``'s jobs for every model at 4 NDP units under ours and every baseline, and prints a markdown
table: ours over the strongest baseline of each row (mean, min, max over the models) and the latency of
ours. Shorter requests than the main table (512 prompt + ``--generated`` tokens) keep it to a few minutes.

Constants varied: ``ndp_unit.control_overhead_s`` (host<->NDP launch/sync per NDP kernel; shipped 1 us),
``ndp_unit.peak_flops_per_s`` (NDP compute; shipped 512 GFLOP/s bf16, Hermes) and the DDR generation
(DDR4-3200 vs the DDR5 presets, whose DRAM side hw_model/dram.py derives).
Usage: python benchmarks/bench_sensitivity.py [--generated 64] [--jobs 2]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hw_model.bench import BenchConfig, Job, run_job  # noqa: E402
from hw_model.hardware import PRESET_DIR  # noqa: E402
from hw_model.models import MODELS, get_model  # noqa: E402
from hw_model.policies import policy_names  # noqa: E402
from hw_model.settings import DEFAULT_POLICY, SimulationSettings  # noqa: E402
from hw_model.traces import skew_for  # noqa: E402

UNITS = 4


def _variants(tmp: Path) -> list[tuple[str, str, str]]:
    """(constant, value, hardware preset name or TOML path) per run."""
    paper = (PRESET_DIR / "paper.toml").read_text(encoding="utf-8")
    out = []

    def variant(constant: str, value: str, text: str) -> None:
        path = tmp / f"v{len(out)}.toml"
        path.write_text(text, encoding="utf-8")
        out.append((constant, value, str(path)))

    for control in ("0", "1e-6", "5e-6"):
        text = re.sub(r"(?m)^control_overhead_s = .*$", f"control_overhead_s = {control}", paper)
        variant("host<->NDP launch/sync per NDP kernel", f"{float(control) * 1e6:g} us", text)
    for flops in ("256e9", "512e9", "1024e9"):
        text = re.sub(r"(?ms)(\[ndp_unit\.peak_flops_per_s\]\nbf16 = )[0-9e.]+", rf"\g<1>{flops}", paper)
        text = re.sub(r"(?ms)(\[ndp_unit\.peak_flops_per_s\].*?\nfp16 = )[0-9e.]+", rf"\g<1>{flops}", text)
        variant("NDP compute (bf16 peak)", f"{float(flops) / 1e9:g} GFLOP/s", text)
    for name in ("paper", "paper-ddr5-4800", "paper-ddr5-6400"):
        out.append(("DIMM generation", name.replace("paper-", "") if name != "paper" else "ddr4-3200", name))
    return out


def _run(args: tuple[str, str, str, str, str, int]) -> tuple[str, str, str, str, float, bool]:
    constant, value, hw, model_name, policy, generated = args
    model = get_model(model_name)
    config = BenchConfig(hw=hw, ndp_units=(UNITS,), models=(model_name,), generated_tokens=generated, gantt=False)
    settings = SimulationSettings(hw=hw, ndp_units=UNITS, policy=policy)
    record = run_job(Job(model, settings, "typical", skew_for(model_name, "typical")), config).record
    return constant, value, model_name, policy, record["latency_s"], record["feasible"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generated", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    policies = (DEFAULT_POLICY, *policy_names("baseline"))
    with tempfile.TemporaryDirectory() as tmp:
        variants = _variants(Path(tmp))
        work = [(c, v, hw, m, p, args.generated) for c, v, hw in variants for m in MODELS for p in policies]
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(_run, work, chunksize=1))
    print(
        f"| constant | value | ours over the strongest baseline (mean, min-max over {len(MODELS)} models) |"
        " strongest baseline(s) | ours, s (mean) |"
    )
    print("|---|---|---|---|---|")
    for constant, value, _ in variants:
        speedups, best_names, ours = [], set(), []
        for model in MODELS:
            mine = {p: (lat, ok) for c, v, m, p, lat, ok in results if (c, v, m) == (constant, value, model)}
            feasible = {p: lat for p, (lat, ok) in mine.items() if ok and p != DEFAULT_POLICY}
            if not feasible or not mine[DEFAULT_POLICY][1]:
                continue
            best = min(feasible, key=feasible.get)
            best_names.add(best)
            speedups.append(feasible[best] / mine[DEFAULT_POLICY][0])
            ours.append(mine[DEFAULT_POLICY][0])
        arr = np.asarray(speedups)
        print(
            f"| {constant} | {value} | {arr.mean():.2f}× ({arr.min():.2f}–{arr.max():.2f}) | "
            f"{', '.join(sorted(best_names))} | {np.mean(ours):.2f} |"
        )


if __name__ == "__main__":
    main()
