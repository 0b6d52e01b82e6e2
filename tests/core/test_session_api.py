"""``ndp_ep.InferenceSession`` behaves like ONNX Runtime's session and raises typed errors on bad input."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import ndp_ep
from ndp_ep.errors import FeedError, ModelLoadError


@pytest.fixture
def block(samples_dir):
    return samples_dir / "moe_block.onnx"


def test_signature_and_output_selection_follow_onnx_runtime(block):
    ours = ndp_ep.InferenceSession(block)
    stock = ort.InferenceSession(str(block), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type, i.shape) for i in ours.get_inputs()] == [
        (i.name, i.type, i.shape) for i in stock.get_inputs()
    ]
    assert [o.name for o in ours.get_outputs()] == [o.name for o in stock.get_outputs()]
    assert ours.get_providers()[0] == "NdpExecutionProvider"
    feeds = {"hidden_states": np.random.default_rng(0).standard_normal((2, 3, 64)).astype(np.float32)}
    (selected,) = ours.run(["output"], feeds)
    assert selected.shape == (2, 3, 64)


def test_one_session_options_object_serves_several_sessions(block):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    first = ndp_ep.InferenceSession(block, sess_options=options)
    second = ndp_ep.InferenceSession(block, sess_options=options)
    feeds = {"hidden_states": np.ones((1, 2, 64), np.float32)}
    np.testing.assert_array_equal(first.run(None, feeds)[0], second.run(None, feeds)[0])
    assert second.get_session_options().intra_op_num_threads == 1


def test_bad_feeds_and_models_raise_typed_errors(block, tmp_path):
    session = ndp_ep.InferenceSession(block)
    with pytest.raises(FeedError, match="unknown input 'x'"):
        session.run(None, {"x": np.ones((1, 2, 64), np.float32)})
    with pytest.raises(FeedError, match="missing input 'hidden_states'"):
        session.run(None, {})
    with pytest.raises(FeedError, match="must be float32"):
        session.run(None, {"hidden_states": np.ones((1, 2, 64), np.float64)})
    with pytest.raises(ModelLoadError):
        ndp_ep.InferenceSession(tmp_path / "absent.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_text("not a model")
    with pytest.raises(ModelLoadError, match="not an ONNX model"):
        ndp_ep.InferenceSession(junk)


def test_reports_follow_the_routing_of_each_run_in_order(block):
    session = ndp_ep.InferenceSession(block, hw="paper", ndp_units=2)
    assert session.last_report is None
    rng = np.random.default_rng(3)
    for tokens in (5, 1, 1):
        session.run(None, {"hidden_states": rng.standard_normal((1, tokens, 64)).astype(np.float32)})
    reports = session.reports
    assert [(r.run_index, r.phase, r.tokens) for r in reports] == [
        (0, "prefill", 5),
        (1, "decode", 1),
        (2, "decode", 1),
    ]
    assert all(sum(r.layers[0].expert_tokens) == r.tokens * 2 for r in reports)
    assert reports[-1].ndp_units == 2 and reports[-1].simulated_latency_s > 0
    assert reports[-1].simulator["invocations_decode"] == 2


def test_a_reports_simulator_summary_is_as_of_its_run_when_read_later(block):
    session = ndp_ep.InferenceSession(block, hw="paper", ndp_units=2)
    rng = np.random.default_rng(4)
    latencies = []
    for tokens in (6, 1, 1, 1):
        session.run(None, {"hidden_states": rng.standard_normal((1, tokens, 64)).astype(np.float32)})
        latencies.append(session.simulator.summary()["expert_latency_decode_s"])
    summaries = [report.simulator for report in session.reports]  # read after every run was simulated
    assert [s["invocations_prefill"] for s in summaries] == [1, 1, 1, 1]
    assert [s["invocations_decode"] for s in summaries] == [0, 1, 2, 3]
    assert [s["expert_latency_decode_s"] for s in summaries] == latencies
    measured = {"decision_time_median_s"}  # the packer's wall time: in the simulator's summary, not in reports
    assert summaries[-1] == {k: v for k, v in session.simulator.summary().items() if k not in measured}
    assert session.reports[1].simulator is summaries[1]  # built once


def test_converted_and_unconverted_models_give_the_same_outputs(block, tmp_path):
    converted = tmp_path / "block.ndp.onnx"
    ndp_ep.convert_model(block, converted, shards=2)
    feeds = {"hidden_states": np.random.default_rng(1).standard_normal((1, 4, 64)).astype(np.float32)}
    direct = ndp_ep.InferenceSession(block, shards=2).run(None, feeds)[0]
    from_file = ndp_ep.InferenceSession(converted).run(None, feeds)[0]
    np.testing.assert_allclose(direct, from_file, rtol=0, atol=1e-6)


def test_gpu_memory_reserved_for_non_expert_weights_excludes_the_experts(samples_dir):
    import onnx

    session = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx", dtype="bf16")
    original = onnx.load(samples_dir / "moe_decoder.onnx")
    kept = {t.name for t in session.converted_model.graph.initializer}  # the rewrite drops dead shape constants
    non_expert = sum(
        int(np.prod(t.dims)) for t in original.graph.initializer if "experts" not in t.name and t.name in kept
    )
    assert session._non_expert_weight_bytes(session.converted_model) == 2 * non_expert  # bf16


def test_onnx_runtime_positional_order_bytes_and_model_protos_are_accepted(block):
    import onnx

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    feeds = {"hidden_states": np.random.default_rng(2).standard_normal((1, 3, 64)).astype(np.float32)}
    from_path = ndp_ep.InferenceSession(str(block), options, ["CPUExecutionProvider"]).run(None, feeds)[0]
    from_bytes = ndp_ep.InferenceSession(block.read_bytes()).run(None, feeds)[0]
    from_proto = ndp_ep.InferenceSession(onnx.load(block)).run(None, feeds)[0]
    np.testing.assert_array_equal(from_path, from_bytes)
    np.testing.assert_array_equal(from_path, from_proto)


def test_get_providers_is_the_real_sessions_and_onnx_runtime_methods_are_delegated(block):
    session = ndp_ep.InferenceSession(block)
    assert session.get_providers() == ["NdpExecutionProvider", "CPUExecutionProvider"]
    feeds = {"hidden_states": np.ones((1, 2, 64), np.float32)}
    binding = session.io_binding()
    binding.bind_cpu_input("hidden_states", feeds["hidden_states"])
    binding.bind_output("output")
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], session.run(None, feeds)[0])
    value = ort.OrtValue.ortvalue_from_numpy(feeds["hidden_states"])
    (result,) = session.run_with_ort_values(["output"], {"hidden_states": value})
    np.testing.assert_array_equal(result.numpy(), session.run(None, feeds)[0])
    assert isinstance(session.get_provider_options(), dict)


def test_feeds_that_are_not_a_mapping_raise_feed_error(block):
    session = ndp_ep.InferenceSession(block)
    for feeds in (None, [np.ones((1, 2, 64), np.float32)]):
        with pytest.raises(FeedError, match="mapping"):
            session.run(None, feeds)


def test_bad_model_arguments_raise_typed_errors(block):
    with pytest.raises(ModelLoadError, match="not an ONNX model"):
        ndp_ep.InferenceSession(b"junk bytes")
    with pytest.raises(ModelLoadError, match="expected a model path"):
        ndp_ep.InferenceSession(42)
    with pytest.raises(ndp_ep.NdpEpError, match="shards must be a positive integer"):
        ndp_ep.InferenceSession(block, shards=0)


def test_strict_conversion_of_a_skipped_block_raises_conversion_error(samples_dir):
    skipped = samples_dir / "hf" / "mixtral_block_eager_torchscript.onnx"  # eager-unrolled: never rewritten
    with pytest.raises(ndp_ep.ConversionError, match="strict"):
        ndp_ep.InferenceSession(skipped, strict=True)
    session = ndp_ep.InferenceSession(skipped)
    feeds = dict(np.load(samples_dir / "hf" / "mixtral_block_eager_torchscript.inputs.npz"))
    session.run(None, feeds)
    report_notes = session.last_report.notes
    assert any("was not converted" in note and "costed on the GPU" in note for note in report_notes)
    assert session.last_report.non_expert_gpu_s > 0


def test_reports_live_in_a_bounded_ring_with_running_totals(block):
    session = ndp_ep.InferenceSession(block, report_ring=3)
    rng = np.random.default_rng(4)
    token_counts = [1, 2, 3, 4, 5]
    for tokens in token_counts:
        session.run(None, {"hidden_states": rng.standard_normal((1, tokens, 64)).astype(np.float32)})
    reports = session.reports
    assert [r.tokens for r in reports] == token_counts[-3:]
    assert [r.run_index for r in reports] == [2, 3, 4]
    totals = session.aggregates
    assert totals.runs == 5 and totals.tokens == sum(token_counts)
    assert totals.layer_expert_tokens == [2 * sum(token_counts)]  # top-2
    assert totals.simulated_s >= sum(r.simulated_latency_s for r in reports) > 0


def test_a_report_reads_the_same_before_and_after_its_layers_are_built(samples_dir):
    import dataclasses

    import onnx

    from graph_passes.feeds import random_feeds
    from ndp_ep.report import RunReport

    model = samples_dir / "moe_decoder.onnx"
    session = ndp_ep.InferenceSession(model, hw="paper")
    proto = onnx.load(str(model), load_external_data=False)
    for seed, tokens in enumerate((4, 1, 1)):
        session.run(None, random_feeds(proto, seed=seed, seq_len=tokens))
    reports = session.reports
    totals = [(r.moe_s, r.simulated_latency_s) for r in reports]  # read before any report's layers
    for report, (moe_s, simulated_s) in zip(reports, totals, strict=True):
        summed = 0.0
        for layer in report.layers:
            summed += layer.latency_s
        assert (moe_s, simulated_s) == (summed, report.non_expert_gpu_s + summed)
        whole = RunReport(**{f.name: getattr(report, f.name) for f in dataclasses.fields(RunReport)})
        assert whole == report and whole.to_json() == report.to_json() and str(whole) == str(report)
    by_layer = [[layer.expert_tokens for layer in r.layers] for r in reports]
    assert session.aggregates.layer_expert_tokens == [sum(sum(run[i]) for run in by_layer) for i in range(3)]
    assert session.aggregates.moe_s == sum(moe_s for moe_s, _ in totals)


def test_a_plain_onnx_runtime_session_gets_its_report_from_the_providers_routing(block, tmp_path):
    converted = tmp_path / "block.ndp.onnx"
    ndp_ep.convert_model(block, converted, shards=2)
    options = ndp_ep.session_options(hw="paper", ndp_units=2)
    session = ort.InferenceSession(str(converted), options)
    assert ndp_ep.last_report(session) is None
    ids_seen = []
    rng = np.random.default_rng(6)
    for tokens in (3, 1):
        session.run(None, {"hidden_states": rng.standard_normal((1, tokens, 64)).astype(np.float32)})
        report = ndp_ep.last_report(session)
        ids_seen.append((report.tokens, report.phase, report.ndp_units, sum(report.layers[0].expert_tokens)))
    assert ids_seen == [(3, "prefill", 2, 6), (1, "decode", 2, 2)]
    assert any("input shapes are unknown" in note for note in report.notes)


KNOWN_EP_OPTIONS = "hw, ndp_units, policy, dtype, session_key, routing_capacity, record_routing"  # docs/provider.md


def _bad_hardware_file(tmp_path) -> str:
    path = tmp_path / "bad.toml"
    path.write_text(
        (Path(ndp_ep.__file__).parents[1] / "hw_model" / "presets" / "paper.toml")
        .read_text()
        .replace("memory_bandwidth_bytes_per_s = 960e9", "memory_bandwidth_bytes_per_s = -1.0")
    )
    return str(path)


def _option_cases(tmp_path) -> list[tuple[dict, type, str]]:
    """(EP options, error type, words of its message) for every kind of bad option."""
    from hw_model import HardwareConfigError
    from hw_model.policies import policy_names
    from ndp_ep.cli_args import MAX_NDP_UNITS

    known_policies = re.escape(", ".join(policy_names()))
    units = "EP option ndp_units: expected an integer from 1 to"
    return [
        ({"hw": "nope"}, HardwareConfigError, "^EP option hw: unknown hardware 'nope'"),
        ({"hw": _bad_hardware_file(tmp_path)}, HardwareConfigError, "^EP option hw: .*gpu.memory_bandwidth_bytes"),
        ({"ndp_units": 0}, HardwareConfigError, f"^{units}"),
        ({"ndp_units": MAX_NDP_UNITS + 1}, HardwareConfigError, f"^{units}"),
        ({"ndp_units": 10**9}, HardwareConfigError, f"^{units}"),
        ({"ndp_units": "x"}, HardwareConfigError, f"^{units}"),
        ({"policy": "nope"}, ndp_ep.NdpEpError, f"^unknown policy 'nope' \\(known: {known_policies}\\)$"),
        ({"dtype": "fp3"}, ndp_ep.NdpEpError, "^unknown dtype 'fp3'"),
        ({"bogus": 1}, ndp_ep.NdpEpError, f"^unknown EP option 'bogus' \\(known: {KNOWN_EP_OPTIONS}\\)$"),
        ({"routing_capacity": 0}, ndp_ep.NdpEpError, "routing_capacity must be a positive integer"),
        ({"record_routing": False}, ndp_ep.NdpEpError, "record_routing must be 0 or 1, got 'False'"),
    ]


def test_session_options_refuses_each_bad_option_with_a_typed_error_and_adds_nothing(tmp_path):
    for ep_options, error, words in _option_cases(tmp_path):
        options = ort.SessionOptions()
        with pytest.raises(error, match=words):
            ndp_ep.session_options(options, **ep_options)
        with pytest.raises(Exception, match="session_key"):  # the provider was not added: no key was set
            options.get_session_config_entry("ep.ndpexecutionprovider.session_key")
    good = ndp_ep.session_options(hw="paper", ndp_units=64, policy="monde", dtype="fp16", record_routing=0)
    assert good.get_session_config_entry("ep.ndpexecutionprovider.ndp_units") == "64"


def test_raw_provider_entries_get_the_same_typed_errors_naming_the_option_at_the_report(block, tmp_path):
    from hw_model import HardwareConfigError

    converted = tmp_path / "block.ndp.onnx"
    ndp_ep.convert_model(block, converted, shards=2)
    cases = [
        ("hw", "nope", HardwareConfigError, "^EP option hw: unknown hardware 'nope'"),
        ("hw", _bad_hardware_file(tmp_path), HardwareConfigError, "^EP option hw: .*gpu.memory_bandwidth_bytes"),
        ("ndp_units", "0", HardwareConfigError, "^EP option ndp_units: expected an integer from 1 to"),
        ("ndp_units", "x", HardwareConfigError, "^EP option ndp_units: expected an integer from 1 to"),
        ("policy", "nope", ndp_ep.NdpEpError, "^unknown policy 'nope'"),
    ]
    for key, value, error, words in cases:
        options = ort.SessionOptions()
        options.add_provider_for_devices(ndp_ep.devices(), {"session_key": f"raw-{key}", key: value})
        session = ort.InferenceSession(str(converted), options)
        with pytest.raises(error, match=words):
            ndp_ep.last_report(session)


def test_an_unknown_policy_or_unit_count_out_of_range_is_a_documented_typed_error(block):
    from hw_model import HardwareConfigError
    from hw_model.policies import policy_names

    with pytest.raises(ndp_ep.NdpEpError, match="^unknown policy 'nope'") as refused:
        ndp_ep.InferenceSession(block, policy="nope")
    assert all(name in str(refused.value) for name in policy_names())
    for units in (0, 65, 10**9, True, 2.0):
        with pytest.raises(HardwareConfigError, match="^ndp_units: expected an integer from 1 to 64"):
            ndp_ep.InferenceSession(block, ndp_units=units)


def test_run_with_ort_values_raises_feed_error_for_feeds_that_do_not_fit(block):
    session = ndp_ep.InferenceSession(block)
    value = ort.OrtValue.ortvalue_from_numpy
    cases = [
        ({"hidden_states": value(np.ones((1, 2, 64), np.float64))}, "must be float32, got float64"),
        ({"hidden_states": value(np.ones((1, 2, 63), np.float32))}, "dimension 2 must be 64"),
        ({"x": value(np.ones((1, 2, 64), np.float32))}, "unknown input 'x'"),
        ({"hidden_states": np.ones((1, 2, 64), np.float32)}, "must be an onnxruntime.OrtValue, got ndarray"),
        ([np.ones((1, 2, 64), np.float32)], "mapping"),
    ]
    for feeds, words in cases:
        with pytest.raises(FeedError, match=words):
            session.run_with_ort_values(["output"], feeds)


def test_run_with_ort_values_raises_run_error_when_the_model_fails_on_fitting_feeds(samples_dir):
    session = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx")
    ids = ort.OrtValue.ortvalue_from_numpy(np.full((1, 3), 10**6, np.int64))  # beyond any vocabulary
    with pytest.raises(ndp_ep.RunError, match="^the model failed while running: [^\\n]*Gather"):
        session.run_with_ort_values(None, {"input_ids": ids})


def test_a_session_without_a_key_cannot_be_reported_on(block, tmp_path):
    converted = tmp_path / "block.ndp.onnx"
    ndp_ep.convert_model(block, converted, shards=2)
    options = ort.SessionOptions()
    options.add_provider_for_devices(ndp_ep.devices(), {"hw": "paper"})
    session = ort.InferenceSession(str(converted), options)
    session.run(None, {"hidden_states": np.ones((1, 2, 64), np.float32)})
    with pytest.raises(ndp_ep.NdpEpError, match="session key"):
        ndp_ep.last_report(session)


def test_the_library_path_honours_the_environment_and_fails_in_one_line(monkeypatch, tmp_path):
    from ndp_ep import ep

    assert ndp_ep.get_ep_name() == "NdpExecutionProvider"
    assert ndp_ep.get_library_path().endswith("libndp_ep.so")
    monkeypatch.setenv(ep.LIBRARY_ENV, str(tmp_path / "missing.so"))
    with pytest.raises(ep.LibraryNotFoundError, match="missing.so is not a file"):
        ep.get_library_path()


def test_concurrent_runs_on_one_session_are_each_reported_once(samples_dir):
    from concurrent.futures import ThreadPoolExecutor

    session = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx", report_ring=16)
    rng = np.random.default_rng(8)
    feeds = [{"input_ids": rng.integers(0, 64, (1, int(n)), dtype=np.int64)} for n in rng.integers(1, 6, 80)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda f: session.run(None, f), feeds))
    totals = session.aggregates
    assert totals.runs == 80 and totals.tokens == sum(f["input_ids"].size for f in feeds)
    assert totals.layer_invocations == [80, 80, 80]
    assert len(session.reports) == 16
    assert all(r.non_expert_gpu_s > 0 and not r.notes for r in session.reports)  # every run had its shapes


def test_a_run_still_running_at_a_read_is_held_alone_and_reported_once_complete(samples_dir):
    session = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx")
    reporter = session.reporter
    names = [c.name for c in reporter.claimed]
    width = max(layer.num_experts for layer in reporter.layers)

    def row(layer: int, first: int) -> list[int]:  # one token routed to top_k experts from `first` on
        shape = reporter.layers[layer]
        counts = [0] * width
        for slot in range(shape.top_k):
            counts[(first + slot) % shape.num_experts] = 1
        return counts

    class Reader:  # what the library would hand over, read by read
        def __init__(self, reads):
            self.reads = list(reads)

        def take(self, _width):
            records = self.reads.pop(0) if self.reads else []
            counts = np.array([row(layer, first) for _, layer, first in records], np.int32).reshape(-1, width)
            runs, layers = [run for run, _, _ in records], [layer for _, layer, _ in records]
            return runs, layers, [1] * len(records), counts.sum(axis=1).tolist(), counts

        def dropped(self):
            return 0

        def layer_names(self):
            return names

    # (run, layer, first expert): runs 1 and 2 interleave and run 2 is still running at the first read; run 3
    # runs whole before the second
    first_read = [(1, 0, 0), (2, 0, 1), (1, 1, 2), (1, 2, 3), (2, 1, 3)]
    second_read = [(2, 2, 5), (3, 0, 6), (3, 1, 1), (3, 2, 4)]
    reporter._reader = Reader([first_read, second_read])
    assert session.last_report.layers[2].expert_tokens == tuple(row(2, 3))  # run 1; run 2 is held
    assert reporter.aggregates.runs == 1  # the totals as they stand (session.aggregates would read again)
    session.last_report  # noqa: B018 - the second read: run 2 completes, then run 3
    assert reporter.aggregates.runs == 3
    by_run: dict[int, list] = {}
    for run, layer, first in first_read + second_read:
        by_run.setdefault(run, []).append(tuple(row(layer, first)[: reporter.layers[layer].num_experts]))
    assert [[layer.expert_tokens for layer in report.layers] for report in session.reports] == [
        by_run[run] for run in (1, 2, 3)
    ]
