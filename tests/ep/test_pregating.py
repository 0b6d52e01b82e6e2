"""Pre-gating (ndp_ep/pregating.py, ``InferenceSession(pre_gating=True)``): each layer's router applied to the previous
layer's hidden state predicts its experts a layer ahead. The caller's outputs are those of a plain session; the hit
rate the reports give is the one numpy computes from the hidden states and the routers' weights; a hidden state
that does not change hits every slot, one negated between the layers none; a router it does not recognise gets no
predictor, with the reason; a look-ahead policy's prefetcher gets the predictions."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ndp_ep
from ndp_ep.errors import NdpEpError
from sample_models.build_samples import GraphBuilder, MoEBlockSpec, add_moe_block

MIXTRAL = "hf/mixtral_model_torchscript.onnx"
SAMPLES = ("moe_decoder.onnx", MIXTRAL)


def _feeds(samples_dir, name: str) -> dict:
    return dict(np.load(samples_dir / name.replace(".onnx", ".inputs.npz")))


def _ops(model) -> list:
    return [node for node in model.graph.node if node.op_type == "ShardedMoEExperts"]


def _hidden_and_ids(converted, feeds) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every sharded op's hidden state (input 0) and expert ids (input 1) of a run, fetched as graph outputs of a copy
    run in a plain ONNX Runtime session with the provider (not through the pre-gating)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(converted)
    names = [(op.input[0], op.input[1]) for op in _ops(copy)]
    for pair in names:
        for name in pair:
            copy.graph.output.add().name = name
    import onnxruntime as ort

    ndp_ep.register()
    plain = ort.InferenceSession(copy.SerializeToString(), ndp_ep.session_options())  # untyped outputs: not checked
    values = plain.run([n for pair in names for n in pair], feeds)
    hidden = [np.asarray(values[2 * i]) for i in range(len(names))]
    ids = [np.asarray(values[2 * i + 1]) for i in range(len(names))]
    return hidden, ids


def _router_logits(converted, name: str, layer: int, x: np.ndarray) -> np.ndarray:
    """Layer ``layer``'s router logits of ``x`` from its weight (named as each sample's exporter names it)."""
    weights = {t.name: numpy_helper.to_array(t) for t in converted.graph.initializer}
    if name == MIXTRAL:  # MatMul(x, W[H, E])
        node = next(n for n in converted.graph.node if n.name == f"/model/model/layers.{layer}/mlp/gate/MatMul")
        return x.astype(np.float64) @ weights[node.input[1]].astype(np.float64)
    return x.astype(np.float64) @ weights[f"model.layers.{layer}.mlp.gate.weight"].astype(np.float64).T  # Gemm, transB


def _top(logits: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-logits, axis=1, kind="stable")[:, :k]


def _hits(predicted: np.ndarray, actual: np.ndarray) -> int:
    return sum(len(set(p.tolist()) & set(a.tolist())) for p, a in zip(predicted, actual, strict=True))


@pytest.mark.parametrize("name", SAMPLES)
def test_pre_gating_leaves_the_callers_outputs_those_of_a_plain_session(samples_dir, name):
    feeds = _feeds(samples_dir, name)
    plain = ndp_ep.InferenceSession(samples_dir / name)
    for options in ({"pre_gating": True}, {"pre_gating": True, "capture_routing": "slots"}):
        sess = ndp_ep.InferenceSession(samples_dir / name, **options)
        assert [o.name for o in sess.get_outputs()] == [o.name for o in plain.get_outputs()]
        for got, want in zip(sess.run(None, feeds), plain.run(None, feeds), strict=True):
            np.testing.assert_array_equal(got, want)
        first = plain.get_outputs()[0].name
        assert len(sess.run([first], feeds)) == 1


@pytest.mark.parametrize("name", SAMPLES)
def test_hit_rate_is_the_next_routers_top_k_of_the_previous_hidden_state(samples_dir, name):
    feeds = _feeds(samples_dir, name)
    sess = ndp_ep.InferenceSession(samples_dir / name, pre_gating=True)
    sess.run(None, feeds)
    report = sess.last_report.pre_gating
    converted = sess.converted_model
    hidden, ids = _hidden_and_ids(converted, feeds)
    k = [op.spec.top_k for op in ndp_ep.partition.claim(converted)]
    expected = []
    for layer in range(1, len(hidden)):
        actual = ids[layer].reshape(-1, k[layer])
        own = _top(_router_logits(converted, name, layer, hidden[layer]), k[layer])
        assert [sorted(row) for row in own.tolist()] == [sorted(row) for row in actual.tolist()]  # the router read
        predicted = _top(_router_logits(converted, name, layer, hidden[layer - 1]), k[layer])
        expected.append((layer, _hits(predicted, actual), actual.size))
    assert [(x.layer, x.hits, x.slots) for x in report.layers] == expected
    assert report.hits == sum(h for _, h, _ in expected) and 0 < report.rate < 1
    assert sess.pre_gating.predictors[0].reason.startswith("the first layer")
    json = sess.last_report.to_json()["pre_gating"]
    assert json["hits"] == report.hits and [x["layer"] for x in json["layers"]] == [x[0] for x in expected]
    assert "pre-gating:" in str(sess.last_report)


def test_cumulative_rate_sums_every_runs_hits(samples_dir):
    ids = _feeds(samples_dir, "moe_decoder.onnx")["input_ids"]
    sess = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx", pre_gating=True)
    for length in (9, 1, 1, 4):
        sess.run(None, {"input_ids": ids[:, :length]})
    runs = [report.pre_gating for report in sess.reports]
    assert [run.slots for run in runs] == [9 * 3, 3, 3, 4 * 3]  # top-1 then top-2 layers predicted
    cumulative = sess.pre_gating.cumulative
    assert cumulative.hits == sum(run.hits for run in runs) and cumulative.slots == sum(run.slots for run in runs)
    assert sess.pre_gating.rate == cumulative.hits / cumulative.slots


def _stacked_model(between: str, router_bias: bool = False, seed: int = 3) -> onnx.ModelProto:
    """Two MoE blocks on ``x[T, H]``: the second reads ``between(x) + 0 * block0(x)`` (``Identity`` or ``Neg``); with
    ``router_bias`` its router's logits add a graph input (not a constant)."""
    spec = MoEBlockSpec(num_experts=8, top_k=2, hidden=16, ffn=16)
    b = GraphBuilder(seed)
    y0 = add_moe_block(b, "x", "l0", spec)
    zero = b.const("zero", [0.0], dtype=np.float32)
    x1 = b.op1("Add", [b.op1(between, ["x"], "l1"), b.op1("Mul", [y0, zero], "l1")], "l1")
    count = len(b.nodes)
    y1 = add_moe_block(b, x1, "l1", spec)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["tokens", 16])]
    if router_bias:
        gemm = next(node for node in b.nodes[count:] if node.op_type == "Gemm")
        logits = gemm.output[0]
        gemm.output[0] = logits + ".unbiased"
        b.nodes.insert(b.nodes.index(gemm) + 1, helper.make_node("Add", [gemm.output[0], "router_bias"], [logits]))
        inputs.append(helper.make_tensor_value_info("router_bias", TensorProto.FLOAT, [8]))
    graph = helper.make_graph(
        b.nodes,
        "stacked",
        inputs,
        [helper.make_tensor_value_info(y1, TensorProto.FLOAT, ["tokens", 16])],
        b.initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def _run_stacked(model, tokens: int = 32, **feeds) -> ndp_ep.InferenceSession:
    sess = ndp_ep.InferenceSession(model, pre_gating=True)
    assert len(sess.conversion_report.blocks) == 2
    x = np.random.default_rng(5).standard_normal((tokens, 16)).astype(np.float32)
    sess.run(None, {"x": x, **feeds})
    return sess


def test_an_unchanged_hidden_state_is_predicted_at_every_slot():
    report = _run_stacked(_stacked_model("Identity")).last_report.pre_gating
    assert (report.hits, report.slots, report.rate) == (64, 64, 1.0)


def test_a_negated_hidden_state_is_predicted_at_no_slot():
    # top-2 of the negated logits are the bottom 2 of 8: disjoint from the top 2
    report = _run_stacked(_stacked_model("Neg")).last_report.pre_gating
    assert (report.hits, report.slots, report.rate) == (0, 64, 0.0)


def test_a_router_reading_another_tensor_gets_no_predictor_and_says_why():
    model = _stacked_model("Identity", router_bias=True)
    sess = _run_stacked(model, router_bias=np.zeros(8, np.float32))
    predictor = sess.pre_gating.predictors[1]
    assert not predictor.output and "'router_bias'" in predictor.reason
    assert sess.pre_gating.unpredicted() == {p.name: p.reason for p in sess.pre_gating.predictors}
    assert sess.last_report.pre_gating is None and sess.pre_gating.rate is None
    plain = ndp_ep.InferenceSession(model)
    x = np.random.default_rng(5).standard_normal((32, 16)).astype(np.float32)
    np.testing.assert_array_equal(
        sess.run(None, {"x": x, "router_bias": np.zeros(8, np.float32)})[0],
        plain.run(None, {"x": x, "router_bias": np.zeros(8, np.float32)})[0],
    )


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_pre_gating_must_be_true_or_false(samples_dir, value):
    with pytest.raises(NdpEpError, match="pre_gating must be True or False"):
        ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx", pre_gating=value)


def test_off_by_default_and_unused_by_policies_without_look_ahead(samples_dir):
    ids = _feeds(samples_dir, "moe_decoder.onnx")["input_ids"]
    plain = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx")
    sess = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx", pre_gating=True)
    for length in (8, 1, 1):
        plain.run(None, {"input_ids": ids[:, :length]})
        sess.run(None, {"input_ids": ids[:, :length]})
    assert plain.pre_gating is None and plain.last_report.pre_gating is None
    assert "pre_gating" not in plain.last_report.to_json()
    assert [r.simulated_latency_s for r in sess.reports] == [r.simulated_latency_s for r in plain.reports]


def test_look_ahead_prefetcher_gets_the_predicted_counts(samples_dir):
    from hw_model.simulator import MoESimulator
    from hw_model.trace_replay import replay, settings_of_header

    ids = _feeds(samples_dir, "moe_decoder.onnx")["input_ids"]
    policy = "tp+lb+prefetch+lookahead"
    sess = ndp_ep.InferenceSession(
        samples_dir / "moe_decoder.onnx", policy=policy, ndp_units=2, pre_gating=True, capture_routing=True
    )
    feeds = [{"input_ids": ids}, *({"input_ids": ids[:, t : t + 1]} for t in range(8))]
    for feed in feeds:
        sess.run(None, feed)
    converted = sess.converted_model
    trace = sess.routing_trace()
    header = trace.header
    simulator = MoESimulator.from_settings(
        settings_of_header(header.settings), header.layer_shapes(None), gpu_reserved_bytes=header.gpu_reserved_bytes
    )
    widths = [layer.num_experts for layer in header.layers]
    k = [layer.top_k for layer in header.layers]
    step_s = []
    for index, feed in enumerate(feeds):
        phase, layers, tokens, dense = trace.step(index)
        hidden, _ = _hidden_and_ids(converted, feed)
        predictions = [
            np.bincount(
                _top(_router_logits(converted, "", i + 1, hidden[i]), k[i + 1]).reshape(-1), minlength=widths[i + 1]
            )
            if i + 1 < len(hidden)
            else None
            for i in range(len(hidden))
        ]
        gap = trace.steps.gap_s[index]
        step = simulator.simulate_step(phase, dense, gap_before_layer_s=gap / len(layers), predictions=predictions)
        step_s.append(gap + sum(step.latencies_s))
    assert step_s == [r.simulated_latency_s for r in sess.reports]  # to the bit
    assert list(replay(trace).step_s) != step_s  # without the predictions the prefetcher copies otherwise


def test_ids_not_from_a_top_k_get_no_predictor_and_say_why():
    from ndp_ep.partition import claim
    from ndp_ep.pregating import plan_predictors

    converted = ndp_ep.InferenceSession(_stacked_model("Identity")).converted_model
    second = _ops(converted)[1]
    converted.graph.input.append(helper.make_tensor_value_info("given_ids", TensorProto.INT64, ["tokens", 2]))
    second.input[1] = "given_ids"
    predictors = plan_predictors(converted, claim(converted))
    assert [bool(p.output) for p in predictors] == [False, False]
    assert "'given_ids' are not computed from a TopK" in predictors[1].reason


@pytest.mark.parametrize(("capture", "has_slots"), [("slots", True), (True, False)])
def test_routing_capture_keeps_slots_only_when_asked_beside_pre_gating(samples_dir, capture, has_slots):
    feeds = _feeds(samples_dir, "moe_decoder.onnx")
    sess = ndp_ep.InferenceSession(samples_dir / "moe_decoder.onnx", pre_gating=True, capture_routing=capture)
    sess.run(None, feeds)
    assert sess.routing_trace().steps.has_slots == has_slots
    assert sess.last_report.pre_gating.slots == 16 * 1 + 16 * 2
