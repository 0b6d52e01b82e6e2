"""``ndp-ep demo``: one request on the bundled MoE decoder, under the baselines and under ours, explained.

The bundled three-layer decoder (:func:`ndp_ep.samples.sample_path`) is converted, then one request (its
16-token prompt, then ``--decode-steps`` greedy tokens, one at a time) runs through the provider; every
output is checked against stock ONNX Runtime. The same request is then replayed under each baseline policy
(:func:`baseline_policies`) and the simulated latencies are compared with ours: the table, the speedup over
the strongest baseline (the lowest simulated total), and where the gain comes from (which experts ran where,
what was prefetched, what crossed PCIe), computed from the runs' reports.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from ndp_ep.cli_args import add_hardware_args, add_json_args, bounded_int, output_dir
from ndp_io import temporary_directory

HELP = "convert and run a bundled MoE sample, check it against stock ONNX Runtime, compare ours with the baselines"
PARITY_TOLERANCE = 1e-5  # max |provider - stock| relative to max |stock|
MAX_DECODE_STEPS = 256
SAMPLE = "moe_decoder.onnx"
SAMPLE_FEEDS = "moe_decoder.inputs.npz"
MIB = float(1 << 20)


def baseline_policies() -> tuple[str, ...]:
    """The policies ours is compared with: every prior-work baseline registered in :mod:`hw_model.policies`."""
    from hw_model.policies import policy_names

    return policy_names("baseline")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_hardware_args(parser)
    parser.add_argument(
        "--decode-steps",
        type=bounded_int(0, MAX_DECODE_STEPS),
        default=8,
        metavar="N",
        help=f"tokens generated one at a time after the prompt (0-{MAX_DECODE_STEPS})",
    )
    parser.add_argument(
        "--out",
        type=output_dir,
        metavar="DIR",
        help="directory to keep the converted model in (default: a temporary one, removed)",
    )
    add_json_args(parser, what="the comparison")


@dataclass(frozen=True)
class PolicyRun:
    """One policy's simulated latency for the whole request, and where its expert runs went."""

    policy: str
    prompt_s: float
    decode_s: tuple[float, ...]
    gpu_runs: int
    split_runs: int  # tensor-parallel over every NDP unit
    whole_runs: int  # a whole expert on a single NDP unit
    on_demand_weight_bytes: float
    summary: dict
    energy_j: float | None = None  # the request's simulated joules (None: the hardware has no energy tables)
    shared_runs: int = 0  # one expert's FFN columns split between the GPU and the NDP units (ours' balancing split)

    def __post_init__(self) -> None:
        if self.prompt_s < 0 or any(s < 0 for s in self.decode_s):
            raise ValueError(f"{self.policy}: negative simulated latency")
        if min(self.gpu_runs, self.split_runs, self.whole_runs, self.shared_runs) < 0:
            raise ValueError(f"{self.policy}: negative expert-run count")

    @property
    def total_s(self) -> float:
        return self.prompt_s + sum(self.decode_s)

    @property
    def per_token_s(self) -> float | None:
        return sum(self.decode_s) / len(self.decode_s) if self.decode_s else None

    @property
    def expert_runs(self) -> int:
        return self.gpu_runs + self.split_runs + self.whole_runs + self.shared_runs

    @classmethod
    def from_reports(cls, policy: str, reports: list, summary: dict) -> PolicyRun:
        places = [where for report in reports for layer in report.layers for where in layer.placement.values()]
        return cls(
            policy=policy,
            prompt_s=reports[0].simulated_latency_s,
            decode_s=tuple(r.simulated_latency_s for r in reports[1:]),
            gpu_runs=sum(1 for p in places if p == "gpu"),
            split_runs=sum(1 for p in places if p == "ndp"),
            whole_runs=sum(1 for p in places if p.startswith("ndp") and p != "ndp"),
            on_demand_weight_bytes=float(summary.get("on_demand_weight_bytes", 0.0)),
            summary=summary,
            energy_j=None if any(r.energy is None for r in reports) else sum(r.energy.total_j for r in reports),
            shared_runs=sum(1 for p in places if p == "split"),
        )

    def to_json(self) -> dict:
        return {
            "policy": self.policy,
            "prompt_s": self.prompt_s,
            "per_token_s": self.per_token_s,
            "total_s": self.total_s,
            "expert_runs": {
                "gpu": self.gpu_runs,
                "ndp_split": self.split_runs,
                "ndp_whole": self.whole_runs,
                "gpu_and_ndp": self.shared_runs,
            },
            "on_demand_weight_bytes": self.on_demand_weight_bytes,
            "energy_j": self.energy_j,
        }


def faster_or_slower(baseline_s: float, ours_s: float) -> str:
    """'1.25x faster' when ours takes less time than the baseline, '1.10x slower' when it takes more."""
    if ours_s <= 0 or baseline_s <= 0:
        return "-"
    if baseline_s >= ours_s:
        return f"{baseline_s / ours_s:.2f}x faster"
    return f"{ours_s / baseline_s:.2f}x slower"


def _relative_error(ours, reference) -> float:
    import numpy as np

    scale = float(np.max(np.abs(reference))) or 1.0
    return float(np.max(np.abs(ours - reference))) / scale


def _request(session, stock, prompt, steps: int) -> tuple[list, list, float]:
    """Run the prompt and ``steps`` greedy tokens on ours and on stock ONNX Runtime: (token feeds, reports, error)."""
    import numpy as np

    feeds = [prompt]
    ours = session.run(None, {"input_ids": prompt})[0]
    worst = _relative_error(ours, stock.run(None, {"input_ids": prompt})[0])
    for _ in range(steps):
        next_id = np.argmax(ours[:, -1:, :], axis=-1).astype(np.int64)
        feeds.append(next_id)
        ours = session.run(None, {"input_ids": next_id})[0]
        worst = max(worst, _relative_error(ours, stock.run(None, {"input_ids": next_id})[0]))
    return feeds, session.reports, worst


def _replay(model: Path, settings, feeds: list) -> PolicyRun:
    """The same token feeds under another policy (the numerics do not depend on the policy)."""
    from ndp_ep.session import InferenceSession

    session = InferenceSession(model, settings=settings)
    for ids in feeds:
        session.run(None, {"input_ids": ids})
    return PolicyRun.from_reports(settings.policy, session.reports, session.simulator.summary())


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import onnxruntime as ort

    from ndp_ep.cli_args import settings_from_args
    from ndp_ep.convert import convert_model
    from ndp_ep.samples import sample_path
    from ndp_ep.session import InferenceSession

    sample = sample_path(SAMPLE)
    with np.load(sample_path(SAMPLE_FEEDS)) as archive:
        prompt = archive["input_ids"]
    settings = settings_from_args(args)  # ours: the default policy
    system = settings.system
    ours_policy = settings.policy
    with temporary_directory("ndp-ep-demo-") as scratch:  # removed on SIGTERM/SIGHUP/SIGINT too (ndp_io)
        out_dir = Path(args.out) if args.out else Path(scratch)
        if args.out:
            out_dir.mkdir(parents=True, exist_ok=True)
        converted = out_dir / "moe_decoder.ndp.onnx"
        result = convert_model(sample, converted, settings=settings)
        session = InferenceSession(converted, settings=settings)
        stock = ort.InferenceSession(str(sample), providers=["CPUExecutionProvider"])
        feeds, reports, worst = _request(session, stock, prompt, args.decode_steps)
        runs = [_replay(converted, settings.replace(policy=policy), feeds) for policy in baseline_policies()]
    ours = PolicyRun.from_reports(ours_policy, reports, session.simulator.summary())
    best = min(runs, key=lambda r: r.total_s)
    speedup = best.total_s / ours.total_s if ours.total_s > 0 else None  # None: nothing was simulated
    ok = worst <= PARITY_TOLERANCE
    if args.json:
        print(
            json.dumps(
                {
                    "sample": sample.name,
                    "hardware": system.name,
                    "ndp_units": system.num_ndp_units,
                    "simulated_dtype": session.dtype,
                    "request": {"prompt_tokens": int(prompt.size), "generated_tokens": args.decode_steps},
                    # without --out the conversion went to a temporary folder, deleted before this prints
                    "conversion": {**result.to_json(), **({} if args.out else {"files": []})},
                    "parity": {"max_rel_error": worst, "tolerance": PARITY_TOLERANCE, "ok": ok},
                    "ours": ours.to_json(),
                    "baselines": [r.to_json() for r in runs],
                    "strongest_baseline": best.policy,
                    "speedup_over_strongest": speedup,
                    "prefill": reports[0].to_json(),
                }
            )
        )
        return 0 if ok else 1
    print(_explain(sample, system, session.dtype, result, prompt, args.decode_steps, worst, ok))
    print(_comparison(runs, ours, best))
    print(_why(ours, best, system.num_ndp_units))
    print(_prompt_layers(reports[0]))
    return 0 if ok else 1


def _explain(sample: Path, system, dtype: str, result, prompt, steps: int, worst: float, ok: bool) -> str:
    from ndp_ep.text import plural, wrap

    blocks = result.report.blocks
    shards = sorted({b.shards for b in blocks})
    verdict = "every output matched" if ok else "MISMATCH: the outputs differ from"
    hardware = f"{system.name} (a GPU + {plural(system.num_ndp_units, 'NDP unit')})"
    paragraphs = [
        f"ndp-ep demo: {sample.name}, a decoder with {plural(len(blocks), 'MoE layer')}, stored in float32, on "
        f"{hardware}.",
        f"What ran: the model's numerics, on this machine's CPU through ONNX Runtime, with its "
        f"{plural(len(blocks), 'MoE block')} converted into sharded expert ops "
        f"({' or '.join(str(s) for s in shards)} {'shard' if shards == [1] else 'shards'} per expert); {verdict} stock "
        "ONNX Runtime "
        f"(max relative error {worst:.1e}, tolerance {PARITY_TOLERANCE:g}).",
        f"What is simulated: the latency the same request would have on {system.name}, from the experts each "
        f"run actually routed to. Times are simulated milliseconds; weights are costed as {dtype} (the deployment "
        f"dtype), not as the float32 that ran.",
        f"The request: a prompt of {plural(int(prompt.size), 'token')}"
        + (f", then {plural(steps, 'token')} generated one at a time." if steps else ", and no generated token."),
    ]
    return "\n\n".join("\n".join(wrap(p)) for p in paragraphs) + "\n"


def _comparison(runs: list[PolicyRun], ours: PolicyRun, best: PolicyRun) -> str:
    from ndp_ep.text import table

    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1e3:.3f}"

    rows = [["policy", "prompt", "per token", "total", "ours is"], ["", "ms", "ms", "ms", ""]]
    for run in [*runs, ours]:
        label = run.policy
        if run is best:
            label += " (strongest baseline)"
        elif run is ours:
            label += " (ours)"
        ratio = "-" if run is ours else faster_or_slower(run.total_s, ours.total_s)
        rows.append([label, ms(run.prompt_s), ms(run.per_token_s), ms(run.total_s), ratio])
    lines = table(rows, "<>>><", indent="  ")
    if ours.energy_j is not None and best.energy_j is not None:
        watts = ours.energy_j / ours.total_s if ours.total_s > 0 else 0.0
        ratio = max(best.energy_j, ours.energy_j) / min(best.energy_j, ours.energy_j)
        lines.append(
            f"  energy: ours {ours.energy_j * 1e3:.1f} mJ ({watts:.0f} W average), {best.policy} "
            f"{best.energy_j * 1e3:.1f} mJ: {ratio:.2f}x "
            f"{'less' if best.energy_j >= ours.energy_j else 'more'}"
        )
    return "\n".join(lines) + "\n"


def _where(run: PolicyRun, units: int) -> str:
    parts = []
    if run.split_runs:
        spread = {1: "on the one NDP unit", 2: "split over both NDP units"}
        over = spread.get(units, f"split over all {units} NDP units")
        parts.append(f"{run.split_runs} {over}")
    if run.whole_runs:
        parts.append(f"{run.whole_runs} whole on a single NDP unit")
    if run.gpu_runs:
        parts.append(f"{run.gpu_runs} on the GPU")
    if run.shared_runs:
        parts.append(f"{run.shared_runs} split between the GPU and the NDP units")
    if len(parts) > 1:
        return ", ".join(parts[:-1]) + " and " + parts[-1]
    return parts[0] if parts else "none"


def _why(ours: PolicyRun, best: PolicyRun, units: int) -> str:
    from ndp_ep.text import plural, wrap

    sentence = (
        f"Ours is {faster_or_slower(best.total_s, ours.total_s)} than {best.policy}: of the request's "
        f"{plural(ours.expert_runs, 'expert run')}, ours ran {_where(ours, units)}, {best.policy} ran "
        f"{_where(best, units)}"
    )
    hits, misses = ours.summary.get("prefetch_hits"), ours.summary.get("prefetch_misses")
    if hits is not None and misses is not None and hits + misses:
        sentence += (
            f"; in the generated tokens, {int(hits)} of ours' {int(hits + misses)} expert selections found the "
            "expert already prefetched into GPU memory (planned from the prompt's routing)"
        )
    sentence += (
        f"; expert weights copied to the GPU on demand: {ours.on_demand_weight_bytes / MIB:.2f} MiB for ours, "
        f"{best.on_demand_weight_bytes / MIB:.2f} MiB for {best.policy}."
    )
    return "\n".join(wrap(sentence)) + "\n"


def _prompt_layers(prompt_report) -> str:
    """The prompt's per-layer latency under ours, and where its experts went."""
    from ndp_ep.text import plural, table

    rows = [["prompt, per layer (ours)", "ms", "experts ran"]]
    for layer in prompt_report.layers:
        where = list(layer.placement.values())
        gpu = sum(1 for p in where if p == "gpu")
        both = sum(1 for p in where if p == "split")
        ndp = len(where) - gpu - both
        shares = (f"{gpu} on GPU" if gpu else "", f"{ndp} on NDP" if ndp else "", f"{both} on both" if both else "")
        placed = ", ".join(x for x in shares if x)
        rows.append([layer.name, f"{layer.latency_s * 1e3:.3f}", f"{plural(len(where), 'expert')}: {placed}"])
    rows.append(["non-expert ops (GPU)", f"{prompt_report.non_expert_gpu_s * 1e3:.3f}", ""])
    rows.append(["total", f"{prompt_report.simulated_latency_s * 1e3:.3f}", ""])
    return "\n".join(table(rows, "<><", indent="  "))
