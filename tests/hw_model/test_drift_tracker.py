"""The placement-reuse drift tracker: its list-kept histograms (small models) agree with its arrays to the last bit."""

from __future__ import annotations

import numpy as np
import pytest

from hw_model.policies import DriftTracker, numpy_row_sum


@pytest.mark.parametrize("count", [*range(0, 20), 63, 64, 127, 128, 129, 136, 255, 256, 300, 1031])
def test_numpy_row_sum_is_numpys_sum_of_a_row_to_the_last_bit(count):
    rng = np.random.default_rng(count)
    rows = np.abs(rng.standard_normal((3, count))) * 10.0 ** rng.integers(-9, 4, size=(3, count))
    expected = rows.sum(axis=1).tolist()
    values = rows.ravel().tolist()  # the rows one after the other: the sum reads a window of them
    assert [numpy_row_sum(values, row * count, count) for row in range(3)] == expected


def _random_steps(rng, num_layers: int, width: int, steps: int):
    """Steps of (layers, counts): sometimes a subset of layers, sometimes narrower rows, mostly top-2 routing."""
    for _ in range(steps):
        if rng.random() < 0.3:
            layers = sorted(rng.choice(num_layers, size=int(rng.integers(1, num_layers + 1)), replace=False).tolist())
        else:
            layers = list(range(num_layers))
        row_width = width if rng.random() < 0.8 else int(rng.integers(1, width + 1))
        counts = np.zeros((len(layers), row_width), dtype=np.int64)
        for row in range(len(layers)):
            if rng.random() < 0.05:
                continue  # nothing routed: the total counts as one
            picked = rng.choice(row_width, size=min(2, row_width), replace=False)
            counts[row, picked] = rng.integers(1, 9, size=picked.size)
        yield layers, counts


@pytest.mark.parametrize("seed", range(4))
def test_list_histograms_give_the_array_histograms_drift_to_the_last_bit(seed):
    rng = np.random.default_rng(seed)
    num_layers, width = 4, 19
    trackers = [DriftTracker(num_layers, width, 0.1, as_lists=kept) for kept in (False, True)]
    for step, (layers, counts) in enumerate(_random_steps(rng, num_layers, width, 300)):
        for tracker in trackers:
            tracker.update(layers, counts)
        arrays, lists = (tracker.drift for tracker in trackers)
        assert arrays == lists, f"step {step}"
        for layer in layers:  # the policy consumes the drift and sometimes re-plans
            for tracker in trackers:
                tracker.drift.pop(layer)
            if rng.random() < 0.2:
                for tracker in trackers:
                    tracker.replan(layer, frozenset({layer}))
    assert np.array(trackers[1]._smoothed_rows).tolist() == trackers[0].smoothed.tolist()


def test_a_layer_without_a_plan_has_infinite_drift_and_a_first_histogram_is_taken_as_it_is():
    for kept in (False, True):
        tracker = DriftTracker(2, 4, 0.5, as_lists=kept)
        tracker.update([0, 1], np.array([[0, 3, 1, 0], [2, 0, 0, 0]]))
        assert tracker.drift == {0: np.inf, 1: np.inf}
        tracker.replan(0, frozenset({1}))
        tracker.update([0], np.array([[0, 3, 1, 0]]))  # the histogram planned on, seen again: no drift
        assert tracker.drift[0] == 0.0
        tracker.update([0], np.array([[4, 0, 0, 0]]))  # half of the mass moved from (.75, .25) to expert 0
        assert tracker.drift[0] == pytest.approx(1.0)
