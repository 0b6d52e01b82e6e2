"""``ndp-ep demo``: convert a bundled sample, run it, check it against stock ONNX Runtime, print the report."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

HELP = "convert and run a bundled MoE sample, check parity with stock ONNX Runtime, print the latency report"
PARITY_TOLERANCE = 1e-5  # max |provider - stock| relative to max |stock|


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hw", default="paper", help="hardware preset (paper, edge, h200) or TOML file")
    parser.add_argument("--ndp-units", type=int, default=None, help="override the preset's NDP unit count")
    parser.add_argument("--decode-steps", type=int, default=8, help="single-token runs after the prompt")
    parser.add_argument("--out", help="directory to keep the converted model in (default: a temporary one)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run(args: argparse.Namespace) -> int:
    from importlib.resources import files

    import numpy as np
    import onnxruntime as ort

    from ndp_ep.convert import convert_model
    from ndp_ep.session import InferenceSession

    sample = Path(str(files("sample_models") / "moe_decoder.onnx"))
    feeds = dict(np.load(sample.with_name("moe_decoder.inputs.npz")))
    with tempfile.TemporaryDirectory() as scratch:
        out_dir = Path(args.out) if args.out else Path(scratch)
        converted = out_dir / "moe_decoder.ndp.onnx"
        result = convert_model(sample, converted, hw=args.hw, ndp_units=args.ndp_units)
        session = InferenceSession(converted, hw=args.hw, ndp_units=args.ndp_units)
        stock = ort.InferenceSession(str(sample), providers=["CPUExecutionProvider"])
        ids = feeds["input_ids"]
        ours = session.run(None, {"input_ids": ids})[0]
        reference = stock.run(None, {"input_ids": ids})[0]
        worst = 0.0
        prefill = session.last_report
        step_reports = []
        next_id = ids
        for _ in range(args.decode_steps):
            next_id = np.argmax(ours[:, -1:, :], axis=-1).astype(np.int64)
            ours = session.run(None, {"input_ids": next_id})[0]
            reference = stock.run(None, {"input_ids": next_id})[0]
            worst = max(worst, _relative_error(ours, reference))
            step_reports.append(session.last_report)
        worst = max(worst, _relative_error(session.run(None, {"input_ids": ids})[0], stock.run(None, feeds)[0]))
    ok = worst <= PARITY_TOLERANCE
    decode_s = [r.simulated_latency_s for r in step_reports]
    if args.json:
        print(
            json.dumps(
                {
                    "sample": sample.name,
                    "conversion": result.to_json(),
                    "parity": {"max_rel_error": worst, "tolerance": PARITY_TOLERANCE, "ok": ok},
                    "prefill": prefill.to_json(),
                    "decode_mean_latency_s": float(np.mean(decode_s)) if decode_s else None,
                }
            )
        )
        return 0 if ok else 1
    print(f"sample {sample.name}: {len(result.report.blocks)} MoE blocks converted")
    for block in result.report.blocks:
        print(f"  {block.name}: {block.num_experts} experts, top-{block.top_k}, {block.shards} shards")
    verdict = "OK" if ok else "MISMATCH"
    print(f"parity with stock ONNX Runtime: max relative error {worst:.2e} (tolerance {PARITY_TOLERANCE:g}) {verdict}")
    print("prompt:")
    print(prefill.format_text())
    if decode_s:
        print(f"decode: {len(decode_s)} single-token steps, mean simulated latency {np.mean(decode_s) * 1e3:.3f} ms")
        print(step_reports[-1].format_text())
    return 0 if ok else 1


def _relative_error(ours, reference) -> float:
    import numpy as np

    scale = float(np.max(np.abs(reference))) or 1.0
    return float(np.max(np.abs(ours - reference))) / scale
