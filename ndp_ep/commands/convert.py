"""``ndp-ep convert IN.onnx -o OUT.onnx``: rewrite MoE blocks into sharded expert ops."""

from __future__ import annotations

import argparse
import json

HELP = "convert an ONNX MoE model into one with tensor-parallel sharded expert ops"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="input ONNX model")
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        help="output ONNX model; weights go to OUT.onnx.data when the input used external data, "
        "they exceed 1.8 GB, or --external-data is given",
    )
    parser.add_argument("--hw", default="paper", help="hardware preset (paper, edge, h200) or TOML file")
    parser.add_argument("--ndp-units", type=int, default=None, help="override the preset's NDP unit count")
    parser.add_argument("--shards", type=int, default=None, help="shards per expert (default: NDP units)")
    parser.add_argument("--strict", action="store_true", help="fail (exit 2) if any MoE block is skipped")
    parser.add_argument("--external-data", action="store_true", default=None, help="always write weights to OUT.data")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run(args: argparse.Namespace) -> int:
    from ndp_ep.convert import convert_model

    result = convert_model(
        args.model,
        args.output,
        hw=args.hw,
        ndp_units=args.ndp_units,
        shards=args.shards,
        strict=args.strict,
        external_data=args.external_data,
    )
    if args.json:
        print(json.dumps({"input": args.model, "output": args.output, **result.to_json()}))
        return 0
    report = result.report
    print(f"wrote {', '.join(str(f) for f in result.files)}")
    print(f"{len(report.blocks)} MoE block(s) rewritten into sharded expert ops:")
    for block in report.blocks:
        print(
            f"  {block.name}: {block.num_experts} experts, top-{block.top_k}, hidden {block.hidden}, "
            f"ffn {block.ffn}, {block.activation}, {block.shards} shards, {block.replaced_nodes} nodes replaced"
        )
    for skip in report.skipped:
        print(f"  skipped {skip.where}: {skip.reason}")
    for note in report.notes:
        print(f"  note: {note}")
    return 0
