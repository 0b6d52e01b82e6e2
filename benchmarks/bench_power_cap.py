"""Ours under an average-power cap (``power_cap_w``, hw_model/power_cap.py) against the baselines, at several caps.

For each model, on one preset (default ``edge``: an Orin-class SoC whose 15-60 W budget is the issue's edge case),
runs ``ndp-ep bench``'s jobs for the baselines (uncapped: they have no power knob) and for ours at each cap, and
prints a markdown table per model: latency, the simulator's average power (its own accounting: MoE work, idle
resources at static power; ``moe_avg_power_w``), the request's average power with the non-expert ops priced
(``avg_power_w``), decode J/token, and, per cap, the fastest baseline that stays within it.

Usage: python benchmarks/bench_power_cap.py [--hw edge] [--caps 0,25,22,20,18,16] [--generated 128] [--jobs 2]
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hw_model.bench import BenchConfig, Job, run_job  # noqa: E402
from hw_model.models import get_model  # noqa: E402
from hw_model.policies import policy_names  # noqa: E402
from hw_model.settings import DEFAULT_POLICY, SimulationSettings  # noqa: E402
from hw_model.traces import skew_for  # noqa: E402


def _run(args: tuple[str, int, str, str, float, int, int]) -> dict:
    hw, units, model_name, policy, cap, prompt, generated = args
    model = get_model(model_name)
    config = BenchConfig(
        hw=hw,
        ndp_units=(units,),
        models=(model_name,),
        prompt_tokens=prompt,
        generated_tokens=generated,
        gantt=False,
        sweeps=False,
    )
    settings = SimulationSettings(hw=hw, ndp_units=units, policy=policy, power_cap_w=cap)
    record = run_job(Job(model, settings, "typical", skew_for(model_name, "typical")), config).record
    return {"model": model_name, "policy": policy, "cap": cap, **record}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hw", default="edge")
    parser.add_argument("--ndp-units", type=int, default=4)
    parser.add_argument("--models", default="olmoe-1b-7b,qwen3-30b-a3b")
    parser.add_argument("--caps", default="0,25,22,20,18,16", help="watts; 0 = ours uncapped")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--generated", type=int, default=128)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    caps = [float(c) for c in args.caps.split(",")]
    models = args.models.split(",")
    baselines = policy_names("baseline")
    work = [(args.hw, args.ndp_units, m, p, 0.0, args.prompt, args.generated) for m in models for p in baselines]
    work += [(args.hw, args.ndp_units, m, DEFAULT_POLICY, c, args.prompt, args.generated) for m in models for c in caps]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(_run, work, chunksize=1))
    print(
        f"{args.hw} preset, {args.ndp_units} NDP units, {args.prompt} prompt + {args.generated} generated tokens, "
        "typical skew, seed 0\n"
    )
    for model in models:
        mine = [r for r in rows if r["model"] == model and r["feasible"]]
        base = [r for r in mine if r["policy"] in baselines]
        print(f"**{model}**\n")
        print(
            "| policy | cap, W | latency, s | MoE avg power, W | request avg power, W | decode J/token | within cap | fastest baseline within the cap |"
        )
        print("|---|---:|---:|---:|---:|---:|---|---|")
        for r in base:
            print(
                f"| {r['policy']} | - | {r['latency_s']:.3f} | {r['moe_avg_power_w']:.1f} | {r['avg_power_w']:.1f} | "
                f"{r['joules_per_token']:.3f} | - | - |"
            )
        for r in (r for r in mine if r["policy"] == DEFAULT_POLICY):
            cap = r["cap"]
            within = "-" if cap == 0 else ("yes" if r["moe_avg_power_w"] <= cap * (1 + 1e-9) else "NO")
            fitting = [b for b in base if cap == 0 or b["moe_avg_power_w"] <= cap]
            fastest = min(fitting, key=lambda b: b["latency_s"]) if fitting else None
            best = (
                f"{fastest['policy']} {fastest['latency_s']:.3f} s ({fastest['latency_s'] / r['latency_s']:.2f}× ours)"
                if fastest
                else "none"
            )
            print(
                f"| {DEFAULT_POLICY} | {cap:g} | {r['latency_s']:.3f} | {r['moe_avg_power_w']:.1f} | "
                f"{r['avg_power_w']:.1f} | {r['joules_per_token']:.3f} | {within} | {best} |"
            )
        print()


if __name__ == "__main__":
    main()
