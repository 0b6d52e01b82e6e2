"""Time the converter's shard copy (``expert_math.copy_blocked``) against numpy's own transposing copy.

    python benchmarks/bench_shard_copy.py                 # H=1024, I=2048, 4 shards: bench_large_model's shapes
    python benchmarks/bench_shard_copy.py --hidden 2880 --ffn 2880

For one expert of a ``[2I, H]`` gate_up and an ``[H, I]`` down weight (``[out, in]``, as exporters store them)
it copies shard 0 of each into the ``x @ W`` layout (``[H, I/S]`` and ``[I/S, H]``: both transposes) in float16
and float32. The converter itself no longer transposes such shards (they keep the source's ``out_in`` layout,
see graph_passes/sharded_op.py); ``copy_blocked`` still serves a gate stored unlike its up projection and the
writer's strided copies. It times them with ``np.copyto`` of the transposed view and with ``copy_blocked``, and
prints GB/s (the best of ``--repeat`` runs, from memory, so no disk or page-fault time). Both results are
checked equal.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graph_passes.expert_math import copy_blocked  # noqa: E402


def best_seconds(run: Callable[[], object], repeat: int) -> float:
    run()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--ffn", type=int, default=2048)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    if min(args.hidden, args.ffn, args.shards, args.repeat) < 1 or args.ffn % args.shards:
        parser.error("sizes must be positive and --ffn divisible by --shards")
    width = args.ffn // args.shards
    rng = np.random.default_rng(0)
    print(f"{'dtype':8} {'shard':10} {'shape':>12} {'numpy GB/s':>11} {'copy_blocked GB/s':>18}")
    for dtype in (np.float16, np.float32):
        gate_up = rng.standard_normal((2 * args.ffn, args.hidden), dtype=np.float32).astype(dtype)
        down = rng.standard_normal((args.hidden, args.ffn), dtype=np.float32).astype(dtype)
        for label, view in (("gate", gate_up.T[:, :width]), ("down", down.T[:width])):
            out = np.empty(view.shape, dtype)
            numpy_s = best_seconds(lambda v=view, o=out: np.copyto(o, v), args.repeat)
            blocked_s = best_seconds(lambda v=view, o=out: copy_blocked(v, o), args.repeat)
            if not np.array_equal(out, view):
                print(f"{label}: copy_blocked differs from the source view")
                return 1
            shape = "x".join(map(str, view.shape))
            name = np.dtype(dtype).name
            numpy_rate, blocked_rate = view.nbytes / numpy_s / 1e9, view.nbytes / blocked_s / 1e9
            print(f"{name:8} {label:10} {shape:>12} {numpy_rate:11.2f} {blocked_rate:18.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
