"""Dataset-free prefetch: prefill counts choose the first resident set, a cap, copies that take time."""

from __future__ import annotations

import numpy as np
import pytest

from hw_model.errors import WorkloadError
from hw_model.prefetch import ExpertLRUCache, ExpertPrefetcher, PrefetchConfig


def _prefetcher(cap_experts: float, layers: int = 2, experts: int = 8, **kw) -> ExpertPrefetcher:
    return ExpertPrefetcher(
        [experts] * layers, [100.0] * layers, PrefetchConfig(residency_cap_bytes=cap_experts * 100, **kw)
    )


def test_prefill_counts_decide_the_first_resident_set_within_the_cap():
    p = _prefetcher(cap_experts=3)
    p.observe(0, np.array([9, 0, 0, 1, 0, 0, 0, 0]), "prefill")
    p.observe(1, np.array([0, 0, 7, 0, 0, 5, 0, 0]), "prefill")
    p.before_invocation(0, "decode")
    assert p.queued_bytes == 300
    assert not p.resident.any()  # nothing is resident before its copy completes
    p.drain(1.0, bandwidth_bytes_per_s=250.0)  # 250 bytes: two whole copies and half of the third
    p.drain(1.0, bandwidth_bytes_per_s=250.0)
    assert sorted(zip(*np.nonzero(p.resident), strict=False)) == [(0, 0), (1, 2), (1, 5)]
    assert p.bytes_moved == 300


def test_residency_cap_is_never_exceeded_and_hits_are_counted():
    rng = np.random.default_rng(0)
    p = _prefetcher(cap_experts=4, update_interval_tokens=4)
    weights = np.array([0.4, 0.3, 0.1, 0.05, 0.05, 0.05, 0.03, 0.02])
    p.observe(0, rng.multinomial(64, weights), "prefill")
    p.observe(1, rng.multinomial(64, weights[::-1]), "prefill")
    for _ in range(64):
        for layer in range(2):
            p.before_invocation(layer, "decode")
            counts = np.zeros(8, dtype=int)
            counts[rng.choice(8, 2, replace=False, p=weights if layer == 0 else weights[::-1])] = 1
            p.observe(layer, counts, "decode")
            p.drain(0.5, 100.0)
            assert p.resident.sum() * 100 <= 400
    stats = p.stats()
    assert stats["prefetch_hits"] + stats["prefetch_misses"] == 64 * 2 * 2
    assert stats["prefetch_hit_rate"] > 0.5  # the popular experts are resident most of the time


def test_zero_cap_prefetches_nothing():
    p = _prefetcher(cap_experts=0)
    p.observe(0, np.ones(8, dtype=int), "prefill")
    p.before_invocation(0, "decode")
    assert p.queued_bytes == 0


def test_config_validation():
    with pytest.raises(WorkloadError, match="decay"):
        PrefetchConfig(residency_cap_bytes=1, decay=2.0)
    with pytest.raises(WorkloadError, match="residency_cap_bytes"):
        PrefetchConfig(residency_cap_bytes=-1)


def test_lru_evicts_least_recently_used():
    cache = ExpertLRUCache(capacity_bytes=200)
    assert not cache.use((0, 1), 100)
    assert not cache.use((0, 2), 100)
    assert cache.use((0, 1), 100)
    assert not cache.use((0, 3), 100)  # evicts (0, 2)
    assert (0, 2) not in cache and (0, 1) in cache
    assert cache.stats()["cache_bytes_moved"] == 300


def test_an_on_demand_copy_of_a_planned_expert_is_adopted_not_copied_again():
    p = _prefetcher(cap_experts=2)
    p.observe(0, np.array([5, 4, 0, 0, 0, 0, 0, 0]), "prefill")
    p.before_invocation(0, "decode")
    assert p.adopt_staged(0, 1)
    assert not p.adopt_staged(0, 5)  # not in the plan: stays a one-off staging copy
    p.drain(10.0, bandwidth_bytes_per_s=100.0)
    assert p.resident[0, :2].all() and p.resident.sum() == 2
    assert p.bytes_moved == 100  # only expert 0 needed a prefetch copy


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    ("decay", "cap_bytes"),
    [
        (0.9, 900.0),  # inexact scores: any difference in the order of operations would show
        (0.5, 900.0),  # exact halvings: many equal scores, so the order among ties decides
        (1.0, 260.0),  # plain counts under a cap of two or three experts: the hysteresis decides most re-plans
    ],
)
def test_list_kept_scores_plan_exactly_what_the_score_array_plans(seed, decay, cap_bytes):
    rng = np.random.default_rng(seed)
    config = PrefetchConfig(residency_cap_bytes=cap_bytes, update_interval_tokens=3, decay=decay)
    widths, sizes = [8, 8, 5], [100.0, 100.0, 60.0]
    prefetchers = [ExpertPrefetcher(widths, sizes, config, as_lists=kept) for kept in (False, True)]
    prefill = rng.integers(0, 9, size=(3, 8)) * (np.arange(8) < np.array(widths)[:, None])
    for p in prefetchers:
        p.add_scores(slice(0, 3), prefill)
    for _ in range(40):
        counts = np.zeros((3, 8), dtype=np.int64)
        for layer, width in enumerate(widths):
            counts[layer, rng.choice(width, size=2, replace=False)] = rng.integers(1, 4, size=2)
        for p in prefetchers:
            p.before_invocation(0, "decode")
            p.count_hits(1, np.flatnonzero(counts[1]).tolist())
            p.add_scores([0, 2], counts[[0, 2]])  # a selector list, then one layer's row
            p.observe(1, counts[1], "prefill")
            p.drain(2e-6, 1e8)
        arrays, lists = prefetchers
        assert lists.resident_sets == arrays.resident_sets
        assert list(lists._queue) == list(arrays._queue)  # the copies still to make, in their order
        assert lists.queued_bytes == arrays.queued_bytes
        assert lists.stats() == arrays.stats()
    assert arrays.replans == 14 and arrays.evictions > 0
    assert np.array(lists._score_rows).tolist() == arrays.scores.tolist()


def test_the_plan_takes_the_best_score_per_byte_in_order_until_the_cap_is_reached():
    # per byte: layer 0 expert 1 (0.08), layer 1 expert 0 (0.067), then layer 0 expert 0 and layer 1 expert 2 (0.05
    # each); a 250-byte cap holds the first two (160 bytes): adding the third would make 260
    for kept in (False, True):
        p = ExpertPrefetcher([3, 3], [100.0, 60.0], PrefetchConfig(residency_cap_bytes=250.0), as_lists=kept)
        p.add_scores(0, np.array([5, 8, 0]))
        p.add_scores(1, np.array([4, 0, 3]))
        p.before_invocation(0, "decode")
        assert [(layer, expert) for layer, expert, _ in p._queue] == [(0, 1), (1, 0)]
        assert p.queued_bytes == 160.0


@pytest.mark.parametrize("size", [0.0, -1.0, float("nan"), float("inf")])
def test_expert_sizes_must_be_positive_and_finite(size):
    with pytest.raises(WorkloadError, match="expert sizes"):
        ExpertPrefetcher([4, 4], [100.0, size], PrefetchConfig(residency_cap_bytes=1.0))
