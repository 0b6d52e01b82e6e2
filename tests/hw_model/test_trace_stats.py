"""Routing statistics (hw_model/trace_stats.py, ndp-ep trace-stats): popularity, reuse distance, LRU hit rate and
bytes, from a trace whose figures are worked out by hand, and the count-only OLMoE file's published range."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hw_model.routing_trace import TraceHeader, TraceLayer, from_token_ids
from hw_model.routing_trace_io import save_trace
from hw_model.trace_stats import count_stats, load_count_file, summarise, trace_stats
from ndp_ep.cli import main

LAYER = TraceLayer("moe", num_experts=4, top_k=1, hidden=8, ffn=16)  # bf16: 3 * 8 * 16 * 2 = 768 bytes an expert


def _trace():
    # prompt: experts 0, 0, 1 (one prefill step); decode: 2, 0, 2, 3, 2
    ids = np.array([[[0], [0], [1], [2], [0], [2], [3], [2]]])
    header = TraceHeader(layers=(LAYER,), prompt_tokens=3, new_tokens=5, settings={"hw": "paper"})
    return from_token_ids(header, ids)


def test_trace_stats_by_hand():
    (stats,) = trace_stats(_trace(), cache_fraction=0.5)  # an LRU of 2 experts
    assert stats.selections == 8 and stats.active_experts == 4 and stats.decode_steps == 5
    assert stats.top10_share == pytest.approx(3 / 8)  # one expert (0 and 2 both have 3): 3 of 8
    assert stats.top25_share == pytest.approx(3 / 8)
    # clock: prefill 0 (experts 0, 1), then 2@1, 0@2, 2@3, 3@4, 2@5; reuse distances: 0 -> 2, 2 -> 2, 2 -> 2
    assert stats.reuse_distance_median == 2.0 and stats.reuse_next_step_share == 0.0
    # LRU [0, 1] -> 2 miss [1, 2] -> 0 miss [2, 0] -> 2 hit [0, 2] -> 3 miss [2, 3] -> 2 hit: 2 of 5
    assert stats.cache_experts == 2 and stats.cache_hit_rate == pytest.approx(2 / 5)
    assert stats.cache_miss_bytes == 3 * 3 * 8 * 16 * 2


def test_count_only_olmoe_file_matches_its_readme(shared_dir):
    path = shared_dir / "traces" / "olmoe_expert_counts" / "expert_counts.json"
    raw = json.loads(path.read_text())["counts"]["olmoe"]
    expected = []
    for domain in raw.values():
        for counts in domain.values():
            ranked = sorted(counts, reverse=True)
            expected.append(sum(ranked[:6]) / sum(ranked))  # 10 % of 64 experts, rounded: 6
    summary = summarise(count_stats(load_count_file(path)), group_of_path=True)["olmoe"]
    assert summary["top10_min"] == pytest.approx(min(expected)) and summary["top10_max"] == pytest.approx(max(expected))
    assert 0.155 < summary["top10_min"] < 0.165 and 0.435 < summary["top10_max"] < 0.445  # README: 16-44 %


def test_count_file_without_counts_is_refused(tmp_path, capsys):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"counts": {"a": ["x"]}}))
    assert main(["trace-stats", str(path)]) == 2
    err = capsys.readouterr().err
    assert "no per-expert count lists" in err and len(err.strip().splitlines()) == 1


def test_trace_stats_cli_prints_the_table_and_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = save_trace(_trace(), tmp_path / "t.npz")
    plot = tmp_path / "t.png"
    assert main(["trace-stats", str(path), "--plot", str(plot), "--cache-fraction", "0.5", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["layers"][0]["cache_hit_rate"] == pytest.approx(0.4)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["trace-stats", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| moe | 4 | 8 |" in out and "replayed under its own settings" in out


def test_truncated_trace_is_one_line_and_exit_2(tmp_path, capsys):
    path = save_trace(_trace(), tmp_path / "t.npz")
    path.write_bytes(path.read_bytes()[:100])
    assert main(["trace-stats", str(path)]) == 2
    err = capsys.readouterr().err
    assert "truncated or corrupt" in err and len(err.strip().splitlines()) == 1
