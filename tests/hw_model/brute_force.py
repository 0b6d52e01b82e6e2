"""Brute-forced best placements the simulator can lay out: the independent references the bound's and ours' tests
compare with (every layout recorded on an :class:`~hw_model.layout.InvocationLayout` and timed by it)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from hw_model.layout import InvocationLayout, LayoutState
from hw_model.policies import SPLIT_PARTS

# a split's k: 1/k of the expert's FFN columns on the GPU, or (negative) all but 1/k
SINGLE_SPLITS = [*SPLIT_PARTS, *(-k for k in SPLIT_PARTS)]


def best_layout_s(
    ctx, layer: int, active: Sequence[int], tokens: Sequence[int], resident: Sequence[bool], modes
) -> float:
    """The least latency over every way of running each active expert in ``modes`` (``(name, k)`` pairs: ``gpu``
    from residency if resident, else copied; ``sliced`` over every unit; ``whole`` on its home unit; ``split`` with
    k as in :data:`SINGLE_SPLITS`)."""
    best = float("inf")
    for choice in itertools.product(modes, repeat=len(active)):
        out = InvocationLayout(ctx, LayoutState(), layer, list(active), list(tokens))
        for (mode, k), e, count, res in zip(choice, active, tokens, resident, strict=True):
            if mode == "gpu":
                out.to_gpu(e, count, res)
            elif mode == "sliced":
                out.sliced([e], [count])
            elif mode == "whole":
                out.whole_on_units([e], [count])
            else:
                out.split(e, count, k, res)
        best = min(best, out.finish().latency_s)
    return best


def best_single_split_s(ctx, layer: int, active: Sequence[int], resident: Sequence[bool]) -> float:
    """The best sliced-layout placement of one-token experts with at most one split: how many resident and how many
    other experts run on the GPU, and which of the rest (if any) is split, any side, k in :data:`SINGLE_SPLITS`."""
    held = [e for e, r in zip(active, resident, strict=True) if r]
    other = [e for e, r in zip(active, resident, strict=True) if not r]
    best = float("inf")
    for on_held in range(len(held) + 1):
        for on_other in range(len(other) + 1):
            options = [None] + [(True, k) for k in SINGLE_SPLITS if on_held < len(held)]
            options += [(False, k) for k in SINGLE_SPLITS if on_other < len(other)]
            for split in options:
                out = InvocationLayout(ctx, LayoutState(), layer, list(active), [1] * len(active))
                for group, count, res in ((held, on_held, True), (other, on_other, False)):
                    for i, e in enumerate(group):
                        if i < count:
                            out.to_gpu(e, 1, res)
                        elif split is not None and split[0] == res and i == count:
                            out.split(e, 1, split[1], res)
                        else:
                            out.sliced([e], [1])
                best = min(best, out.finish().latency_s)
    return best
