"""`ndp-ep diff A.onnx B.onnx`: semantic diff of two ONNX models, with exit codes like diff(1).

The output formats (``--format``) are the renderer modules ndp_ep/diff/render_<format>.py, found at start-up
(ndp_ep.diff.renderers); ``--json`` is ``--format json``, ``--json-out FILE`` and ``--html FILE`` also write
the json / html rendering to a file.

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
    from ndp_ep.diff.renderers import renderers

    formats = renderers()
    parser.add_argument("model_a", metavar="A.onnx", help="the model before (for instance the original)")
    parser.add_argument("model_b", metavar="B.onnx", help="the model after (for instance the ndp-ep conversion)")
    parser.add_argument(
        "--format",
        choices=tuple(formats),
        default=None,
        help="what to print (default text): " + "; ".join(f"{name}: {r.description}" for name, r in formats.items()),
    )
    add_json_args(parser, what="the ndp-ep.diff/1 document", file_option=True)
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
    from ndp_ep.diff import RenderOptions, diff_models, renderers
    from ndp_ep.errors import NdpEpError
    from ndp_ep.text import unescaped
    from ndp_io import check_no_clobber, write_text

    if args.json and args.format not in (None, "json"):
        raise NdpEpError(f"--json prints the json format; it cannot go with --format {args.format}")
    files = {name: path for name, path in (("html", args.html), ("json", args.json_out)) if path}
    if files:  # never clobber an input (either model or their data files), checked before any work
        check_no_clobber(list(files.values()), [*model_files(args.model_a), *model_files(args.model_b)])
    result = diff_models(args.model_a, args.model_b)
    formats = renderers()
    for name, path in files.items():
        write_text(path, formats[name].render(result, RenderOptions(max_items=args.max_items)))
    if not args.quiet:
        colour = args.color == "always" or (
            args.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        )
        chosen = "json" if args.json else args.format or "text"
        stream = unescaped(sys.stdout) if chosen == "text" else sys.stdout  # the text renderer escapes itself
        stream.write(formats[chosen].render(result, RenderOptions(colour=colour, max_items=args.max_items)))
    return 0 if result.equivalent else 1
