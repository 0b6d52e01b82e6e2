"""``ndp_ep.InferenceSession`` behaves like ONNX Runtime's session and raises typed errors on bad input."""

from __future__ import annotations

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
