"""Routing traces: synthetic knobs do what they say, calibration reproduces measured counts, file format."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

import hw_model.traces as traces_module
from hw_model.errors import WorkloadError
from hw_model.traces import (
    CALIBRATED_SKEW,
    MEASURED_TOP10_SHARE,
    RoutingTrace,
    TraceKnobs,
    load_trace,
    synthetic_top_share,
    synthetic_trace,
    top_share,
)

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
COUNTS = SHARED / "traces" / "olmoe_expert_counts" / "expert_counts.json"
SHAPES = {"mixtral-8x7b": (8, 2), "olmoe-1b-7b": (64, 8), "qwen3-30b-a3b": (128, 8), "deepseek-v2-lite": (64, 6)}


def test_synthetic_trace_shape_distinct_ids_and_seeding():
    knobs = TraceKnobs(skew=0.7, locality=0.3, seed=11)
    a = synthetic_trace(3, 16, 4, 20, 10, knobs)
    b = synthetic_trace(3, 16, 4, 20, 10, knobs)
    assert a.expert_ids.shape == (3, 30, 4)
    assert (np.diff(np.sort(a.expert_ids, axis=2), axis=2) > 0).all()
    assert np.array_equal(a.expert_ids, b.expert_ids)
    assert not np.array_equal(a.expert_ids, synthetic_trace(3, 16, 4, 20, 10, TraceKnobs(skew=0.7, seed=12)).expert_ids)
    assert a.prefill_counts(0).sum() == 20 * 4


# sha256 (first 16 hex digits) of expert_ids as int32 bytes, computed with the per-segment
# ``argsort(-(log w + rng.gumbel(...)))`` implementation this module had before its partition-based ranking
# (commit e941362): the figures in README.md and docs/bench.md come from these traces.
PINNED_TRACES = [
    ((48, 128, 8, 512, 512), TraceKnobs(skew=0.222, seed=0), "e58043e6f957d8aa"),
    ((48, 128, 8, 512, 512), TraceKnobs(skew=0.222, locality=0.3, seed=0), "7fe2711bdaa02093"),
    ((16, 64, 8, 64, 64), TraceKnobs(skew=0.682, shift_at=None, seed=1), "c040540171b1763b"),
    ((32, 8, 2, 40, 100), TraceKnobs(skew=0.134, locality=0.5, shift_at=0.0, seed=2), "d05e243603d491d6"),
    ((4, 64, 6, 30, 30), TraceKnobs(skew=6.0, locality=1.0, shift_at=1.0, seed=3), "5bb08241bef1c830"),
    ((3, 8, 8, 16, 16), TraceKnobs(skew=0.0, locality=0.9, seed=4), "d76d86b118a411ec"),
    ((2, 16, 1, 10, 0), TraceKnobs(skew=1.5, seed=5), "3729258504a1843f"),
]


def _digest(trace: RoutingTrace) -> str:
    return hashlib.sha256(trace.expert_ids.astype("<i4").tobytes()).hexdigest()[:16]


@pytest.mark.parametrize(("shape", "knobs", "digest"), PINNED_TRACES)
def test_synthetic_traces_are_those_pinned_before_the_faster_ranking(shape, knobs, digest):
    assert _digest(synthetic_trace(*shape, knobs)) == digest


def test_tokens_ranked_from_exact_gumbel_keys_match_the_fast_ranking(monkeypatch):
    # A tolerance above every relative gap sends every token through the exact (C library log) ranking.
    monkeypatch.setattr(traces_module, "_KEY_TIE_TOLERANCE", 1e300)
    for shape, knobs, digest in PINNED_TRACES[2:]:
        assert _digest(synthetic_trace(*shape, knobs)) == digest


def test_more_skew_concentrates_selections():
    shares = [synthetic_top_share(64, 8, skew, tokens=4096) for skew in (0.0, 0.5, 1.0, 1.5)]
    assert shares == sorted(shares)
    assert shares[0] == pytest.approx(6 / 64, abs=0.01)  # uniform: the top 6 of 64 experts take ~6/64


def test_locality_makes_consecutive_tokens_share_experts():
    def overlap(locality: float) -> float:
        ids = synthetic_trace(1, 64, 8, 0, 2000, TraceKnobs(locality=locality, shift_at=None)).expert_ids[0]
        return float(np.mean([len(set(ids[t]) & set(ids[t - 1])) for t in range(1, len(ids))]) / 8)

    assert overlap(0.0) < 0.2
    assert overlap(0.6) > 0.55


def test_domain_shift_changes_which_experts_are_popular():
    trace = synthetic_trace(1, 64, 8, 0, 8000, TraceKnobs(skew=1.0, shift_at=0.5))
    first, second, third = trace.counts(0, 0, 2000), trace.counts(0, 2000, 4000), trace.counts(0, 4000, 6000)
    assert np.corrcoef(first, second)[0, 1] > 0.8
    assert np.corrcoef(first, third)[0, 1] < 0.5


@pytest.mark.parametrize("model", sorted(CALIBRATED_SKEW))
def test_calibrated_skews_reproduce_the_measured_top10_shares(model):
    experts, top_k = SHAPES[model]
    for skew, target in zip(CALIBRATED_SKEW[model], MEASURED_TOP10_SHARE[model], strict=False):
        assert synthetic_top_share(experts, top_k, skew) == pytest.approx(target, abs=0.01)


@pytest.mark.skipif(not COUNTS.is_file(), reason="../shared/traces (real expert counts) not present")
def test_measured_shares_are_those_of_the_real_counts():
    counts = json.loads(COUNTS.read_text())["counts"]
    for key, model in (("mistral", "mixtral-8x7b"), ("olmoe", "olmoe-1b-7b")):
        shares = [top_share(np.array(v)) for domain in counts[key].values() for v in domain.values()]
        low, typical, high = MEASURED_TOP10_SHARE[model]
        assert min(shares) == pytest.approx(low, abs=1e-4)
        assert float(np.median(shares)) == pytest.approx(typical, abs=1e-4)
        assert max(shares) == pytest.approx(high, abs=1e-4)


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_trace_file_round_trip(tmp_path, suffix):
    trace = synthetic_trace(2, 8, 2, 5, 3, TraceKnobs(skew=0.3))
    path = tmp_path / f"t{suffix}"
    trace.save(path)
    loaded = load_trace(path)
    assert np.array_equal(loaded.expert_ids, trace.expert_ids)
    assert (loaded.num_experts, loaded.prompt_tokens) == (8, 5)


def test_bad_trace_files_name_the_problem(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "ndp-ep-trace/1", "num_experts": 4, "prompt_tokens": 1}))
    with pytest.raises(WorkloadError, match="expert_ids"):
        load_trace(bad)
    bad.write_text(
        json.dumps({"format": "ndp-ep-trace/1", "num_experts": 4, "prompt_tokens": 1, "expert_ids": [[[0, 0]]]})
    )
    with pytest.raises(WorkloadError, match="same expert twice"):
        load_trace(bad)
    bad.write_text(
        json.dumps({"format": "ndp-ep-trace/1", "num_experts": 4, "prompt_tokens": 1, "expert_ids": [[[0, 7]]]})
    )
    with pytest.raises(WorkloadError, match="0..3"):
        load_trace(bad)
    bad.write_text("{not json")
    with pytest.raises(WorkloadError, match="not a readable trace"):
        load_trace(bad)
    with pytest.raises(WorkloadError, match="skew"):
        TraceKnobs(skew=-1)
    with pytest.raises(WorkloadError, match="prompt_tokens"):
        RoutingTrace(np.zeros((1, 2, 1), dtype=int), 4, 5)


def test_step_counts_are_every_layers_counts_over_the_same_tokens():
    trace = synthetic_trace(5, 16, 4, 12, 6, TraceKnobs(skew=0.7, seed=3))
    for start, stop in ((0, trace.prompt_tokens), (12, 13), (3, 17)):
        step = trace.step_counts(start, stop)
        assert step.shape == (5, 16)
        for layer in range(5):
            assert step[layer].tolist() == trace.counts(layer, start, stop).tolist()
    assert trace.prefill_step_counts(3).tolist() == trace.step_counts(0, 12)[:3].tolist()
    assert trace.token_counts(14).sum() == 5 * 4  # each layer: top-4 distinct experts of one token


def test_tokens_counts_are_each_tokens_counts_per_layer():
    ids = np.array([[[0, 2], [1, 2], [3, 0]], [[1, 3], [1, 0], [2, 3]]])  # [layers, tokens, top_k]
    trace = RoutingTrace(ids, num_experts=4, prompt_tokens=1)
    batch = trace.tokens_counts(1, 3)
    assert batch.shape == (2, 2, 4)  # tokens 1 and 2, two layers, four experts
    assert batch[0].tolist() == [[0, 1, 1, 0], [1, 1, 0, 0]]
    assert batch[1].tolist() == [[1, 0, 0, 1], [0, 0, 1, 1]]
    assert trace.tokens_counts(0, 3, num_layers=1)[:, 0].tolist() == [[1, 0, 1, 0], [0, 1, 1, 0], [1, 0, 0, 1]]
    assert trace.token_counts(2).tolist() == batch[1].tolist()


def test_a_weighted_trace_draws_from_its_weights_and_says_so() -> None:
    from hw_model.traces import weighted_trace

    before = np.array([[5.0, 0.0, 1.0, 0.0, 2.0, 2.0], [0.0, 3.0, 3.0, 3.0, 0.0, 1.0]])
    after = before[:, ::-1].copy()
    trace = weighted_trace(before, after, 2, 300, 600, TraceKnobs(shift_at=0.5, seed=4))
    shift = 300 + 300
    for layer in range(2):
        first, second = trace.counts(layer, 0, shift), trace.counts(layer, shift, trace.num_tokens)
        assert (first[before[layer] == 0] == 0).all() and (second[after[layer] == 0] == 0).all()
        assert int(np.argmax(first)) == int(np.argmax(before[layer])) or before[layer].max() == 3.0
    distribution = trace.distribution
    assert distribution is not None and distribution.phase_starts == (0, shift)
    np.testing.assert_allclose(distribution.weights[0], before / before.sum(axis=1, keepdims=True))
    np.testing.assert_allclose(distribution.weights[1], after / after.sum(axis=1, keepdims=True))
    with pytest.raises(WorkloadError, match="at least 2 positive"):
        weighted_trace(np.array([[1.0, 0.0, 0.0]]), np.ones((1, 3)), 2, 4, 4, TraceKnobs())
