"""One MoE layer on the provider against ONNX Runtime's fused ``com.microsoft.MoE`` CPU kernel.

    python benchmarks/bench_moe_layer.py [--repeats 100] [--threads 1 2] [--tokens 1 16 64 256]
                                         [--weights float32|int8|int4]

The layer (router Gemm + ``com.microsoft.MoE``) is built by sample_models/build_fused_moe.py at a mid-size
shape (8 experts, top-2, hidden 512, FFN 1408, normalized routing, biases), once with the clamped SwiGLU of
GPT-OSS (``swiglu``) and once with ``relu``. ndp-ep converts it (``--shards``, default 4: the paper's NDP units)
and a plain ``onnxruntime.InferenceSession`` runs the converted layer with NdpExecutionProvider; stock ONNX
Runtime runs the fused original. Calls alternate; prints medians and provider / fused (target <= 1.2).
``--weights int8`` / ``int4``: the same shape as a ``com.microsoft.QMoE`` layer (GPT-OSS SwiGLU, blocks of 32,
tests/convert_real/test_precisions.py's builder) against stock ONNX Runtime's QMoE, both on ONNX Runtime's
default path (ORT_QMOE_CPU_QNBIT_GEMM unset: from 1.31, int8 activations for 8 bits); the provider keeps the
codes packed, widening them in registers for float activations and multiplying them as integers with int8 ones.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ndp_ep  # noqa: E402
from sample_models.build_fused_moe import FusedCase, build_case  # noqa: E402

TARGET_RATIO = 1.2
SHAPE = {"num_experts": 8, "hidden": 512, "ffn": 1408}


def _options(threads: int) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return options


def _layer(activation: str, tokens: int, weights: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    if weights == "float32":
        case = FusedCase(
            name=f"bench_{activation}", activation=activation, top_k=2, normalize=True, biases=True, tokens=tokens,
            **SHAPE,
        )  # fmt: skip
        model, feeds, _ = build_case(case)
        return model, feeds
    from tests.convert_real.test_precisions import SWIGLU_GPT_OSS, qmoe_layer

    rng = np.random.default_rng(0)
    experts, hidden, ffn = SHAPE["num_experts"], SHAPE["hidden"], SHAPE["ffn"]
    model, _ = qmoe_layer(
        rng, int(weights[3:]), 32, False, hidden, ffn, experts=experts, activation=SWIGLU_GPT_OSS, tokens=tokens
    )
    feeds = {
        "x": rng.standard_normal((tokens, hidden)).astype(np.float32),
        "logits": rng.standard_normal((tokens, experts)).astype(np.float32),
    }
    return model, feeds


def measure(
    activation: str, tokens: int, threads: int, repeats: int, shards: int, tmp: Path, weights: str = "float32"
) -> tuple[float, float, float]:
    model, feeds = _layer(activation, tokens, weights)
    original = tmp / f"{activation}_{weights}_{tokens}.onnx"
    converted = tmp / f"{activation}_{weights}_{tokens}.ndp.onnx"
    onnx.save(model, str(original))
    result = ndp_ep.convert_model(original, converted, shards=shards)
    if not result.report.blocks:
        raise SystemExit(f"{activation}: the layer did not convert: {result.report.skipped}")
    fused = ort.InferenceSession(str(original), _options(threads), providers=["CPUExecutionProvider"])
    ours = ort.InferenceSession(str(converted), ndp_ep.session_options(_options(threads), record_routing=0))
    expected, got = fused.run(None, feeds)[0], ours.run(None, feeds)[0]
    error = float(np.max(np.abs(got - expected)) / np.max(np.abs(expected)))
    for _ in range(5):
        fused.run(None, feeds)
        ours.run(None, feeds)
    fused_s, ours_s = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        fused.run(None, feeds)
        fused_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        ours.run(None, feeds)
        ours_s.append(time.perf_counter() - start)
    return statistics.median(fused_s), statistics.median(ours_s), error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    parser.add_argument("--tokens", nargs="*", type=int, default=[1, 16, 64, 256])
    parser.add_argument("--activations", nargs="*", default=["swiglu", "relu"])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--weights", choices=["float32", "int8", "int4"], default="float32")
    args = parser.parse_args()
    if args.weights != "float32":
        args.activations = ["swiglu"]  # the QMoE builder's GPT-OSS SwiGLU
    stock = "fused MoE" if args.weights == "float32" else "stock QMoE"
    print(
        f"MoE layer {SHAPE}, {args.weights} weights, top-2, {args.shards} shards; {args.repeats} alternating runs "
        "per cell, medians"
    )
    print(f"{'activation':<10} {'thr':>3} {'tokens':>6} {stock:>11} {'ndp-ep':>11} {'ratio':>6} {'rel.err':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for activation in args.activations:
            for threads in args.threads:
                for tokens in args.tokens:
                    fused_s, ours_s, error = measure(
                        activation, tokens, threads, args.repeats, args.shards, Path(tmp), args.weights
                    )
                    ratio = ours_s / fused_s
                    print(
                        f"{activation:<10} {threads:>3} {tokens:>6} {fused_s * 1e6:>9.1f}us {ours_s * 1e6:>9.1f}us "
                        f"{ratio:>6.2f} {error:>8.1e}{'' if ratio <= TARGET_RATIO else '  MISS'}"
                    )
    print(f"target: ndp-ep / fused com.microsoft.{'MoE' if args.weights == 'float32' else 'QMoE'} <= {TARGET_RATIO}")


if __name__ == "__main__":
    main()
