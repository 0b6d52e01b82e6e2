"""Converted int8 / int4 GenAI fixtures on the provider against stock ONNX Runtime's CPU QMoE, and the cost of
reproducing its int8 activations.

    python benchmarks/qmoe_parity.py [--feeds 100] [--repeats 60] [--tokens 1 16 64 256] [--no-timing]

Parity: for each quantized fixture of sample_models/genai (MANIFEST.json), the converted model on
NdpExecutionProvider and stock ONNX Runtime on the original run the committed first-step feeds and ``--feeds``
random first-step feeds (graph_passes.feeds, seeds 0.., 1-8 tokens), both with ``ORT_QMOE_CPU_QNBIT_GEMM``
unset (the default path) and both with it ``fp32``; each row gives max |logit error| / max |logit| on the
committed feeds (and, for comparison, stock ONNX Runtime's float path against the same setting: what a
dequantize-then-SGEMM kernel misses by), and the median, the maximum and the count above 1e-3 over the random
feeds. ONNX Runtime's
int8 activation quantization is discontinuous: where a float difference of ~1e-7 (a different summation order,
here or in a later accuracy_level-4 MatMulNBits) moves a value across a rounding boundary the outputs differ by
one int8 step of that value, so the maximum is a tail, not the typical error.

Timing: one QMoE layer (8 experts, top-2, hidden 512, FFN 1408, 8-bit blocks of 32, GPT-OSS SwiGLU), converted
with 4 shards, on one intra-op thread; the provider session with the variable unset (int8 activations from
onnxruntime 1.31) alternates with one made under ``fp32`` (float activations); minima and medians, and the
layer's error against stock ONNX Runtime (stock's own float path for comparison).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
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
from graph_passes.feeds import random_feeds, read_genai_config  # noqa: E402

ENV = "ORT_QMOE_CPU_QNBIT_GEMM"
GENAI_DIR = ROOT / "sample_models" / "genai"
TOLERANCE = 1e-3


@contextlib.contextmanager
def _setting(value: str | None):
    """``ORT_QMOE_CPU_QNBIT_GEMM`` set to ``value`` (None: unset) while sessions are created."""
    previous = os.environ.pop(ENV, None)
    if value is not None:
        os.environ[ENV] = value
    try:
        yield
    finally:
        os.environ.pop(ENV, None)
        if previous is not None:
            os.environ[ENV] = previous


def _options(threads: int = 1) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return options


def _relative(got: np.ndarray, expected: np.ndarray) -> float:
    got, expected = got.astype(np.float64), expected.astype(np.float64)
    return float(np.max(np.abs(got - expected)) / np.max(np.abs(expected)))


def parity(name: str, setting: str | None, feeds: int, tmp: Path) -> str:
    from ndp_ep.cli import main

    source = GENAI_DIR / name / "model.onnx"
    converted = tmp / name / "model.onnx"  # a folder each: converting a GenAI model writes its genai_config.json
    if not converted.is_file():  # converted under the default setting (convert proves int8-activation readings)
        converted.parent.mkdir(exist_ok=True)
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["convert", str(source), "-o", str(converted), "--strict"]) == 0
    with _setting(setting):
        stock = ort.InferenceSession(str(source), _options(), providers=["CPUExecutionProvider"])
        ours = ort.InferenceSession(str(converted), ndp_ep.session_options(_options(), record_routing=0))
    committed = dict(np.load(GENAI_DIR / name / "inputs.npz"))
    expected = stock.run(["logits"], committed)[0]
    fixture_error = _relative(ours.run(["logits"], committed)[0], expected)
    with _setting("fp32"):  # how far the float path (the provider's only one before) is from this setting
        float_path = ort.InferenceSession(str(source), _options(), providers=["CPUExecutionProvider"])
    float_error = _relative(float_path.run(["logits"], committed)[0], expected)
    model = onnx.load(str(source), load_external_data=False)
    config = read_genai_config(source)
    errors = []
    for seed in range(feeds):
        feed = random_feeds(model, seed=seed, seq_len=1 + seed % 8, config=config)
        errors.append(_relative(ours.run(["logits"], feed)[0], stock.run(["logits"], feed)[0]))
    row = f"{name:<14} {setting or 'unset':>6} {float_error:>9.1e} {fixture_error:>9.1e}"
    if not errors:
        return row
    above = sum(e > TOLERANCE for e in errors)
    return row + f" {statistics.median(errors):>9.1e} {max(errors):>9.1e} {above:>4}/{feeds}"


def timing(tokens: int, repeats: int, tmp: Path) -> str:

    from tests.convert_real.test_precisions import SWIGLU_GPT_OSS, qmoe_layer

    experts, hidden, ffn, block = 8, 512, 1408, 32
    rng = np.random.default_rng(0)
    model, _ = qmoe_layer(
        rng,
        8,
        block,
        False,
        hidden,
        ffn,
        experts=experts,
        activation=SWIGLU_GPT_OSS,
        tokens=tokens,
    )
    original, converted = tmp / f"layer_{tokens}.onnx", tmp / f"layer_{tokens}.ndp.onnx"
    onnx.save(model, str(original))
    if not ndp_ep.convert_model(original, converted, shards=4).report.blocks:
        raise SystemExit("the benchmark layer did not convert")
    sessions = {}
    for setting in (None, "fp32"):
        with _setting(setting):
            sessions[setting] = ort.InferenceSession(
                str(converted), ndp_ep.session_options(_options(), record_routing=0)
            )
    feeds = {
        "x": rng.standard_normal((tokens, hidden)).astype(np.float32),
        "logits": rng.standard_normal((tokens, experts)).astype(np.float32),
    }
    stock = {}
    for setting in (None, "fp32"):
        with _setting(setting):
            session = ort.InferenceSession(str(original), _options(), providers=["CPUExecutionProvider"])
        stock[setting] = session.run(None, feeds)[0]
    float_error = _relative(stock["fp32"], stock[None])
    ours_error = _relative(sessions[None].run(None, feeds)[0], stock[None])
    seconds: dict[str | None, list[float]] = {setting: [] for setting in sessions}
    for _ in range(repeats):
        for setting, session in sessions.items():
            start = time.perf_counter()
            session.run(None, feeds)
            seconds[setting].append(time.perf_counter() - start)
    int8, fp32 = seconds[None], seconds["fp32"]
    return (
        f"{tokens:>6} {min(int8) * 1e3:>9.3f} {statistics.median(int8) * 1e3:>9.3f} "
        f"{min(fp32) * 1e3:>9.3f} {statistics.median(fp32) * 1e3:>9.3f} {min(int8) / min(fp32):>6.2f} "
        f"{float_error:>9.1e} {ours_error:>9.1e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--feeds", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--tokens", nargs="*", type=int, default=[1, 16, 64, 256])
    parser.add_argument("--no-timing", action="store_true")
    args = parser.parse_args()
    manifest = json.loads((GENAI_DIR / "MANIFEST.json").read_text())
    names = sorted(n for n, e in manifest.items() if e["weight_dtype"] in ("int8", "int4") and e["cpu_outputs"])
    print(f"onnxruntime {ort.__version__}; max |logit error| / max |logit|, provider vs stock, same {ENV} on both")
    print("committed feeds: stock under fp32 vs stock (float), provider vs stock (ours); random feeds: ours")
    print(f"{'fixture':<14} {'env':>6} {'float':>9} {'ours':>9} {'median':>9} {'max':>9} {'>1e-3':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            for setting in (None, "fp32"):
                print(parity(name, setting, args.feeds, Path(tmp)))
        if not args.no_timing:
            print("\none 8-bit QMoE layer, 1 thread, ms: provider with the variable unset vs under fp32;")
            print("errors vs stock (unset): stock under fp32 (float), provider unset (ours)")
            print(
                f"{'tokens':>6} {'int8 min':>9} {'median':>9} {'fp32 min':>9} {'median':>9} {'ratio':>6} "
                f"{'float':>9} {'ours':>9}"
            )
            for tokens in args.tokens:
                print(timing(tokens, args.repeats, Path(tmp)))


if __name__ == "__main__":
    main()
