"""Per-layer activation histograms and their drift from the ones placements were planned on
(:class:`DriftTracker`), which decides when ``tp+lb`` and ours reuse a plan."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hw_model.prefetch import LIST_KEPT_CELLS


def row_selector(layers: Sequence[int]) -> slice | Sequence[int]:
    """Index rows ``layers`` of a per-layer array: a slice (a view) when they are consecutive and ascending."""
    if isinstance(layers, range) and layers.step == 1:
        return slice(layers.start, layers.stop)
    first = layers[0]
    if layers == list(range(first, first + len(layers))):
        return slice(first, first + len(layers))
    return layers


class DriftTracker:
    """Per layer: the exponentially smoothed activation histogram, the one the current plan was made on, and
    the plan (the GPU set). :meth:`update` smooths several layers' histograms and records their L1 drift from the
    plans' (infinite where no plan was made yet).

    The histograms are arrays, updated for all the step's layers in one operation each; a small model's (at most
    :data:`~hw_model.prefetch.LIST_KEPT_CELLS` layers x experts, as a session's report simulates) are Python lists,
    updated by loops that compiled run faster than numpy's calls (``as_lists`` overrides the choice). Both compute
    the same values to the last bit: the same element operations, the drift summed in numpy's order
    (:func:`numpy_row_sum`)."""

    def __init__(self, num_layers: int, width: int, smoothing: float, *, as_lists: bool | None = None) -> None:
        self.smoothing = smoothing
        self._lists = num_layers * width <= LIST_KEPT_CELLS if as_lists is None else as_lists
        array_shape = (0, width) if self._lists else (num_layers, width)
        self.smoothed = np.zeros(array_shape)
        self.planned_on = np.zeros(array_shape)
        self._smoothed_rows: list[list[float]] = [[0.0] * width for _ in range(num_layers)] if self._lists else []
        self._planned_rows: list[list[float]] = [[0.0] * width for _ in range(num_layers)] if self._lists else []
        self.seen = np.zeros(num_layers, dtype=bool)
        self.has_plan = np.zeros(num_layers, dtype=bool)
        self.plans: list[frozenset[int]] = [frozenset()] * num_layers
        self.plan_copies: list[frozenset[int]] = [frozenset()] * num_layers  # the experts each plan copied to the GPU
        self._all_seen = False
        self._all_planned = False
        self._replanned: list[int] = []  # layers planned since the last update (see replan)
        self.drift: dict[int, float] = {}  # layer -> drift of its pending invocation (set by update)

    def update(self, layers: Sequence[int], counts: np.ndarray) -> None:
        """Smooth ``counts[i]`` (layer ``layers[i]``'s token counts) into the histograms; record each drift."""
        if self._lists:
            self._update_lists(layers, counts)
            return
        if self._replanned:  # their plans were made on the histograms as they are until now
            replanned = row_selector(self._replanned)
            self.planned_on[replanned] = self.smoothed[replanned]
            self._replanned.clear()
        alpha = self.smoothing
        totals = counts.sum(axis=1)
        np.maximum(totals, 1, out=totals)
        rows = row_selector(layers)
        smoothed = self.smoothed[rows]  # a view for a slice; fancy indexing copies (written back below)
        width = counts.shape[1]
        fresh = None if self._all_seen else ~self.seen[rows]
        # in place: (1 - alpha) * smoothed + alpha * histogram, the histogram being counts / total
        smoothed *= 1 - alpha
        smoothed[:, :width] += counts * (alpha / totals)[:, None]
        if fresh is not None and fresh.any():  # a layer's first invocation: its histogram as it is
            smoothed[fresh] = 0.0
            smoothed[fresh, :width] = counts[fresh] / totals[fresh, None]
        if not isinstance(rows, slice):
            self.smoothed[rows] = smoothed
        if not self._all_seen:
            self.seen[rows] = True
            self._all_seen = bool(self.seen.all())
        difference = smoothed - self.planned_on[rows]
        drift = np.abs(difference, out=difference).sum(axis=1)
        if not self._all_planned:
            drift[~self.has_plan[rows]] = np.inf
        self.drift.update(zip(layers, drift.tolist(), strict=True))

    def _update_lists(self, layers: Sequence[int], counts: np.ndarray) -> None:
        """:meth:`update` on the histograms kept as lists: the same operations, element by element."""
        smoothed_rows, planned_rows = self._smoothed_rows, self._planned_rows
        for layer in self._replanned:
            planned_rows[layer] = smoothed_rows[layer].copy()
        self._replanned.clear()
        alpha = self.smoothing
        keep = 1 - alpha
        rows: list[list[int]] = counts.tolist()
        drifts = self.drift
        for i in range(len(rows)):
            layer = layers[i]
            row = rows[i]
            width = len(row)
            total = 0
            for count in row:
                total += count
            if total < 1:
                total = 1
            smoothed = smoothed_rows[layer]
            if self._all_seen or self.seen[layer]:
                scale = alpha / total
                for j in range(width):
                    smoothed[j] = smoothed[j] * keep + row[j] * scale
                for j in range(width, len(smoothed)):
                    smoothed[j] = smoothed[j] * keep
            else:  # a layer's first invocation: its histogram as it is
                for j in range(width):
                    smoothed[j] = row[j] / total
                for j in range(width, len(smoothed)):
                    smoothed[j] = 0.0
                self.seen[layer] = True
            planned = planned_rows[layer]
            difference = [abs(smoothed[j] - planned[j]) for j in range(len(smoothed))]
            planned_yet = self._all_planned or bool(self.has_plan[layer])
            drifts[layer] = numpy_row_sum(difference, 0, len(difference)) if planned_yet else np.inf
        if not self._all_seen:
            self._all_seen = bool(self.seen.all())

    def replan(self, layer: int, gpu_set: frozenset[int], copies: frozenset[int] = frozenset()) -> None:
        """A plan was made for ``layer`` on its current smoothed histogram (noted now, copied at the next
        :meth:`update`, before the histograms change: one array operation for all the layers planned); ``copies``:
        the experts of ``gpu_set`` it copies to the GPU."""
        self._replanned.append(layer)
        self.plans[layer] = gpu_set
        self.plan_copies[layer] = copies
        if not self._all_planned:
            self.has_plan[layer] = True
            self._all_planned = bool(self.has_plan.all())


def numpy_row_sum(values: list[float], start: int, count: int) -> float:
    """The sum of ``values[start : start + count]`` as numpy sums a row of float64 (``array.sum(axis=-1)``):
    pairwise, blocks of up to 128 summed by eight interleaved accumulators."""
    if count < 8:
        total = 0.0
        for i in range(start, start + count):
            total += values[i]
        return total
    if count <= 128:
        r0, r1, r2, r3 = values[start], values[start + 1], values[start + 2], values[start + 3]
        r4, r5, r6, r7 = values[start + 4], values[start + 5], values[start + 6], values[start + 7]
        i = start + 8
        end = start + count - count % 8
        while i < end:
            r0 += values[i]
            r1 += values[i + 1]
            r2 += values[i + 2]
            r3 += values[i + 3]
            r4 += values[i + 4]
            r5 += values[i + 5]
            r6 += values[i + 6]
            r7 += values[i + 7]
            i += 8
        total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < start + count:
            total += values[i]
            i += 1
        return total
    half = count // 2
    half -= half % 8
    return numpy_row_sum(values, start, half) + numpy_row_sum(values, start + half, count - half)
