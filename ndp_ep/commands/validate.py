"""`ndp-ep validate`: compare the cost model with kernel and transfer times measured on a real GPU.

    ndp-ep validate --hw h200 --data ../shared/calibration/h200/expert_ffn.csv \\
        [--transfers ../shared/calibration/h200/transfers.csv] [--plot scatter.png] [--json]

Prints the median and maximum relative error per row kind (see hw_model.validate for the CSV layouts);
``--json`` prints ``{"kinds": {KIND: {"rows": n, "median_rel_err": x, "max_rel_err": y, ...}}, ...}``.
Bad input (missing file, wrong columns, unknown kind) is a one-line error and exit code 2.
"""

from __future__ import annotations

import argparse
import json

HELP = "check the timing model against measured kernel/transfer times (median and max error per kind)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hw", default="h200", help="hardware preset name or TOML file (default: h200)")
    parser.add_argument(
        "--data",
        metavar="CSV",
        action="append",
        default=[],
        help="measured rows: kernel CSV (kind,dtype,d,f,tokens,shards,median_us,...) or transfer CSV "
        "(direction,memory,bytes,median_us,...); may be repeated",
    )
    parser.add_argument(
        "--transfers", metavar="CSV", action="append", default=[], help="host<->device transfer CSV (same as --data)"
    )
    parser.add_argument("--plot", metavar="FILE.png", help="also write a predicted-vs-measured scatter plot (PNG)")
    parser.add_argument("--json", action="store_true", help="print the statistics as JSON on stdout")
    parser.add_argument(
        "--keep-inconsistent",
        action="store_true",
        help="count rows contradicted by a faster run with more work in the statistics (excluded by default)",
    )


def run(args: argparse.Namespace) -> int:
    from hw_model.errors import CalibrationDataError
    from hw_model.hardware import load_system
    from hw_model.validate import format_report, load_measurements, validate, write_scatter_png

    paths = [*args.data, *args.transfers]
    if not paths:
        raise CalibrationDataError("nothing to validate: give --data CSV and/or --transfers CSV")
    system = load_system(args.hw)
    rows = [row for path in paths for row in load_measurements(path)]
    report = validate(system, rows, sources=paths, exclude_inconsistent=not args.keep_inconsistent)
    if args.plot:
        write_scatter_png(report, args.plot)
    if args.json:
        print(json.dumps(report.to_json_dict(), indent=2))
    else:
        print(format_report(report))
        if args.plot:
            print(f"scatter plot: {args.plot}")
    return 0
