"""``ndp-ep trace-stats FILE``: per-layer routing statistics of a routing trace or a count-only file.

A routing trace (``--save-routing``, docs/trace_format.md) gives, per MoE layer, expert popularity (top-10 % and
top-25 % share), temporal locality (median reuse distance, next-step reuse), an LRU expert cache's hit rate and
the bytes its misses copy (:mod:`hw_model.trace_stats`), then what the simulator's own prefetcher or cache did
when the trace is replayed under the settings that captured it. A count-only JSON file (per-expert selection
counts, e.g. ``../shared/traces/olmoe_expert_counts/expert_counts.json``) gives the popularity figures, with
min / median / max per model. ``--plot FILE.png`` draws a heat map of the selections (matplotlib, the ``plot``
extra); ``--jsonl FILE`` exports a trace as JSON lines.
"""

from __future__ import annotations

import argparse

HELP = "per-layer routing statistics (popularity, reuse distance, cache hit rate, bytes moved) of a routing trace"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ndp_ep.cli_args import add_json_args, output_file

    parser.add_argument("file", help="a routing trace (.npz, from --save-routing) or a count-only JSON file")
    parser.add_argument(
        "--cache-fraction",
        type=float,
        default=0.25,
        metavar="F",
        help="size of the LRU expert cache, as a share (0-1] of each layer's experts",
    )
    parser.add_argument("--plot", type=output_file, metavar="FILE.png", help="draw a heat map of the selections")
    parser.add_argument("--jsonl", type=output_file, metavar="FILE", help="export the trace as JSON lines")
    add_json_args(parser, what="the statistics")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _table(stats, counts_only: bool) -> list[str]:
    from hw_model.units import human_bytes

    if counts_only:
        lines = ["| layer | experts | selections | top 10 % share | top 25 % share |", "|---|---|---|---|---|"]
        for s in stats:
            lines.append(
                f"| {s.name} | {s.num_experts} | {s.selections:,} | {_percent(s.top10_share)} | "
                f"{_percent(s.top25_share)} |"
            )
        return lines
    lines = [
        "| layer | experts | selections | top 10 % | top 25 % | reuse distance (median) | next-step reuse "
        "| LRU hit rate (experts) | LRU miss bytes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in stats:
        reuse = "-" if s.reuse_distance_median is None else f"{s.reuse_distance_median:g} steps"
        lines.append(
            f"| {s.name} | {s.num_experts} | {s.selections:,} | {_percent(s.top10_share)} | "
            f"{_percent(s.top25_share)} | {reuse} | {_percent(s.reuse_next_step_share)} | "
            f"{_percent(s.cache_hit_rate)} ({s.cache_experts}) | {human_bytes(s.cache_miss_bytes or 0)} |"
        )
    return lines


def _is_zip(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def run(args: argparse.Namespace) -> int:
    import json

    from hw_model.errors import TraceFormatError
    from hw_model.trace_stats import count_stats, load_count_file, summarise, trace_stats
    from ndp_io import check_no_clobber

    if not 0.0 < args.cache_fraction <= 1.0:
        raise TraceFormatError(f"--cache-fraction must be in (0, 1], got {args.cache_fraction}")
    check_no_clobber([args.plot, args.jsonl], [args.file])
    trace = None
    if _is_zip(args.file) or args.file.lower().endswith(".npz"):
        from hw_model.routing_trace_io import load_captured

        trace = load_captured(args.file)
        stats = trace_stats(trace, args.cache_fraction)
        summary = summarise(stats)
        counts = None
    else:
        counts = load_count_file(args.file)
        stats = count_stats(counts)
        summary = summarise(stats, group_of_path=True)
        if args.jsonl:
            raise TraceFormatError("--jsonl exports a routing trace; a count-only file has no steps")
    simulated = _replayed(trace) if trace is not None else None
    if args.jsonl and trace is not None:
        from hw_model.routing_trace_io import export_jsonl

        export_jsonl(trace, args.jsonl)
    if args.plot:
        from hw_model.trace_plots import plot_counts, plot_trace

        try:
            plot_trace(trace, args.plot) if trace is not None else plot_counts(counts, args.plot)
        except ImportError:
            raise TraceFormatError("--plot needs matplotlib: pip install 'ndp-ep[plot]'") from None
    if args.json:
        doc = {"file": args.file, "layers": [s.to_json() for s in stats], "summary": summary}
        if trace is not None:
            doc["header"] = trace.header.to_json()
            doc["simulated"] = simulated
        print(json.dumps(doc))
        return 0
    if trace is not None:
        h = trace.header
        print(
            f"{args.file}: {len(h.layers)} MoE layers, {trace.num_steps} steps ({h.prompt_tokens} prompt tokens, "
            f"{h.new_tokens} new), captured by {h.source or 'unknown'} on {h.settings.get('hw')}"
        )
    for line in _table(stats, counts_only=trace is None):
        print(line)
    for group, values in summary.items():
        print(
            f"{group}: the top 10 % of experts take {_percent(values['top10_min'])} to {_percent(values['top10_max'])} "
            f"of selections (median {_percent(values['top10_median'])}), the top 25 % {_percent(values['top25_min'])}"
            f" to {_percent(values['top25_max'])}, over {int(values['layers'])} layers"
        )
    if simulated:
        print("replayed under its own settings: " + ", ".join(f"{k} {v}" for k, v in simulated.items()))
    return 0


def _replayed(trace) -> dict[str, str] | None:
    """What the simulator's prefetcher (or cache) did over the trace, replayed under its capturing settings."""
    from hw_model.errors import HwModelError
    from hw_model.trace_replay import replay
    from hw_model.units import human_bytes

    try:
        summary = replay(trace).summary
    except HwModelError:  # a hardware file the capture named is gone: the trace's own figures still stand
        return None
    out = {
        "policy": str(summary["policy"]),
        "host-to-GPU bytes": human_bytes(summary["host_to_gpu_bytes"]),
        "on-demand weight bytes": human_bytes(summary["on_demand_weight_bytes"]),
    }
    for prefix in ("prefetch", "cache"):  # the prefetcher's when the policy has one, else the cache's
        if f"{prefix}_hit_rate" in summary:
            out[f"{prefix} hit rate"] = _percent(summary[f"{prefix}_hit_rate"])
            out[f"{prefix} bytes moved"] = human_bytes(summary[f"{prefix}_bytes_moved"])
            break
    return out
