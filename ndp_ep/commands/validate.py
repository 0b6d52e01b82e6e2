"""`ndp-ep validate`: compare the timing model with measured kernel/transfer times and simulated DRAM runs.

    ndp-ep validate                                   # every calibration CSV shipped in hw_model/calibration
    ndp-ep validate --hw h200 --data hw_model/calibration/h200/expert_ffn.csv \\
        [--transfers hw_model/calibration/h200/transfers.csv] [--plot scatter.png] [--json]
    ndp-ep validate --data hw_model/calibration/ndp_dram/size_sweep_raw.csv   # DRAM rows: no --hw needed

Each CSV's header says what it holds (see hw_model.validate): kernel or transfer rows are predicted on the
``--hw`` preset; DRAM size-sweep and contention rows (Ramulator2) by the JEDEC-derived model of
hw_model.dram. Prints the median and maximum relative error per row kind; ``--json`` prints
``{"kinds": {KIND: {"rows": n, "median_rel_err": x, "max_rel_err": y, ...}}, ...}``.
Bad input (missing file, wrong columns, unknown kind) is a one-line error and exit code 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = "check the timing model against measured kernel/transfer times and simulated DRAM runs"
CALIBRATION_DIR = Path(__file__).resolve().parents[2] / "hw_model" / "calibration"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ndp_ep.cli_args import add_hardware_args, output_file

    add_hardware_args(parser, default_hw="h200", units=False)
    parser.add_argument(
        "--data",
        metavar="CSV",
        action="append",
        default=[],
        help="measured rows: kernel CSV (kind,dtype,d,f,tokens,shards,median_us,...), transfer CSV "
        "(direction,memory,bytes,median_us,...) or a DRAM calibration CSV (size sweep, contention, or DRAMPower "
        "stream energies); may be "
        "repeated; default: every CSV shipped in hw_model/calibration",
    )
    parser.add_argument(
        "--transfers", metavar="CSV", action="append", default=[], help="host<->device transfer CSV (same as --data)"
    )
    parser.add_argument(
        "--plot", type=output_file, metavar="FILE.png", help="also write a predicted-vs-measured scatter plot (PNG)"
    )
    parser.add_argument("--json", action="store_true", help="print the statistics as JSON on stdout")
    parser.add_argument(
        "--keep-inconsistent",
        action="store_true",
        help="count rows contradicted by a faster run with more work in the statistics (excluded by default)",
    )


def default_data() -> list[str]:
    """The calibration CSVs shipped with the package (kernel, transfer and DRAM rows)."""
    names = (
        "h200/expert_ffn.csv",
        "h200/transfers.csv",
        "ndp_dram/size_sweep_raw.csv",
        "ndp_dram/contention.csv",
        "dram_energy/streams.csv",
    )
    return [str(CALIBRATION_DIR / name) for name in names if (CALIBRATION_DIR / name).is_file()]


def run(args: argparse.Namespace) -> int:
    from hw_model.errors import CalibrationDataError, HwModelError
    from hw_model.hardware import load_system
    from hw_model.validate import (
        csv_layout,
        format_dram_report,
        format_report,
        load_measurements,
        validate,
        validate_dram,
        write_scatter_png,
    )
    from ndp_io import check_no_clobber

    paths = [*args.data, *args.transfers] or default_data()
    check_no_clobber([args.plot], [*paths, args.hw])  # before any work
    if not paths:
        raise CalibrationDataError("nothing to validate: give --data CSV and/or --transfers CSV")
    for path in paths:
        if not Path(path).is_file():
            raise CalibrationDataError(
                f"{path}: {'a directory, not a CSV file' if Path(path).is_dir() else 'no such file'}"
            )
    layouts = {path: csv_layout(path) for path in paths}
    timing = [p for p in paths if layouts[p] in ("kernel", "transfer")]
    dram = [p for p in paths if layouts[p] not in ("kernel", "transfer")]
    payload: dict = {"data": paths, "kinds": {}}
    texts = []
    if timing:
        system = load_system(args.hw)
        rows = [row for path in timing for row in load_measurements(path)]
        report = validate(system, rows, sources=timing, exclude_inconsistent=not args.keep_inconsistent)
        plot_written = False
        if args.plot:
            try:
                write_scatter_png(report, args.plot)
                plot_written = True
            except HwModelError as exc:  # matplotlib missing: the statistics are still the answer
                import sys

                print(f"ndp-ep validate: warning: {exc}; plot skipped", file=sys.stderr)
        timing_json = report.to_json_dict()
        payload["hardware"] = timing_json["hardware"]
        payload["kinds"].update(timing_json["kinds"])
        payload["excluded"] = timing_json["excluded"]
        texts.append(format_report(report))
    if dram:
        dram_report = validate_dram(dram)
        payload["kinds"].update({kind: stats.to_dict() for kind, stats in dram_report.kinds.items()})
        texts.append(format_dram_report(dram_report))
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        print("\n\n".join(texts))
        if timing and plot_written:
            print(f"scatter plot: {args.plot}")
    return 0
