"""Memory a provider session takes for its expert weights, per stored precision, against stock ONNX Runtime.

    python benchmarks/bench_weight_memory.py [--weights float32 int8 int4]

For each precision, the layer of benchmarks/bench_moe_layer.py (8 experts, top-2, hidden 512, FFN 1408; fused
``com.microsoft.MoE`` for float32, ``com.microsoft.QMoE`` with blocks of 32 for int8/int4) is converted with 4
shards; then a fresh child process builds one session and runs one token, and reports how much its resident
memory grew (after ``malloc_trim``, so freed memory is not counted): a plain ``onnxruntime.InferenceSession`` with
NdpExecutionProvider on the converted model, and stock ONNX Runtime on the original. The provider keeps each
expert's weights in their stored precision, packed once (native/src/panel_gemm.h), so its growth follows the
file's size.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import ctypes, os, sys
import numpy as np
import onnxruntime as ort
sys.path.insert(0, sys.argv[1])
import ndp_ep
model, feeds, provider = sys.argv[2], dict(np.load(sys.argv[3])), sys.argv[4] == "provider"
def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
if provider:
    ndp_ep.register()
options = ort.SessionOptions()
options.intra_op_num_threads = 1
options.log_severity_level = 3
before = rss_mib()
if provider:
    session = ort.InferenceSession(model, ndp_ep.session_options(options, record_routing=0))
else:
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
session.run(None, feeds)
ctypes.CDLL("libc.so.6").malloc_trim(0)
print(rss_mib() - before)
"""


def _grown_mib(model: Path, feeds: Path, provider: bool) -> float:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), str(model), str(feeds), "provider" if provider else "stock"],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", nargs="*", default=["float32", "int8", "int4"])
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import numpy as np
    import onnx
    from bench_moe_layer import SHAPE, _layer

    import ndp_ep

    print(f"MoE layer {SHAPE}, 4 shards; resident memory a session added after building and one run, MiB")
    print(f"{'weights':<8} {'file (converted)':>16} {'ndp-ep session':>15} {'stock session':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        for weights in args.weights:
            folder = Path(tmp) / weights
            folder.mkdir()
            model, feeds = _layer("swiglu", 1, weights)
            original, converted, feeds_path = folder / "m.onnx", folder / "m.ndp.onnx", folder / "feeds.npz"
            onnx.save(model, str(original))
            np.savez(feeds_path, **feeds)
            if not ndp_ep.convert_model(original, converted, shards=4).report.blocks:
                raise SystemExit(f"{weights}: the layer did not convert")
            ours = _grown_mib(converted, feeds_path, provider=True)
            stock = _grown_mib(original, feeds_path, provider=False)
            size = converted.stat().st_size / 2**20
            print(f"{weights:<8} {size:>16.1f} {ours:>15.1f} {stock:>14.1f}")


if __name__ == "__main__":
    main()
