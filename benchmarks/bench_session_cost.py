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

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]

HIDDEN, EXPERTS, TOP_K, FFN, BLOCK = 2048, 32, 4, 1792, 32
ALIGN = 1 << 16  # external-data offsets, as onnx aligns tensors for memory mapping

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


def _write_external(path: Path, arrays: list[tuple[str, np.ndarray]], data_name: str) -> list[TensorProto]:
    """Appends each array to the external-data file at ``path`` (aligned offsets); returns their tensor protos."""
    tensors = []
    with open(path, "ab") as data:
        for name, array in arrays:
            offset = data.seek(0, 2)
            pad = -offset % ALIGN
            data.write(b"\0" * pad)
            offset += pad
            data.write(np.ascontiguousarray(array).tobytes())
            tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
            tensor.dims.extend(array.shape)
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(array.nbytes))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            tensors.append(tensor)
    return tensors


def build_model(path: Path, layers: int, bits: int, seed: int = 0) -> None:
    """The QMoE chain (module docstring) at ``path``, weights in ``path``.data, built one layer at a time."""
    rng = np.random.default_rng(seed)
    data_name = path.name + ".data"
    (path.parent / data_name).unlink(missing_ok=True)
    nodes, inits = [], []
    current = "x"
    per_byte = 8 // bits
    for layer in range(layers):
        p = f"/model/layers.{layer}/moe"
        arrays = [
            (f"{p}.router", (rng.standard_normal((EXPERTS, HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32)),
            (f"{p}.fc1", rng.integers(0, 256, (EXPERTS, 2 * FFN, HIDDEN // per_byte), dtype=np.uint8)),
            (f"{p}.fc1_scales", rng.uniform(0.01, 0.03, (EXPERTS, 2 * FFN, HIDDEN // BLOCK)).astype(np.float32)),
            (f"{p}.fc2", rng.integers(0, 256, (EXPERTS, HIDDEN, FFN // per_byte), dtype=np.uint8)),
            (f"{p}.fc2_scales", rng.uniform(0.01, 0.03, (EXPERTS, HIDDEN, FFN // BLOCK)).astype(np.float32)),
        ]
        inits += _write_external(path.parent / data_name, arrays, data_name)
        del arrays
        logits, moe, residual = f"{p}/logits", f"{p}/out", f"{p}/residual"
        nodes.append(helper.make_node("Gemm", [current, f"{p}.router"], [logits], transB=1))
        nodes.append(
            helper.make_node(
                "QMoE",
                [current, logits, f"{p}.fc1", f"{p}.fc1_scales", "", f"{p}.fc2", f"{p}.fc2_scales"],
                [moe],
                name=f"{p}/QMoE",
                domain="com.microsoft",
                k=TOP_K,
                activation_type="swiglu",
                swiglu_fusion=1,
                normalize_routing_weights=1,
                expert_weight_bits=bits,
                block_size=BLOCK,
                activation_alpha=1.0,
                activation_beta=0.0,
            )
        )
        nodes.append(helper.make_node("Add", [current, moe], [residual]))
        current = residual
    nodes.append(helper.make_node("Identity", [current], ["y"]))
    graph = helper.make_graph(
        nodes,
        "real_width_qmoe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["tokens", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["tokens", HIDDEN])],
        inits,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=10), str(path))


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
            build_model(original, args.layers, args.bits)
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
