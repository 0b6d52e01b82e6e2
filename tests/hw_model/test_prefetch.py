"""Dataset-free prefetch: prefill counts choose the first resident set, a cap, copies that take time."""

from __future__ import annotations

import numpy as np
import pytest

from hw_model.errors import WorkloadError
from hw_model.prefetch import ExpertLRUCache, ExpertPrefetcher, PrefetchConfig, share_drop_z


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


@pytest.mark.parametrize("seed", range(2, 5))  # seeds whose runs evict in every case
@pytest.mark.parametrize("change_z", [0.0, 1.0])  # without and with the change detector (it fires on these streams)
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize(
    ("decay", "cap_bytes"),
    [
        (0.9, 900.0),  # inexact scores: any difference in the order of operations would show
        (0.5, 900.0),  # exact halvings: many equal scores, so the order among ties decides
        (1.0, 260.0),  # plain counts under a cap of two or three experts: the hysteresis decides most re-plans
    ],
)
def test_list_kept_scores_plan_exactly_what_the_score_array_plans(seed, change_z, lazy, decay, cap_bytes):
    rng = np.random.default_rng(seed)
    config = PrefetchConfig(
        residency_cap_bytes=cap_bytes, update_interval_tokens=3, decay=decay, change_z=change_z, lazy_eviction=lazy
    )
    widths, sizes = [8, 8, 5], [100.0, 100.0, 60.0]
    prefetchers = [ExpertPrefetcher(widths, sizes, config, as_lists=kept) for kept in (False, True)]
    prefill = rng.integers(0, 9, size=(3, 8)) * (np.arange(8) < np.array(widths)[:, None])
    for p in prefetchers:
        p.add_scores(slice(0, 3), prefill)
    plan_changes = 0
    for _ in range(40):
        planned = [set(experts) for experts in prefetchers[0]._wanted_sets]
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
        plan_changes += planned != arrays._wanted_sets
    assert lists._leftovers == arrays._leftovers
    assert arrays.replans == 14 and plan_changes > 0
    assert lists.changes_detected == arrays.changes_detected
    assert (arrays.changes_detected > 0) == (change_z > 0)
    assert np.array(lists._score_rows).tolist() == arrays.scores.tolist()


def test_the_plan_takes_the_best_share_per_byte_in_order_until_the_cap_is_reached():
    # 10 selections per layer; share per byte: layer 1 expert 0 (0.6 / 60 = 0.01), layer 0 expert 1 (0.8 / 100 =
    # 0.008), layer 1 expert 2 (0.4 / 60 = 0.0067), layer 0 expert 0 (0.002); a 200-byte cap holds the first two
    # (160 bytes): adding the third would make 220
    for kept in (False, True):
        p = ExpertPrefetcher([3, 3], [100.0, 60.0], PrefetchConfig(residency_cap_bytes=200.0), as_lists=kept)
        p.add_scores(0, np.array([2, 8, 0]))
        p.add_scores(1, np.array([6, 0, 4]))
        p.before_invocation(0, "decode")
        assert [(layer, expert) for layer, expert, _ in p._queue] == [(0, 1), (1, 0)]
        assert p.queued_bytes == 160.0


def test_experts_rank_by_their_share_of_the_layer_not_by_raw_counts():
    # layer 0 counted 20 selections, layer 1 only 4 (its counts restarted, say): layer 1 expert 0 takes 3/4 of its
    # layer's selections, layer 0's best half of its own, so a one-expert cap holds layer 1 expert 0 (its raw count,
    # 3, is the lowest of the three)
    for kept in (False, True):
        p = ExpertPrefetcher([2, 2], [100.0, 100.0], PrefetchConfig(residency_cap_bytes=100.0), as_lists=kept)
        p.add_scores(0, np.array([10, 10]))
        p.add_scores(1, np.array([3, 1]))
        p.before_invocation(0, "decode")
        assert [(layer, expert) for layer, expert, _ in p._queue] == [(1, 0)]


@pytest.mark.parametrize("size", [0.0, -1.0, float("nan"), float("inf")])
def test_expert_sizes_must_be_positive_and_finite(size):
    with pytest.raises(WorkloadError, match="expert sizes"):
        ExpertPrefetcher([4, 4], [100.0, size], PrefetchConfig(residency_cap_bytes=1.0))


def test_share_drop_z_is_the_two_proportion_statistic():
    # 60 of 100 before, 30 of 100 after: pooled 0.45, spread sqrt(0.45 * 0.55 * 0.02) = 0.07036; (0.6 - 0.3) / spread
    assert share_drop_z(60, 100, 30, 100) == pytest.approx(0.3 / (0.45 * 0.55 * 0.02) ** 0.5)
    assert share_drop_z(30, 100, 60, 100) < 0  # a rise is not a drop
    assert share_drop_z(60, 100, 0, 0) == 0.0 and share_drop_z(100, 100, 100, 100) == 0.0


def _zipf_stream(p: ExpertPrefetcher, rng: np.random.Generator, weights: list[np.ndarray], tokens: int) -> None:
    """``tokens`` decode steps, each layer's 2 experts of 16 drawn without replacement from its ``weights``."""
    for _ in range(tokens):
        for layer in range(len(weights)):
            p.before_invocation(layer, "decode")
            counts = np.zeros(16, dtype=np.int64)
            counts[rng.choice(16, size=2, replace=False, p=weights[layer])] = 1
            p.observe(layer, counts, "decode")
            p.drain(1.0, 1e9)


def _zipf_prefetcher(rng: np.random.Generator, layers: int, zipf: np.ndarray) -> ExpertPrefetcher:
    """A prefetcher of ``layers`` layers of 16 experts (room for 2 per layer, plain counts, the detector at 3
    deviations), its prefill 64 tokens drawn from ``zipf`` (the scores kept as an array, read as they are)."""
    config = PrefetchConfig(residency_cap_bytes=layers * 200.0, update_interval_tokens=16, decay=1.0, change_z=3.0)
    p = ExpertPrefetcher([16] * layers, [100.0] * layers, config, as_lists=False)
    p.add_scores(slice(0, layers), np.stack([rng.multinomial(128, zipf) for _ in range(layers)]))
    return p


def _zipf(skew: float) -> np.ndarray:
    weights = np.arange(1, 17, dtype=np.float64) ** -skew
    return weights / weights.sum()


@pytest.mark.parametrize("seed", range(3))
def test_the_change_detector_resets_a_shifted_layer_and_not_the_stationary_ones(seed):
    rng = np.random.default_rng(seed)
    zipf = _zipf(1.0)
    p = _zipf_prefetcher(rng, 8, zipf)
    _zipf_stream(p, rng, [zipf] * 8, 160)  # ten intervals from the prefill's distribution
    assert p.changes_detected == 0
    shifted = [zipf] * 3 + [zipf[::-1].copy()] + [zipf] * 4  # layer 3's favourites become its rarest
    _zipf_stream(p, rng, shifted, 96)
    assert p.changes_detected == 1
    sums = p.scores.sum(axis=1).tolist()
    assert sums[:3] + sums[4:] == [128 + 2 * 256] * 7  # the stationary layers forgot nothing
    assert sums[3] <= 2 * 96  # layer 3 forgot what came before its shift (at an interval's start)
    assert p.resident_sets[3] and p.resident_sets[3] <= set(range(8, 16))  # the new favourites only


@pytest.mark.parametrize("seed", range(4))
def test_a_shift_of_every_layer_is_detected_from_their_pooled_evidence(seed):
    # a mild skew over 8 layers: each layer's own evidence stays below the threshold, the pooled evidence does not
    rng = np.random.default_rng(seed)
    zipf = _zipf(0.3)
    p = _zipf_prefetcher(rng, 8, zipf)
    _zipf_stream(p, rng, [zipf] * 8, 160)
    assert p.changes_detected == 0
    _zipf_stream(p, rng, [zipf[::-1].copy()] * 8, 64)
    assert (p.scores.sum(axis=1) <= 2 * 64).all()  # every layer forgot what came before the shift
    alone = _zipf_prefetcher(rng, 1, zipf)  # one such layer on its own: the same streams, no detection
    _zipf_stream(alone, rng, [zipf], 160)
    _zipf_stream(alone, rng, [zipf[::-1].copy()], 64)
    assert alone.changes_detected == 0


@pytest.mark.parametrize("kept", [False, True])
def test_a_dropped_resident_stays_until_a_copy_needs_its_room_the_least_valuable_first(kept):
    config = PrefetchConfig(residency_cap_bytes=300.0, update_interval_tokens=1, decay=1.0, swap_margin=1.0)
    p = ExpertPrefetcher([5], [100.0], config, as_lists=kept)
    p.add_scores(0, np.array([10, 9, 8, 0, 0]))
    p.before_invocation(0, "decode")  # the first plan: experts 0, 1, 2
    p.drain(1.0, 300.0)
    assert p.resident_sets == [{0, 1, 2}]
    p.add_scores(0, np.array([0, 0, 0, 20, 30]))  # experts 4 and 3 now beat 1 and 2
    p.before_invocation(0, "decode")
    assert p.resident_sets == [{0, 1, 2}] and p.evictions == 0  # dropped, not yet evicted: they still hit
    assert p.count_hits(0, [1, 2]) == (2, 0)
    p.drain(1.0, 100.0)  # one copy (expert 3, the queue in expert order): room made by expert 2 (score 8 < 9)
    assert p.resident_sets == [{0, 1, 3}] and p.evictions == 1
    p.drain(1.0, 100.0)
    assert p.resident_sets == [{0, 3, 4}] and p.evictions == 2
    assert p.held_bytes == 300.0


def test_without_lazy_eviction_a_dropped_resident_goes_at_the_re_plan():
    config = PrefetchConfig(residency_cap_bytes=200.0, update_interval_tokens=1, decay=1.0, lazy_eviction=False)
    p = ExpertPrefetcher([3], [100.0], config)
    p.add_scores(0, np.array([10, 9, 0]))
    p.before_invocation(0, "decode")
    p.drain(1.0, 200.0)
    p.add_scores(0, np.array([0, 0, 40]))
    p.before_invocation(0, "decode")
    assert p.resident_sets == [{0}] and p.evictions == 1
