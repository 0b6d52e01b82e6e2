"""Routing capture (ndp_ep/routing.py, hw_model/routing_capture.py): a session's trace replays to the latencies
its reports gave, bit for bit; nothing is recorded unless asked; the memory a capture holds stays bounded."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ndp_ep
from hw_model.routing_capture import RoutingCapture
from hw_model.routing_trace_io import load_captured
from hw_model.trace_replay import replay
from ndp_ep.cli import main
from ndp_ep.errors import NdpEpError


@pytest.fixture
def feeds(samples_dir):
    return dict(np.load(samples_dir / "moe_decoder.inputs.npz"))


def _runs(sess, feeds, lengths):
    for length in lengths:
        sess.run(None, {"input_ids": feeds["input_ids"][:, :length]})


def test_session_trace_replays_to_its_reported_latencies_exactly(samples_dir, feeds):
    sess = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx", ndp_units=2, capture_routing=True)
    _runs(sess, feeds, [16, 1, 1, 3, 1])
    reports = sess.reports
    trace = sess.routing_trace()
    assert trace.num_steps == 5 and trace.header.settings["ndp_units"] == 2
    assert [layer.name for layer in trace.header.layers] == [r.name for r in reports[0].layers]
    for step, report in enumerate(reports):
        phase, layers, tokens, dense = trace.step(step)
        assert phase == report.phase and tokens == [layer.tokens for layer in report.layers]
        assert [list(row[: len(r.expert_tokens)]) for row, r in zip(dense, report.layers, strict=True)] == [
            list(r.expert_tokens) for r in report.layers
        ]
    replayed = replay(trace)
    assert list(replayed.step_s) == [r.simulated_latency_s for r in reports]  # to the bit
    assert replayed.total_s == sess.aggregates.simulated_s


def test_capture_costs_nothing_unless_asked(samples_dir, feeds):
    sess = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx")
    _runs(sess, feeds, [4, 1])
    assert sess.last_report is not None and sess.reporter.capture is None
    with pytest.raises(NdpEpError, match="capture_routing=True"):
        sess.routing_trace()


def test_trace_asked_before_any_report_holds_every_run(samples_dir, feeds):
    sess = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx")
    _runs(sess, feeds, [8, 1, 1])
    trace = sess.routing_trace()  # the provider's log still held the three runs
    assert trace.num_steps == 3 and list(replay(trace).step_s) == [r.simulated_latency_s for r in sess.reports]


def test_plain_onnxruntime_session_trace(samples_dir, feeds, tmp_path):
    import onnxruntime as ort

    converted = tmp_path / "m.onnx"
    ndp_ep.convert_model(samples_dir / "moe_decoder.onnx", converted)
    ndp_ep.register()
    sess = ort.InferenceSession(str(converted), ndp_ep.session_options(hw="paper", ndp_units=4))
    _runs(sess, feeds, [6, 1])
    trace = ndp_ep.routing_trace(sess)
    assert trace.num_steps == 2 and trace.header.settings["ndp_units"] == 4
    assert replay(trace).step_s[-1] == ndp_ep.last_report(sess).simulated_latency_s


def test_run_save_routing_replays_to_the_run_report(samples_dir, tmp_path, capsys):
    path = tmp_path / "r.npz"
    code = main(["run", str(samples_dir / "moe_decoder.onnx"), "--seq-len", "5", "--json", "--save-routing", str(path)])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    trace = load_captured(path)
    assert trace.header.source.startswith("ndp-ep run") and trace.header.versions["onnxruntime"]
    assert trace.steps.has_slots  # a model in one file: every slot's expert id and weight too
    assert replay(trace).total_s == report["simulated_latency_s"]


def test_save_routing_not_npz_is_refused_before_running(samples_dir, tmp_path, capsys):
    path = tmp_path / "r.json"
    assert main(["run", str(samples_dir / "moe_decoder.onnx"), "--save-routing", str(path)]) == 2
    err = capsys.readouterr().err
    assert ".npz" in err and len(err.strip().splitlines()) == 1 and not path.exists()


def _step(rng, layers: int, experts: int, top_k: int, tokens: int) -> np.ndarray:
    dense = np.zeros((layers, experts), dtype=np.int64)
    for layer in range(layers):
        for _ in range(tokens):
            dense[layer, rng.choice(experts, size=top_k, replace=False)] += 1
    return dense


def test_capture_memory_stays_bounded_over_a_512_plus_512_generation():
    layers, experts, top_k, limit = 48, 128, 8, 64 << 10
    rng = np.random.default_rng(0)
    capture = RoutingCapture(layers, experts, resident_bytes=limit)
    prefill = _step(rng, layers, experts, top_k, 512)
    decode = [_step(rng, layers, experts, top_k, 1) for _ in range(512)]
    one_step = 17 + layers * (4 + 8) + 2 * 4 * layers * experts  # the most one step can add
    peak = 0
    for index, dense in enumerate([prefill, *decode]):
        tokens = [512 if index == 0 else 1] * layers
        capture.add_step("prefill" if index == 0 else "decode", list(range(layers)), tokens, dense, 0.0, 1.0)
        peak = max(peak, capture.resident_bytes)
    assert peak <= limit + one_step
    assert capture.spooled_bytes > 4 * limit  # the rest went to the spool
    steps = capture.steps()
    assert steps.num_steps == 513
    cell = 100 * layers + 7  # step 100, layer 7: its slots' experts, each count 1
    lo, hi = steps.cell_offsets[cell], steps.cell_offsets[cell + 1]
    assert steps.experts[lo:hi].tolist() == np.flatnonzero(decode[99][7]).tolist()
    assert steps.counts[lo:hi].tolist() == [1] * top_k
    lo, hi = steps.cell_offsets[3], steps.cell_offsets[4]
    assert steps.counts[lo:hi].sum() == 512 * top_k
    capture.close()
    assert capture.spooled_bytes == 0 and capture.num_steps == 0


def test_bench_on_a_truncated_captured_trace_is_one_line_and_exit_2(samples_dir, tmp_path, capsys):
    path = tmp_path / "r.npz"
    assert main(["run", str(samples_dir / "moe_decoder.onnx"), "--seq-len", "3", "--save-routing", str(path)]) == 0
    path.write_bytes(path.read_bytes()[:-40])
    capsys.readouterr()
    assert main(["bench", "--trace", str(path)]) == 2
    err = capsys.readouterr().err
    assert "truncated or corrupt" in err and len(err.strip().splitlines()) == 1


def test_bench_on_a_run_trace_replays_the_run(samples_dir, tmp_path, capsys):
    path = tmp_path / "r.npz"
    argv = ["run", str(samples_dir / "moe_decoder.onnx"), "--seq-len", "6", "--ndp-units", "2", "--json"]
    assert main([*argv, "--save-routing", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(["bench", "--trace", str(path), "--ndp-units", "2", "--policies", "tp+lb+prefetch", "--json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert record["latency_s"] == report["simulated_latency_s"] and record["model"] == "moe_decoder"
    assert main(["bench", "--trace", str(path), "--models", "olmoe-1b-7b"]) == 2
    assert "--models names built-in models" in capsys.readouterr().err


def test_slots_capture_keeps_every_slots_expert_and_weight(samples_dir, feeds, tmp_path):
    from hw_model.routing_trace_io import save_trace

    plain = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx")
    sess = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx", capture_routing="slots")
    assert [o.name for o in sess.get_outputs()] == [o.name for o in plain.get_outputs()]
    for length in (7, 1, 1):
        ids = {"input_ids": feeds["input_ids"][:, :length]}
        ours, theirs = sess.run(None, ids), plain.run(None, ids)
        assert len(ours) == len(theirs) and np.array_equal(ours[0], theirs[0])
    trace = sess.routing_trace()
    steps = trace.steps
    assert steps.has_slots  # CapturedTrace checked each cell's slots against its counts
    top_k = trace.header.layers[0].top_k
    first = steps.routing_weights[: steps.slot_offsets[1]].reshape(-1, top_k)
    assert first.shape[0] == 7 and np.allclose(first.sum(axis=1), 1.0, atol=1e-5)  # renormalised top-k weights
    path = save_trace(trace, tmp_path / "a.npz")
    assert save_trace(load_captured(path), tmp_path / "b.npz").read_bytes() == path.read_bytes()
    assert replay(load_captured(path)).total_s == sess.aggregates.simulated_s


def test_capture_routing_option_is_checked(samples_dir):
    with pytest.raises(NdpEpError, match="capture_routing must be False, True or 'slots'"):
        ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx", capture_routing="ids")


def test_spooled_capture_reads_back_what_an_unspooled_one_holds():
    rng = np.random.default_rng(3)
    layers, width = 3, 6

    def slots_of(run_id):
        return [(np.array([run_id % width, (run_id + 1) % width]), np.array([0.75, 0.25]))] * layers

    captures = [RoutingCapture(layers, width, resident_bytes=limit) for limit in (1, 1 << 30)]
    for capture in captures:
        capture.slot_source = slots_of
    for step in range(40):
        kind = step % 4
        if kind == 3:  # a run with no MoE work
            args = ("unknown", None, (), None, 0.5, 0.5)
        else:
            chosen = [0, 1, 2] if kind < 2 else [0, 2]
            dense = np.zeros((len(chosen), width), dtype=np.int64)
            for row in range(len(chosen)):
                dense[row, [step % width, (step + 1) % width]] = 1
            args = ("decode", chosen, [1] * len(chosen), dense, float(rng.random()), 1.0)
        for capture in captures:
            capture.add_step(*args, run_id=step)
    spooled, held = (capture.steps() for capture in captures)
    assert captures[0].spooled_bytes > 0 and captures[1].spooled_bytes == 0
    for name, array in held.arrays().items():
        np.testing.assert_array_equal(spooled.arrays()[name], array, err_msg=name)
    assert held.has_slots and held.num_steps == 40
    from hw_model.routing_trace import CapturedTrace, TraceHeader, TraceLayer

    header = TraceHeader(layers=tuple(TraceLayer(f"l{i}", width, 2, 8, 8) for i in range(layers)), prompt_tokens=0,
                         new_tokens=30)  # fmt: skip
    CapturedTrace(header, spooled)  # every cell's slots match its counts
