"""``ndp-ep convert IN.onnx -o OUT.onnx``: rewrite MoE blocks into sharded expert ops.

Prints what was converted, skipped or left alone; a model with nothing to convert (no MoE block, or one
already converted) is said in words and still written unchanged, except under ``--strict``, which makes
"nothing converted" an error (exit 2, nothing written).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ndp_ep.cli_args import add_hardware_args, add_json_args, add_shards_arg, output_file

HELP = "convert an ONNX MoE model into one with tensor-parallel sharded expert ops"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="input ONNX model")
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        type=output_file,
        metavar="OUT.onnx",
        help="output ONNX model; the weights go to OUT.onnx.data when the input used external data, they "
        "exceed 1.8 GB, or --external-data is given",
    )
    add_hardware_args(parser)
    add_shards_arg(parser)
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 2, writing nothing, if any MoE block is skipped or nothing is converted (no MoE block found, "
        "or the model is already converted)",
    )
    parser.add_argument(
        "--external-data", action="store_true", default=None, help="always write the weights to OUT.onnx.data"
    )
    parser.add_argument(
        "--prove-every-block",
        action="store_true",
        help="run the numeric proof on every MoE block (default: once per block signature, the other blocks with "
        "that signature covered by it once their shards prove to be byte views of their own weights)",
    )
    add_json_args(parser, what="the conversion report")


def describe_block(block) -> str:
    """One block of a conversion report in words (``convert`` and ``inspect`` print it)."""
    from ndp_ep.text import plural

    quant = f" (blocks of {block.quant_block_size})" if block.quant_block_size else ""
    return (
        f"{plural(block.num_experts, 'expert')}, top-{block.top_k}, hidden {block.hidden}, ffn {block.ffn}, "
        f"{block.weight_dtype}{quant} weights, {block.activation}, {plural(block.shards, 'shard')}, "
        f"{plural(block.replaced_nodes, 'node')} replaced"
    )


def print_report_lines(report, block_line: Callable[[Any], str], skipped: str) -> None:
    """The indented lines of a conversion report (``convert`` and ``inspect`` print them): ``block_line`` of each
    rewritten block, each skipped candidate (introduced by the word ``skipped``) with its reason, each note."""
    for block in report.blocks:
        print(f"  {block_line(block)}")
    for skip in report.skipped:
        print(f"  {skipped} {skip.where}: {skip.reason}")
    for note in report.notes:
        print(f"  note: {note}")


def run(args: argparse.Namespace) -> int:
    from graph_passes.sharded_op import DOMAIN, OP_TYPE
    from ndp_ep.cli_args import settings_from_args
    from ndp_ep.convert import convert_model
    from ndp_ep.text import plural

    output = Path(args.output)
    result = convert_model(
        args.model,
        output,
        settings=settings_from_args(args),
        shards=args.shards,
        strict=args.strict,
        external_data=args.external_data,
        prove_every_block=args.prove_every_block,
    )
    if args.json:
        print(json.dumps({"input": args.model, "output": args.output, **result.to_json()}))
        return 0
    report = result.report
    print(f"wrote {', '.join(str(f) for f in result.files)}")
    system = f"{result.system.name} with {plural(result.system.num_ndp_units, 'NDP unit')}"
    if report.blocks:
        print(f"converted {plural(len(report.blocks), 'MoE block')} into sharded expert ops (placed for {system}):")
    elif result.already_converted:
        ops = plural(result.already_converted, f"{DOMAIN}::{OP_TYPE} node")
        print(
            f"nothing to do: {args.model} is already converted ({ops}); "
            "the copy is unchanged (--strict would make this an error)"
        )
    elif not report.skipped:
        print(
            f"nothing to do: no MoE block found in {args.model}; the copy is unchanged and runs as before "
            "(--strict would make this an error)"
        )
    else:
        print(f"no MoE block converted: {plural(len(report.skipped), 'candidate')} skipped (--strict makes this fail):")
    print_report_lines(report, lambda block: f"{block.name}: {describe_block(block)}", "skipped")
    return 0
