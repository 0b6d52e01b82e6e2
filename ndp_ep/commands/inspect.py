"""``ndp-ep inspect MODEL``: a dry run of ``convert`` listing the MoE blocks it would rewrite or skip.

Runs detection, planning, the numeric check and the rewrite exactly as ``convert`` does
(:func:`graph_passes.convert.convert`, in memory: the new weights are never produced) and writes nothing, so each
block's count of nodes replaced is the one ``convert`` prints (the nodes the rule matched and the side nodes that
only fed them, which the rewrite drops with the block).
"""

from __future__ import annotations

import argparse
import json

HELP = "list the MoE blocks convert would rewrite or skip (experts, top-k, shapes, weight dtype), writing nothing"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="ONNX model")
    from ndp_ep.cli_args import add_json_args, add_shards_arg

    add_shards_arg(parser, purpose="shards per expert to plan for", default="4")
    add_json_args(parser, what="the blocks that would be rewritten or skipped")


def run(args: argparse.Namespace) -> int:
    from graph_passes.convert import DEFAULT_SHARDS, convert
    from ndp_ep.commands.convert import print_report_lines
    from ndp_ep.errors import graph_pass_errors
    from ndp_ep.text import plural

    shards = args.shards if args.shards is not None else DEFAULT_SHARDS
    with graph_pass_errors():
        _rewritten, report = convert(args.model, shards=shards)
    if args.json:
        print(json.dumps({"model": args.model, "shards": shards, **report.to_json()}))
        return 0
    print(f"{args.model}: {plural(len(report.blocks), 'MoE block')} would be rewritten, {len(report.skipped)} skipped")
    print_report_lines(report, _rewrite_line, "skip")
    return 0


def _rewrite_line(block) -> str:
    """A block ``convert`` would rewrite, with the rule that found it and how its reading was proven."""
    from ndp_ep.commands.convert import describe_block

    if block.checked_in_isolation:
        proof = "proven on its own region"
    elif block.checked_numerically:
        proof = "proven on a whole-model run"
    else:
        proof = "accepted on structure (too large to run)"
    return f"rewrite {block.name}: {describe_block(block)}, rule {block.rule}, {proof}"
