"""`ndp-ep bench`: trace-driven comparison of the scheduling policies on a GPU + NDP platform.

Prints the end-to-end latency table (model x NDP count x policy, speedup over the strongest baseline of each
row) and the sweeps as markdown on stdout, a progress bar on stderr, and writes PNG plots to ``--out``
(matplotlib, the ``plot`` extra), the table as JSON records with ``--json`` and the markdown with
``--markdown``.
"""

from __future__ import annotations

import argparse
import os
import sys

from ndp_ep.cli_args import MAX_NDP_UNITS, bounded_int

HELP = "compare MoE scheduling policies (ours vs baselines) on simulated GPU + NDP hardware from routing traces"
_unit_count = bounded_int(1, MAX_NDP_UNITS)  # each count is checked as --ndp-units is everywhere else


def _unit_counts(text: str) -> tuple[int, ...]:
    values = tuple(_unit_count(part) for part in text.split(",") if part.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated NDP-unit counts, got {text!r}")
    return values


def _str_list(text: str) -> tuple[str, ...]:
    values = tuple(part.strip() for part in text.split(",") if part.strip())
    if not values:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hw_model.models import MODELS
    from hw_model.policies import policy_names
    from ndp_ep.cli_args import (
        add_hardware_args,
        add_json_args,
        bounded_int,
        default_jobs,
        jobs_arg,
        output_dir,
        output_file,
    )

    add_hardware_args(parser, units=False)
    from ndp_ep.cli_args import add_placement_arg

    add_placement_arg(parser)
    parser.add_argument(
        "--ndp-units",
        type=_unit_counts,
        default=None,
        metavar="N[,N...]",
        help=f"NDP-unit counts, each 1-{MAX_NDP_UNITS}, e.g. 2,4,6 (default: the preset's list)",
    )
    parser.add_argument(
        "--models",
        type=_str_list,
        default=None,
        help=f"comma-separated models ({', '.join(MODELS)}); default all",
    )
    parser.add_argument(
        "--policies",
        type=_str_list,
        default=None,
        help=f"comma-separated policies ({', '.join(policy_names())}); default all",
    )
    parser.add_argument(
        "--skew",
        default="typical,low,high",
        help="routing-skew levels calibrated per model: the first is the main table's, the others are swept at "
        "4 NDP units; or one Zipf exponent used for every model",
    )
    parser.add_argument("--locality", type=float, default=0.0, help="temporal locality of the synthetic trace (0-1)")
    parser.add_argument(
        "--shift-at", type=float, default=0.5, help="fraction of decode after which the domain shifts; -1: none"
    )
    parser.add_argument(
        "--trace",
        default=None,
        help="routing trace file instead of synthetic traces: a captured one (--save-routing: the model's own shapes "
        "and routing, benched at each NDP count and policy) or a token trace (.npz/.json) for the built-in models",
    )
    parser.add_argument(
        "--model-from",
        default=None,
        metavar="MODEL.onnx",
        help="bench this model's MoE shapes (converted, or converted in memory) with synthetic routing at the "
        "calibrated skew instead of the built-in models",
    )
    parser.add_argument("--seed", type=bounded_int(0), default=0, help="seed of the synthetic routing traces")
    parser.add_argument(
        "--out", type=output_dir, default=None, help="directory for PNG plots and sweeps.json (default: none written)"
    )
    add_json_args(parser, what="the main table's records", file_option=True)
    parser.add_argument("--markdown", type=output_file, default=None, help="also write the tables (markdown) to FILE")
    parser.add_argument(
        "--trace-dir", type=output_dir, default=None, help="write the Gantt timelines as Chrome trace JSON (Perfetto)"
    )
    parser.add_argument("--jobs", type=jobs_arg, default=default_jobs(), help="parallel worker processes")
    parser.add_argument("--no-sweeps", action="store_true", help="only the main table")
    parser.add_argument("--no-plots", action="store_true", help="do not write PNG plots even with --out")
    parser.add_argument("--quick", action="store_true", help="tiny run (32 prompt + 8 generated tokens, no sweeps)")


def _skew_levels(skew: str) -> tuple[tuple[str, ...], float | None]:
    """``--skew``: calibrated levels (the first is the main table's), or one Zipf exponent for every model."""
    from hw_model.errors import WorkloadError
    from hw_model.traces import DEFAULT_SKEW_LEVELS

    parts = _str_list(skew)
    if all(p in DEFAULT_SKEW_LEVELS for p in parts):
        return tuple(parts), None
    try:
        return ("typical",), float(skew)
    except ValueError:
        raise WorkloadError(
            f"--skew must be levels from {', '.join(DEFAULT_SKEW_LEVELS)} or a number, got {skew!r}"
        ) from None


def _tables_text(records: list[dict]) -> str:
    """The main table, then the bound, energy and sweep tables the records carry."""
    from hw_model.bench_energy_tables import format_energy_table
    from hw_model.bench_tables import format_bound_table, format_sweeps, format_table

    parts = [format_table(records), format_bound_table(records), format_energy_table(records), format_sweeps(records)]
    return "\n\n".join(part for part in parts if part)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from hw_model.bench import BenchConfig, ProgressBar, quick_config, records_for_json, run_bench, write_json_atomic
    from hw_model.models import MODELS
    from hw_model.policies import POLICIES
    from hw_model.settings import SimulationSettings
    from ndp_io import check_no_clobber, write_text

    # --hw first: one clear error for a bad preset name or TOML file (each job's settings add units and a policy)
    system = SimulationSettings(hw=args.hw).system
    out_dir = Path(args.out) if args.out else None
    sweeps_file = out_dir / "sweeps.json" if out_dir else None
    check_no_clobber(
        [args.json_out, args.markdown, sweeps_file], [args.trace, args.hw, args.model_from, args.placement]
    )
    if args.placement:  # checked once, before any work (each job loads it again)
        SimulationSettings(hw=args.hw, placement=args.placement)
    ndp_units = args.ndp_units or system.supported_ndp_units or (2, 4, 6)
    from ndp_ep.trace_bench import is_captured_trace

    if args.model_from or (args.trace and is_captured_trace(args.trace)):  # one model's own shapes
        return _run_one_model(args, tuple(ndp_units))
    skew_levels, skew_override = _skew_levels(args.skew)
    default_units = 4 if 4 in ndp_units else ndp_units[0]
    config = BenchConfig(
        hw=args.hw,
        ndp_units=tuple(ndp_units),
        models=args.models or tuple(MODELS),
        policies=args.policies or POLICIES,
        skew_levels=skew_levels,
        skew_override=skew_override,
        locality=args.locality,
        shift_at=None if args.shift_at < 0 else args.shift_at,
        trace_file=args.trace,
        placement=args.placement,
        seed=args.seed,
        sweeps=not args.no_sweeps,
        default_units=default_units,
    )
    if args.quick:
        config = quick_config(config)
    if args.trace:
        from hw_model.traces import load_trace

        load_trace(args.trace)
    records, gantt = run_bench(config, jobs_in_parallel=args.jobs, progress=ProgressBar())
    text = _tables_text(records)
    table_records = records_for_json(records)
    if args.json:
        print(json.dumps(table_records))
    else:
        print(text)
    if args.markdown:
        write_text(args.markdown, text + "\n")
    if args.json_out:
        write_json_atomic(args.json_out, table_records)
    sweep_records = [r for r in records if r["section"] != "main"]
    if out_dir is not None and sweep_records:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(sweeps_file, sweep_records)
    if args.trace_dir:
        from hw_model.chrome_trace import write_bench_traces

        Path(args.trace_dir).mkdir(parents=True, exist_ok=True)
        written = write_bench_traces(gantt, args.trace_dir, ndp_units=default_units)
        print(f"traces: {', '.join(str(p) for p in written)}", file=sys.stderr)
    if out_dir is not None and not args.no_plots:
        try:
            from hw_model.bench_plots import make_plots

            written = make_plots(records, gantt, out_dir, default_units)
        except ImportError:
            print(
                "ndp-ep bench: warning: matplotlib is not installed, plots skipped (pip install 'ndp-ep[plot]')",
                file=sys.stderr,
            )
        else:
            print(f"plots: {', '.join(str(p) for p in written)}", file=sys.stderr)
    return 0


def _run_one_model(args: argparse.Namespace, ndp_units: tuple[int, ...]) -> int:
    """``--trace CAPTURED.npz`` or ``--model-from MODEL.onnx`` (ndp_ep/trace_bench.py): the main table of one
    model's own shapes at each NDP count and policy."""
    import json

    from hw_model.bench import write_json_atomic
    from hw_model.errors import WorkloadError
    from hw_model.policies import POLICIES
    from hw_model.traces import DEFAULT_SKEW_LEVELS
    from ndp_ep.trace_bench import model_name_of, run_model_bench, trace_from_model
    from ndp_io import write_text

    if args.model_from and args.trace:
        raise WorkloadError("--trace and --model-from each name the model to bench: give one")
    if args.models:
        raise WorkloadError("--models names built-in models; --trace CAPTURED.npz and --model-from bench their own")
    ignored = [flag for flag, value in (("--out", args.out), ("--trace-dir", args.trace_dir)) if value]
    if ignored:  # the sweeps, plots and Gantt timelines are the built-in models' bench
        from ndp_ep.cli import warn

        warn("bench", f"{' and '.join(ignored)} not written for one model's own shapes (only the main table)")
    policies = args.policies or POLICIES
    if args.trace:
        from hw_model.routing_trace_io import load_captured

        trace, notes = load_captured(args.trace), []
        name = model_name_of(trace.header, "captured")
    else:
        from hw_model.settings import SimulationSettings

        parts = _str_list(args.skew)
        level = parts[0] if parts[0] in DEFAULT_SKEW_LEVELS else "typical"
        skew = None if parts[0] in DEFAULT_SKEW_LEVELS else float(parts[0])
        prompt, new = (32, 8) if args.quick else (512, 512)
        settings = SimulationSettings(hw=args.hw, ndp_units=ndp_units[0], placement=args.placement)
        trace, notes = trace_from_model(
            args.model_from, settings, prompt_tokens=prompt, new_tokens=new, level=level, skew=skew, seed=args.seed
        )
        name = os.path.splitext(os.path.basename(args.model_from))[0]
        if name == "model":  # a GenAI folder's model.onnx: the folder names it
            name = os.path.basename(os.path.dirname(os.path.abspath(args.model_from)))
    done = run_model_bench(args, trace, name, notes, ndp_units, policies)
    if args.json:
        print(json.dumps(done["records"]))
    else:
        print(done["text"])
    if args.markdown:
        write_text(args.markdown, done["text"] + "\n")
    if args.json_out:
        write_json_atomic(args.json_out, done["records"])
    return 0
