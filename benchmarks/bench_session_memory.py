"""A long session stays bounded: memory growth and per-run time over many decode runs of one session.

    python benchmarks/bench_session_memory.py [--runs 30000] [--read-every 1]

Runs one-token decode steps of ``sample_models/moe_decoder.onnx`` through one ``ndp_ep.InferenceSession``,
reading ``last_report`` every ``--read-every`` runs (so every run is simulated), and prints the resident-set
growth after a warm-up and the median per-run time (run + report) of the first and the last thousand runs.
Goal (reliability issue): within a few MB and a constant per-run time at 30,000 runs.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ndp_ep  # noqa: E402

WARMUP_RUNS = 500
WINDOW = 1000


def rss_mib() -> float:
    """Current resident set size in MiB (from /proc; ru_maxrss is the peak, not the current size)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        return pages * resource.getpagesize() / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30_000)
    parser.add_argument("--read-every", type=int, default=1, help="read last_report every N runs")
    args = parser.parse_args()
    session = ndp_ep.InferenceSession(ROOT / "sample_models" / "moe_decoder.onnx", hw="paper")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 100, size=(args.runs + WARMUP_RUNS, 1, 1), dtype=np.int64)
    times: list[float] = []
    rss_after_warmup = 0.0
    for i, token in enumerate(ids):
        start = time.perf_counter()
        session.run(None, {"input_ids": token})
        if i % args.read_every == 0:
            assert session.last_report is not None
        times.append(time.perf_counter() - start)
        if i == WARMUP_RUNS - 1:
            rss_after_warmup = rss_mib()
    rss_end = rss_mib()
    measured = times[WARMUP_RUNS:]
    first = statistics.median(measured[:WINDOW]) * 1e6
    last = statistics.median(measured[-WINDOW:]) * 1e6
    print(f"{args.runs} one-token runs after {WARMUP_RUNS} warm-up runs; last_report read every {args.read_every}")
    print(f"reports kept: {len(session.reports)} (ring), runs counted: {session.aggregates.runs}")
    print(
        f"RSS after warm-up {rss_after_warmup:.1f} MiB, at the end {rss_end:.1f} MiB: "
        f"{rss_end - rss_after_warmup:+.1f} MiB"
    )
    print(
        f"median per-run time (run + report): first {WINDOW} {first:.0f} us, last {WINDOW} {last:.0f} us "
        f"(ratio {last / first:.2f})"
    )


if __name__ == "__main__":
    main()
