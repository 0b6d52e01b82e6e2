"""What routing capture costs a session: runs plus their reports with capture off and on, alternating.

    python benchmarks/bench_routing_capture.py [--repeats 300] [--tokens 1 16]

Two ``ndp_ep.InferenceSession`` on ``sample_models/moe_decoder.onnx`` (converted in memory), one created with
``capture_routing=True``; each iteration runs both (order alternating) on the same feeds and reads each one's
``last_report`` (what builds the report, and the capture's step). Prints the median time per run + report of each
and their ratio (capture on / off), and the capture's memory held in memory and spooled after the runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--tokens", nargs="*", type=int, default=[1, 16])
    args = parser.parse_args()
    import numpy as np

    import ndp_ep

    model = ROOT / "sample_models" / "moe_decoder.onnx"
    sessions = {
        "off": ndp_ep.InferenceSession(model),
        "on": ndp_ep.InferenceSession(model, capture_routing=True),
    }
    for tokens in args.tokens:
        feeds = {"input_ids": np.arange(tokens, dtype=np.int64)[None] % 100}
        times: dict[str, list[float]] = {name: [] for name in sessions}
        for sess in sessions.values():  # warm-up
            sess.run(None, feeds)
            sess.last_report  # noqa: B018
        for i in range(args.repeats):
            order = list(sessions) if i % 2 == 0 else list(sessions)[::-1]
            for name in order:
                sess = sessions[name]
                start = time.perf_counter()
                sess.run(None, feeds)
                sess.last_report  # noqa: B018
                times[name].append(time.perf_counter() - start)
        off, on = (statistics.median(times[name]) for name in ("off", "on"))
        print(
            f"{tokens:>3} tokens: run + report median {off * 1e6:8.1f} us off, {on * 1e6:8.1f} us on, "
            f"on/off {on / off:.3f}"
        )
    capture = sessions["on"].reporter.capture
    print(
        f"capture after {capture.num_steps} steps: {capture.resident_bytes:,} bytes in memory, "
        f"{capture.spooled_bytes:,} spooled"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
