"""`ndp-ep diff A.onnx B.onnx`: semantic diff of two ONNX models, with exit codes like diff(1).

Exit 0 when the graphs are equivalent (renames only), 1 when they differ, 2 on bad input (raised as
ndp_ep.errors.ModelLoadError / DiffOutputError and printed by the CLI dispatcher as one line).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HELP = "semantic diff of two ONNX models (nodes, initializers, opsets, ndp-ep MoE rewrites)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_a", metavar="A.onnx", help="the model before (for instance the original)")
    parser.add_argument("model_b", metavar="B.onnx", help="the model after (for instance the ndp-ep conversion)")
    parser.add_argument("--json", action="store_true", help="print the ndp-ep.diff/1 JSON document instead of text")
    parser.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report to FILE")
    parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the text output (auto: only on a terminal and when NO_COLOR is unset)",
    )
    parser.add_argument(
        "--max-items", type=int, default=50, metavar="N", help="list at most N entries per text section (0: all)"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing; only the exit code tells")


def _write_atomically(path: Path, text: str) -> None:
    from ndp_ep.errors import NdpEpError

    directory = path.resolve().parent
    if not directory.is_dir():
        raise NdpEpError(f"cannot write {path}: directory {directory} does not exist")
    handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise


def run(args: argparse.Namespace) -> int:
    from ndp_ep.diff import diff_models, render_html, render_json, render_text, to_json_document
    from ndp_ep.errors import NdpEpError

    if args.max_items < 0:
        raise NdpEpError(f"--max-items must be >= 0, got {args.max_items}")
    if args.html:  # no-clobber (ndp_io), before any work: neither model nor their data files
        from graph_passes.model_io import model_files
        from ndp_io import check_no_clobber, check_output_path

        check_output_path(args.html)
        check_no_clobber([args.html], [*model_files(args.model_a), *model_files(args.model_b)])
    result = diff_models(args.model_a, args.model_b)
    if args.html:
        _write_atomically(Path(args.html), render_html(result, to_json_document(result)))
    if not args.quiet:
        if args.json:
            sys.stdout.write(render_json(result))
        else:
            colour = args.color == "always" or (
                args.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
            )
            sys.stdout.write(render_text(result, colour=colour, max_items=args.max_items))
    return 0 if result.equivalent else 1
