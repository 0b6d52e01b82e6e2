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


def test_the_callers_session_settings_and_config_entries_reach_the_session_and_stay_on_its_object(block):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # a key the header defines over two lines (the first list missed every one of those)
    options.add_session_config_entry("session.disable_qdq_constant_folding", "1")
    session = ndp_ep.InferenceSession(block, options)
    copied = session.get_session_options()
    assert copied.get_session_config_entry("session.disable_qdq_constant_folding") == "1"
    assert copied.log_severity_level == 3  # the caller left ONNX Runtime's default: kept quiet, as without options
    assert copied.intra_op_num_threads == 1
    assert copied.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert copied.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    # ONNX Runtime answers this only when the entry reached the session
    claimed = {
        node.name
        for assignment in session.get_provider_graph_assignment_info()
        if assignment.ep_name == "NdpExecutionProvider"
        for node in assignment.get_nodes()
    }
    assert claimed == {c.name for c in session.reporter.claimed}
    with pytest.raises(Exception, match="session_key"):  # the provider went on a copy, not on the caller's object
        options.get_session_config_entry("ep.ndpexecutionprovider.session_key")


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


def test_a_requested_provider_the_session_does_not_use_is_named_in_a_warning(block):
    with pytest.warns(UserWarning, match="ignoring CUDAExecutionProvider, DmlExecutionProvider$"):
        session = ndp_ep.InferenceSession(
            block, None, [("CUDAExecutionProvider", {"device_id": 0}), "DmlExecutionProvider", "CPUExecutionProvider"]
        )
    assert session.get_providers() == ["NdpExecutionProvider", "CPUExecutionProvider"]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ndp_ep.InferenceSession(block, None, ["NdpExecutionProvider", "CPUExecutionProvider"])
    # options given to the NDP provider there would be dropped (the session takes them as keyword arguments)
    providers = ["NdpExecutionProvider", "CPUExecutionProvider"]
    with pytest.raises(ndp_ep.NdpEpError, match="hw=, ndp_units=, policy=, dtype= as keyword arguments"):
        ndp_ep.InferenceSession(block, None, providers, [{"hw": "edge", "ndp_units": "2"}, {}])
    with pytest.raises(ndp_ep.NdpEpError, match="as keyword arguments"):
        ndp_ep.InferenceSession(block, None, [("NdpExecutionProvider", {"policy": "monde"}), "CPUExecutionProvider"])


def test_a_zero_token_run_gets_a_report_of_its_own_without_expert_work(block):
    session = ndp_ep.InferenceSession(block)
    session.run(None, {"hidden_states": np.ones((1, 2, 64), np.float32)})
    (empty,) = session.run(None, {"hidden_states": np.ones((0, 2, 64), np.float32)})
    assert empty.shape == (0, 2, 64)
    report = session.last_report
    assert (report.run_index, report.tokens, report.layers, report.moe_s) == (1, 0, (), 0.0)
    assert any("no tokens" in note for note in report.notes)
    session.run(None, {"hidden_states": np.ones((1, 1, 64), np.float32)})
    assert [r.tokens for r in session.reports] == [2, 0, 1]


def test_options_that_already_carry_the_provider_are_refused_not_silently_overridden(block):
    with pytest.raises(ndp_ep.NdpEpError, match="already has NdpExecutionProvider added"):
        ndp_ep.InferenceSession(block, ndp_ep.session_options(hw="edge", ndp_units=2))
    other = ort.SessionOptions()
    other.add_provider("CPUExecutionProvider", {})
    with pytest.warns(UserWarning, match="providers added to sess_options are not used"):
        ndp_ep.InferenceSession(block, other)


def test_run_with_ort_values_is_reported_like_run_non_expert_work_included(samples_dir):
    decoder = samples_dir / "moe_decoder.onnx"
    ids = np.array([[3, 1, 4, 1, 5, 9]], np.int64)
    with_arrays = ndp_ep.InferenceSession(decoder)
    with_arrays.run(None, {"input_ids": ids})
    with_values = ndp_ep.InferenceSession(decoder)
    (logits,) = with_values.run_with_ort_values(None, {"input_ids": ort.OrtValue.ortvalue_from_numpy(ids)})
    assert logits.shape() == [1, 6, 128]
    expected, got = with_arrays.last_report, with_values.last_report
    assert got.non_expert_gpu_s > 0 and not any("untagged" in note for note in got.notes)
    assert (got.tokens, got.non_expert_gpu_s, got.simulated_latency_s) == (
        expected.tokens,
        expected.non_expert_gpu_s,
        expected.simulated_latency_s,
    )


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
    # ONNX Runtime's own answer: the provider got only the options the library reads (the reports keep the settings)
    own = {"NdpExecutionProvider": {"session_key": session.session_key}, "CPUExecutionProvider": {}}
    assert session.get_provider_options() == own


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
    from hw_model import HardwareConfigError, SettingsError
    from hw_model.policies import policy_names
    from ndp_ep.cli_args import MAX_NDP_UNITS

    known_policies = re.escape(", ".join(policy_names()))
    units = "EP option ndp_units: expected an integer from 1 to"
    return [
        ({"hw": "nope"}, HardwareConfigError, "^EP option hw: unknown hardware 'nope'"),
        ({"hw": _bad_hardware_file(tmp_path)}, HardwareConfigError, "^EP option hw: .*gpu.memory_bandwidth_bytes"),
        ({"ndp_units": 0}, SettingsError, f"^{units}"),
        ({"ndp_units": MAX_NDP_UNITS + 1}, SettingsError, f"^{units}"),
        ({"ndp_units": 10**9}, SettingsError, f"^{units}"),
        ({"ndp_units": "x"}, SettingsError, f"^{units}"),
        ({"policy": "nope"}, SettingsError, f"^unknown policy 'nope' \\(known: {known_policies}\\)$"),
        ({"dtype": "fp3"}, SettingsError, "^unknown dtype 'fp3'"),
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
    from hw_model import HardwareConfigError, SettingsError

    converted = tmp_path / "block.ndp.onnx"
    ndp_ep.convert_model(block, converted, shards=2)
    cases = [
        ("hw", "nope", HardwareConfigError, "^EP option hw: unknown hardware 'nope'"),
        ("hw", _bad_hardware_file(tmp_path), HardwareConfigError, "^EP option hw: .*gpu.memory_bandwidth_bytes"),
        ("ndp_units", "0", SettingsError, "^EP option ndp_units: expected an integer from 1 to"),
        ("ndp_units", "x", SettingsError, "^EP option ndp_units: expected an integer from 1 to"),
        ("policy", "nope", SettingsError, "^unknown policy 'nope'"),
    ]
    for key, value, error, words in cases:
        options = ort.SessionOptions()
        options.add_provider_for_devices(ndp_ep.devices(), {"session_key": f"raw-{key}", key: value})
        session = ort.InferenceSession(str(converted), options)
        with pytest.raises(error, match=words):
            ndp_ep.last_report(session)


def test_an_unknown_policy_or_unit_count_out_of_range_is_a_documented_typed_error(block):
    from hw_model import SettingsError
    from hw_model.policies import policy_names

    with pytest.raises(SettingsError, match="^unknown policy 'nope'") as refused:
        ndp_ep.InferenceSession(block, policy="nope")
    assert all(name in str(refused.value) for name in policy_names())
    for units in (0, 65, 10**9, True, 2.0):
        with pytest.raises(SettingsError, match="^ndp_units: expected an integer from 1 to 64"):
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


def test_concurrent_runs_on_one_session_are_each_reported_once_whole_while_others_read(samples_dir):
    from concurrent.futures import ThreadPoolExecutor

    session = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx", report_ring=256)
    rng = np.random.default_rng(8)
    feeds = [{"input_ids": rng.integers(0, 64, (1, int(n)), dtype=np.int64)} for n in rng.integers(1, 17, 160)]

    def run_and_sometimes_read(position: int) -> None:
        session.run(None, feeds[position])
        if position % 3 == 0:  # a read while other threads' runs are in flight
            session.last_report  # noqa: B018

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(run_and_sometimes_read, range(len(feeds))))
    reports, totals = session.reports, session.aggregates
    assert len(reports) == totals.runs == len(feeds)
    assert sorted(r.tokens for r in reports) == sorted(f["input_ids"].size for f in feeds)
    assert totals.tokens == sum(f["input_ids"].size for f in feeds)
    assert totals.layer_invocations == [len(feeds)] * 3
    assert all(len(r.layers) == 3 and all(layer.tokens == r.tokens for layer in r.layers) for r in reports)
    assert all(r.non_expert_gpu_s > 0 and not r.notes for r in reports)  # every run had its shapes
    assert totals.simulated_s == pytest.approx(sum(r.simulated_latency_s for r in reports))
    assert totals.non_expert_gpu_s == pytest.approx(sum(r.non_expert_gpu_s for r in reports))


class _ScriptedLog:
    """A reporter's routing log handing over scripted records, read by read: ``(run, layer, first expert)``, one
    token routed to the layer's top-k experts from the first on; ``dropped`` counts the records lost so far, per
    read."""

    def __init__(self, reporter, reads, dropped=None):
        self.reporter, self.reads = reporter, list(reads)
        self.width = max(layer.num_experts for layer in reporter.layers)
        self.lost = list(dropped or [0] * len(self.reads))
        self.dropped_so_far = 0

    def row(self, layer: int, first: int) -> list[int]:
        shape = self.reporter.layers[layer]
        counts = [0] * self.width
        for slot in range(shape.top_k):
            counts[(first + slot) % shape.num_experts] = 1
        return counts

    def take(self, _width):
        records = self.reads.pop(0) if self.reads else []
        self.dropped_so_far = self.lost.pop(0) if self.lost else self.dropped_so_far
        counts = np.array([self.row(layer, first) for _, layer, first in records], np.int32).reshape(-1, self.width)
        runs, layers = [run for run, _, _ in records], [layer for _, layer, _ in records]
        return runs, layers, [1] * len(records), counts.sum(axis=1).tolist(), counts

    def dropped(self):
        return self.dropped_so_far

    def layer_names(self):
        return [c.name for c in self.reporter.claimed]


def test_an_untagged_run_still_running_at_a_read_is_held_alone_and_reported_once_complete(samples_dir):
    session = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx")
    reporter = session.reporter
    # (run, layer, first expert): runs 1 and 2 (not tagged by this session) interleave and run 2 is still running
    # at the first read; run 3 runs whole before the second
    first_read = [(1, 0, 0), (2, 0, 1), (1, 1, 2), (1, 2, 3), (2, 1, 3)]
    second_read = [(2, 2, 5), (3, 0, 6), (3, 1, 1), (3, 2, 4)]
    log = reporter._reader = _ScriptedLog(reporter, [first_read, second_read])
    assert session.last_report.layers[2].expert_tokens == tuple(log.row(2, 3))  # run 1; run 2 is held
    assert reporter.aggregates.runs == 1  # the totals as they stand (session.aggregates would read again)
    session.last_report  # noqa: B018 - the second read: run 2 completes, then run 3
    assert reporter.aggregates.runs == 3
    by_run: dict[int, list] = {}
    for run, layer, first in first_read + second_read:
        by_run.setdefault(run, []).append(tuple(log.row(layer, first)[: reporter.layers[layer].num_experts]))
    assert [[layer.expert_tokens for layer in report.layers] for report in session.reports] == [
        by_run[run] for run in (1, 2, 3)
    ]


def test_a_tagged_run_is_held_until_it_returns_or_records_every_layer_and_keeps_its_shapes(samples_dir):
    session = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx")
    reporter = session.reporter
    for tag in (1, 2, 3):
        reporter.tag_run(tag, {"input_ids": (1, 1)})
    reporter.run_finished(2)  # run 2 failed after its first layer; runs 1 and 3 are still running
    first_read = [(1, 0, 0), (2, 0, 1), (1, 1, 2), (3, 0, 3), (3, 1, 4), (3, 2, 5)]
    second_read = [(1, 2, 6)]
    reporter._reader = _ScriptedLog(reporter, [first_read, second_read])
    assert [len(r.layers) for r in session.reports] == [1, 3]  # run 2 as far as it got, run 3 whole; run 1 held
    reporter.run_finished(1)
    reports = session.reports
    assert [[layer.index for layer in r.layers] for r in reports] == [[0], [0, 1, 2], [0, 1, 2]]
    assert all(r.non_expert_gpu_s > 0 and not r.notes for r in reports)  # each with the shapes it was tagged with


def test_tagged_runs_interleaved_and_read_at_any_point_are_each_reported_once_whole(samples_dir):
    session = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx", report_ring=64)
    reporter = session.reporter
    log = reporter._reader = _ScriptedLog(reporter, [])
    rng = np.random.default_rng(11)
    steps = {tag: ["start", 0, 1, 2, "return"] for tag in range(1, 41)}  # each run's steps, in its order
    started, pending = 0, []
    while steps:
        tag = int(rng.choice(list(steps)[:4]))  # up to four runs in flight at once
        step = steps[tag].pop(0)
        if not steps[tag]:
            del steps[tag]
        if step == "start":
            started += 1
            reporter.tag_run(tag, {"input_ids": (1, 1)})
        elif step == "return":
            reporter.run_finished(tag)
        else:
            pending.append((tag, step, tag % 5))
        if rng.random() < 0.3:  # another thread reads the reports now
            log.reads.append(pending)
            pending = []
            session.last_report  # noqa: B018
    log.reads.append(pending)
    reports = session.reports
    assert started == len(reports) == session.aggregates.runs == 40
    assert all([layer.index for layer in r.layers] == [0, 1, 2] and not r.notes for r in reports)


def test_runs_the_routing_log_cut_short_are_left_out_and_the_next_reports_say_so(samples_dir):
    session = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx", routing_capacity=4)
    feeds = {"input_ids": np.ones((1, 1), np.int64)}
    for _ in range(3):  # 9 records (3 layers each) into a log of 4: run 1 and two records of run 2 dropped
        session.run(None, feeds)
    totals = session.aggregates
    assert (totals.runs, totals.dropped_records, totals.dropped_runs) == (1, 5, 1)
    assert totals.layer_invocations == [1, 1, 1]
    (lost,) = [note for note in session.last_report.notes if "overflowed" in note]
    assert "5 records dropped unread since the previous report" in lost
    session.run(None, feeds)
    assert session.last_report.notes == () and session.aggregates.runs == 2


def test_a_run_held_across_an_overflow_is_left_out_when_it_ends_cut_short(samples_dir):
    session = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx")
    reporter = session.reporter
    for tag in (1, 2):
        reporter.tag_run(tag, {"input_ids": (1, 1)})
    reporter.run_finished(2)
    # run 1 is running at the first read, which finds records lost; its last layer was one of them
    first_read = [(1, 0, 0), (2, 0, 1), (2, 1, 2), (2, 2, 3)]
    reporter._reader = _ScriptedLog(reporter, [first_read, []], dropped=[2, 2])
    assert [len(r.layers) for r in session.reports] == [3]
    reporter.run_finished(1)
    assert reporter.aggregates.runs == 1 and session.aggregates.dropped_runs == 1


def test_the_phase_follows_the_tokens_of_each_sequence_not_the_token_slots(samples_dir):
    decoder = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx")
    block = ndp_ep.InferenceSession(samples_dir / "moe_block.onnx")
    seen = []
    for session, name, shape, dtype in [
        (decoder, "input_ids", (2, 1), np.int64),  # two sequences, one new token each
        (decoder, "input_ids", (1, 2), np.int64),  # one sequence of two tokens
        (block, "hidden_states", (2, 1, 64), np.float32),
        (block, "hidden_states", (1, 2, 64), np.float32),
    ]:
        session.run(None, {name: np.ones(shape, dtype)})
        report = session.last_report
        seen.append((report.phase, report.tokens))
    assert seen == [("decode", 2), ("prefill", 2), ("decode", 2), ("prefill", 2)]
    summary = decoder.last_report.simulator
    assert (summary["invocations_decode"], summary["invocations_prefill"]) == (3, 3)  # simulated as reported


def test_a_configuration_that_does_not_fit_says_so_and_why_in_its_reports(samples_dir):
    import dataclasses
    import json

    from hw_model import load_system

    paper = load_system("paper", 4)
    tiny_dimms = dataclasses.replace(paper, ndp_unit=dataclasses.replace(paper.ndp_unit, memory_capacity_bytes=1e5))
    session = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx", hw=tiny_dimms)
    session.run(None, {"input_ids": np.ones((1, 4), np.int64)})
    report = session.last_report
    # 20 experts (8 + 4 + 8) of gate, up and down 64 x 128 in bf16, sliced over 4 DIMMs: 245760 B = 240.0 KiB;
    # a DIMM holds 1e5 B = 97.7 KiB
    expected = "experts need 240.0 KiB per DIMM, a DIMM holds 97.7 KiB (4 DIMMs)"
    (note,) = [note for note in report.notes if "does not fit" in note]
    assert note.endswith(expected) and report.simulator["infeasible_reason"] == expected
    assert f"note: {note}" in report.format_text() and note in json.loads(json.dumps(report.to_json()))["notes"]
    tiny_gpu = dataclasses.replace(paper, gpu=dataclasses.replace(paper.gpu, memory_capacity_bytes=1e4))
    session = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx", hw=tiny_gpu)
    session.run(None, {"input_ids": np.ones((1, 4), np.int64)})
    (note,) = [note for note in session.last_report.notes if "does not fit" in note]
    assert "leave no GPU memory for experts (of the 8.8 KiB usable)" in note  # 90 % of 1e4 B


def test_identical_run_sequences_give_identical_report_json(samples_dir):
    def reports_of_a_fresh_session() -> list[dict]:
        session = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx")
        for tokens in (8, 1, 1):
            session.run(None, {"input_ids": np.arange(tokens, dtype=np.int64)[None, :]})
        return [report.to_json() for report in session.reports]

    first, second = reports_of_a_fresh_session(), reports_of_a_fresh_session()
    assert first == second and "decision_time_median_s" not in first[-1]["simulator"]


def test_a_reused_run_options_is_left_as_it_was_and_runs_without_warnings(samples_dir, capfd):
    session = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx")
    options = ort.RunOptions()
    options.logid = "caller"
    capfd.readouterr()
    for _ in range(3):
        session.run(None, {"input_ids": np.ones((1, 2), np.int64)}, options)
    assert "already exists" not in capfd.readouterr().err
    assert options.logid == "caller"
    with pytest.raises(Exception, match="does not have configuration"):  # not tagged by the runs
        options.get_run_config_entry("ep.ndpexecutionprovider.run_tag")
    assert [r.tokens for r in session.reports] == [2, 2, 2]
    assert all(r.non_expert_gpu_s > 0 and not r.notes for r in session.reports)


def test_setting_terminate_on_the_callers_run_options_cancels_a_run_in_progress(tmp_path):
    import threading
    import time

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((512, 512)) / 23).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", [f"h{i}", "w"], [f"h{i + 1}"]) for i in range(100)]  # ~0.3 s on one core
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("h0", TensorProto.FLOAT, [256, 512])],
        [helper.make_tensor_value_info("h100", TensorProto.FLOAT, [256, 512])],
        [weight],
    )
    path = tmp_path / "chain.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ndp_ep.InferenceSession(path, options)
    feeds = {"h0": np.ones((256, 512), np.float32)}
    for run in (session.run, lambda names, feed, o: session.run_with_ort_values(names, _ort_values(feed), o)):
        run_options = ort.RunOptions()
        threading.Timer(0.03, lambda o=run_options: setattr(o, "terminate", True)).start()
        started = time.perf_counter()
        with pytest.raises(ndp_ep.RunError, match="terminate"):  # ONNX Runtime watches the caller's own object
            run(None, feeds, run_options)
        assert time.perf_counter() - started < 5


def _ort_values(feeds):
    return {name: ort.OrtValue.ortvalue_from_numpy(value) for name, value in feeds.items()}


def test_a_terminated_run_options_still_stops_the_run(samples_dir):
    session = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx")
    options = ort.RunOptions()
    options.terminate = True
    with pytest.raises(ndp_ep.RunError, match="terminate"):
        session.run(None, {"input_ids": np.ones((1, 2), np.int64)}, options)


def test_one_run_options_shared_by_threads_gives_each_run_its_own_report(samples_dir):
    from concurrent.futures import ThreadPoolExecutor

    session = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx", report_ring=256)
    options = ort.RunOptions()
    options.log_severity_level = 3
    lengths = [1 + 5 * (position % 4) for position in range(100)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda n: session.run(None, {"input_ids": np.ones((1, n), np.int64)}, options), lengths))
    reports = session.reports
    assert sorted(r.tokens for r in reports) == sorted(lengths)
    assert all(len(r.layers) == 3 and r.non_expert_gpu_s > 0 and not r.notes for r in reports)


@pytest.mark.parametrize("ring", [True, 0, None, 2.0])
def test_report_ring_must_be_a_positive_integer_and_not_a_bool(block, ring):
    with pytest.raises(ndp_ep.NdpEpError, match="^report_ring must be a positive integer"):
        ndp_ep.InferenceSession(block, report_ring=ring)


@pytest.mark.parametrize("capacity", [True, 0, 2.0])
def test_routing_capacity_must_be_a_positive_integer(block, capacity):
    with pytest.raises(ndp_ep.NdpEpError, match="^routing_capacity must be a positive integer"):
        ndp_ep.InferenceSession(block, routing_capacity=capacity)
