"""Session creation time and peak memory at real widths: the provider on a converted model vs stock ONNX Runtime.

    python benchmarks/bench_session_cost.py [--dir /tmp/x] [--layers 4] [--bits 4] [--repeats 3] [--keep]

Builds, without downloads, a chain of ``--layers`` ``com.microsoft.QMoE`` blocks at LFM2-8B-A1B's widths (hidden
2048, 32 experts top-4, expert FFN 1792, SiLU-GLU, int4 or int8 in blocks of 32, seeded random weights, no biases
as GenAI's builder writes them), each routed by a Gemm and added to the residual stream, with its weights in one
external-data file (as GenAI's model builder writes them); converts it with ``ndp-ep convert``; then, alternating
the contenders in fresh child processes, builds one session of each and runs one token:

- ``stock``: ``onnxruntime.InferenceSession`` with the CPU provider on the original model;
- ``ep``: ``onnxruntime.InferenceSession`` with NdpExecutionProvider on the converted model.

Each child prints its session-creation wall and CPU time and its peak resident set (``VmHWM`` from
/proc/self/status, which includes the interpreter and onnxruntime's import: the baseline before the session is
printed too) after creation, after the 1-token run and after a 64-token run (which routes to every expert).
The script prints the medians and the ratios ep / stock. Goal (issue 28): both within 1.1×.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sample_models.qmoe_chain import LFM2_8B_A1B, build_chain  # noqa: E402

HIDDEN, EXPERTS, TOP_K, FFN, BLOCK = (
    LFM2_8B_A1B.hidden,
    LFM2_8B_A1B.experts,
    LFM2_8B_A1B.top_k,
    LFM2_8B_A1B.ffn,
    LFM2_8B_A1B.block,
)


CHILD = r"""
import json, os, resource, sys, time
import numpy as np
import onnxruntime as ort
sys.path.insert(0, sys.argv[1])
import ndp_ep
model, contender = sys.argv[2], sys.argv[3]
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
if contender == "ep":
    ndp_ep.register()
options = ort.SessionOptions()
options.log_severity_level = 3
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
baseline = status("VmHWM")
start, start_cpu = time.perf_counter(), cpu()
if contender == "ep":
    session = ort.InferenceSession(model, ndp_ep.session_options(options, record_routing=0))
else:
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
created, created_cpu = time.perf_counter() - start, cpu() - start_cpu
peak_created = status("VmHWM")
x = np.random.default_rng(0).standard_normal((1, int(sys.argv[4]))).astype(np.float32)
session.run(None, {"x": x})
peak_1 = status("VmHWM")
x = np.random.default_rng(1).standard_normal((64, int(sys.argv[4]))).astype(np.float32)
session.run(None, {"x": x})
print(json.dumps({"create_s": created, "create_cpu_s": created_cpu, "baseline_mib": baseline,
                  "peak_created_mib": peak_created, "peak_mib": peak_1, "peak_64_mib": status("VmHWM")}))
"""


def measure(model: Path, contender: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), str(model), contender, str(HIDDEN)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{contender} child failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where the models go (default: a temporary folder)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--bits", type=int, choices=(4, 8), default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the models (with --dir)")
    parser.add_argument("--reuse", action="store_true", help="reuse the models already in --dir")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="ndp_session_cost_")) if args.dir is None else args.dir
    folder.mkdir(parents=True, exist_ok=True)
    original, converted = folder / "qmoe.onnx", folder / "qmoe.ndp.onnx"
    try:
        if not (args.reuse and original.exists() and converted.exists()):
            build_chain(original, args.layers, args.bits)
            subprocess.run(
                [sys.executable, "-m", "ndp_ep", "convert", str(original), "-o", str(converted), "--external-data"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        size = sum(f.stat().st_size for f in folder.iterdir() if f.name.startswith("qmoe.onnx")) / 2**20
        print(
            f"{args.layers} QMoE layers, hidden {HIDDEN}, {EXPERTS} experts top-{TOP_K}, FFN {FFN}, "
            f"int{args.bits} blocks of {BLOCK}; original model {size:.0f} MiB"
        )
        results: dict[str, list[dict]] = {"stock": [], "ep": []}
        for _ in range(args.repeats):
            for contender, model in (("stock", original), ("ep", converted)):
                results[contender].append(measure(model, contender))
        medians = {c: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for c, runs in results.items()}
        print(
            f"{'':<6} {'create s':>9} {'CPU s':>6} {'baseline MiB':>13} {'peak at creation':>17} {'after 1 token':>14} "
            f"{'after 64 tokens':>16}"
        )
        for contender, m in medians.items():
            print(
                f"{contender:<6} {m['create_s']:>9.2f} {m['create_cpu_s']:>6.2f} {m['baseline_mib']:>13.0f} "
                f"{m['peak_created_mib']:>17.0f} {m['peak_mib']:>14.0f} {m['peak_64_mib']:>16.0f}"
            )
        ep, stock = medians["ep"], medians["stock"]
        print(
            f"ep / stock: creation {ep['create_s'] / stock['create_s']:.2f}x "
            f"(CPU {ep['create_cpu_s'] / stock['create_cpu_s']:.2f}x), peak RSS "
            f"{ep['peak_mib'] / stock['peak_mib']:.2f}x (above the baseline "
            f"{(ep['peak_mib'] - ep['baseline_mib']) / (stock['peak_mib'] - stock['baseline_mib']):.2f}x), "
            f"after a 64-token run {ep['peak_64_mib'] / stock['peak_64_mib']:.2f}x; "
            f"median of {args.repeats} alternating runs"
        )
    finally:
        if args.dir is None or not args.keep:
            shutil.rmtree(folder, ignore_errors=True) if args.dir is None else None
            if args.dir is not None:
                for f in folder.glob("qmoe*"):
                    f.unlink()


if __name__ == "__main__":
    main()
