"""Time ``ndp_ep.InferenceSession.run`` against stock ONNX Runtime on the same original model.

    python benchmarks/bench_session.py [--model sample_models/moe_decoder.onnx] [--repeats 300]

Both sessions run in this process, alternating call by call so machine noise hits both alike; prints the
median time per run of each and their ratio (target: provider / stock <= 1.3 at 1 and at 64 tokens).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ndp_ep.session import InferenceSession  # noqa: E402

TARGET_RATIO = 1.3


def measure(model: Path, tokens: int, repeats: int, threads: int) -> tuple[float, float]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    stock = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    ours_options = ort.SessionOptions()
    ours_options.intra_op_num_threads = threads
    ours = InferenceSession(model, hw="paper", sess_options=ours_options)
    name = stock.get_inputs()[0].name
    rng = np.random.default_rng(tokens)
    if stock.get_inputs()[0].type == "tensor(int64)":
        feed = {name: rng.integers(0, 128, size=(1, tokens), dtype=np.int64)}
    else:
        feed = {name: rng.standard_normal((1, tokens, 64)).astype(np.float32)}
    for _ in range(20):  # warm-up
        stock.run(None, feed)
        ours.run(None, feed)
    stock_s, ours_s = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        stock.run(None, feed)
        stock_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        ours.run(None, feed)
        ours_s.append(time.perf_counter() - start)
    return statistics.median(stock_s), statistics.median(ours_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "sample_models/moe_decoder.onnx"))
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads for both sessions")
    args = parser.parse_args()
    print(f"model {args.model}, {args.repeats} alternating runs each, {args.threads} intra-op thread(s)")
    print(f"{'tokens':>6} {'stock ORT':>12} {'ndp-ep':>12} {'ratio':>7}  target <= {TARGET_RATIO}")
    for tokens in (1, 64):
        stock_s, ours_s = measure(Path(args.model), tokens, args.repeats, args.threads)
        ratio = ours_s / stock_s
        verdict = "ok" if ratio <= TARGET_RATIO else "MISS"
        print(f"{tokens:>6} {stock_s * 1e6:>10.1f}us {ours_s * 1e6:>10.1f}us {ratio:>7.2f}  {verdict}")


if __name__ == "__main__":
    main()
