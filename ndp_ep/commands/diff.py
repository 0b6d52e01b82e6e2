"""`ndp-ep diff A.onnx B.onnx`: semantic diff of two ONNX models, with exit codes like diff(1).

Exit 0 when the graphs are equivalent (renames only), 1 when they differ, 2 on bad input (raised as
ndp_ep.errors.ModelLoadError / DiffOutputError and printed by the CLI dispatcher as one line).
"""

from __future__ import annotations

import argparse
import os
import sys

from ndp_ep.cli_args import add_json_args, bounded_int, output_file

HELP = "semantic diff of two ONNX models (nodes, initializers, opsets, ndp-ep MoE rewrites)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_a", metavar="A.onnx", help="the model before (for instance the original)")
    parser.add_argument("model_b", metavar="B.onnx", help="the model after (for instance the ndp-ep conversion)")
    add_json_args(parser, what="the ndp-ep.diff/1 document (instead of text)", file_option=True)
    parser.add_argument(
        "--html", type=output_file, metavar="FILE", help="also write a self-contained HTML report to FILE"
    )
    parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the text output (auto: only on a terminal and when NO_COLOR is unset)",
    )
    parser.add_argument(
        "--max-items",
        type=bounded_int(0),
        default=50,
        metavar="N",
        help="list at most N entries per text section (0: all)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing; only the exit code tells")


def run(args: argparse.Namespace) -> int:
    from graph_passes.model_io import model_files
    from ndp_ep.diff import diff_models, render_html, render_json, render_text, to_json_document
    from ndp_io import check_no_clobber, write_text

    outputs = [args.html, args.json_out]
    if any(outputs):  # never clobber an input (either model or their data files), checked before any work
        check_no_clobber(outputs, [*model_files(args.model_a), *model_files(args.model_b)])
    result = diff_models(args.model_a, args.model_b)
    if args.html:
        write_text(args.html, render_html(result, to_json_document(result)))
    if args.json_out:
        write_text(args.json_out, render_json(result))
    if not args.quiet:
        if args.json:
            sys.stdout.write(render_json(result))
        else:
            colour = args.color == "always" or (
                args.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
            )
            sys.stdout.write(render_text(result, colour=colour, max_items=args.max_items))
    return 0 if result.equivalent else 1
