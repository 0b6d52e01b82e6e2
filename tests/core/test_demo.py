"""``ndp-ep demo``: the baseline comparison is computed from the runs, worded correctly and laid out in columns."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ndp_ep.cli import main
from ndp_ep.commands.demo import PolicyRun, baseline_policies, faster_or_slower


@pytest.fixture(scope="module")
def demo_json() -> dict:
    import contextlib
    import io

    stream = io.StringIO()
    with contextlib.redirect_stdout(stream):
        assert main(["demo", "--decode-steps", "3", "--json"]) == 0
    return json.loads(stream.getvalue())


@pytest.fixture(scope="module")
def demo_text() -> str:
    import contextlib
    import io

    stream = io.StringIO()
    with contextlib.redirect_stdout(stream):
        assert main(["demo", "--decode-steps", "3"]) == 0
    return stream.getvalue()


def test_demo_replays_the_same_request_under_each_baseline(demo_json):
    assert [b["policy"] for b in demo_json["baselines"]] == list(baseline_policies())
    assert demo_json["parity"]["ok"] and demo_json["parity"]["max_rel_error"] <= 1e-5
    assert demo_json["request"] == {"prompt_tokens": 16, "generated_tokens": 3}
    runs = demo_json["baselines"] + [demo_json["ours"]]
    # the same request: every policy places the same expert activations, only where they run differs
    assert len({sum(r["expert_runs"].values()) for r in runs}) == 1
    for run in runs:
        assert run["total_s"] == pytest.approx(run["prompt_s"] + 3 * run["per_token_s"])


def test_strongest_baseline_is_the_lowest_total_and_the_speedup_is_its_ratio(demo_json):
    totals = {b["policy"]: b["total_s"] for b in demo_json["baselines"]}
    strongest = min(totals, key=totals.get)
    assert demo_json["strongest_baseline"] == strongest
    assert demo_json["speedup_over_strongest"] == pytest.approx(totals[strongest] / demo_json["ours"]["total_s"])


def test_demo_text_explains_what_ran_what_is_simulated_and_the_units_once(demo_text, demo_json):
    assert demo_text.count("What ran:") == 1 and demo_text.count("What is simulated:") == 1
    assert demo_text.count("simulated milliseconds") == 1 and "costed as bf16" in demo_text
    strongest = demo_json["strongest_baseline"]
    assert f"{strongest} (strongest baseline)" in demo_text and "tp+lb+prefetch (ours)" in demo_text
    speedup = demo_json["speedup_over_strongest"]
    word = "faster" if speedup >= 1 else "slower"
    ratio = speedup if speedup >= 1 else 1 / speedup
    assert f"Ours is {ratio:.2f}x {word} than {strongest}:" in " ".join(demo_text.split())
    assert "prefetched" in demo_text and "expert run" in demo_text
    assert not re.search(r"\b1 (tokens|experts|nodes|layers|units)\b", demo_text)
    assert max(len(line) for line in demo_text.splitlines()) <= 80


def test_demo_json_lists_no_file_it_did_not_keep_and_every_file_it_kept(demo_json, tmp_path, capsys):
    assert demo_json["conversion"]["files"] == []  # converted into a temporary folder, gone when it prints
    assert main(["demo", "--decode-steps", "0", "--json", "--out", str(tmp_path)]) == 0
    files = json.loads(capsys.readouterr().out)["conversion"]["files"]
    assert files == [str(tmp_path / "moe_decoder.ndp.onnx")] and all(Path(f).is_file() for f in files)


def test_a_demo_without_decode_steps_says_so_in_words(capsys):
    assert main(["demo", "--decode-steps", "0"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "a prompt of 16 tokens, and no generated token." in text and "0 tokens" not in text


def test_demo_table_columns_are_aligned(demo_text):
    lines = demo_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("policy"))
    rows = lines[start + 2 : start + 2 + len(baseline_policies()) + 1]
    assert rows[-1].lstrip().startswith("tp+lb+prefetch (ours)")
    for column in range(3):  # prompt, per token, total: right-aligned, so the decimal points line up
        ends = {m[column].end() for m in (list(re.finditer(r"\d+\.\d{3}", row)) for row in rows)}
        assert len(ends) == 1, rows


def test_faster_or_slower_words_the_ratio():
    assert faster_or_slower(2.0, 1.0) == "2.00x faster"
    assert faster_or_slower(1.0, 1.25) == "1.25x slower"
    assert faster_or_slower(1.0, 1.0) == "1.00x faster"


def test_policy_run_rejects_negative_latency():
    with pytest.raises(ValueError, match="negative"):
        PolicyRun("x", -1.0, (), 0, 0, 0, 0.0, {})
