"""Every fixture that converts runs through a plain ONNX Runtime session with NdpExecutionProvider added and
matches stock ONNX Runtime on the original model; the provider owns exactly the sharded nodes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ndp_ep
from graph_passes import sharded_op

SAMPLES = Path(__file__).resolve().parents[2] / "sample_models"
FP32_RTOL = 1e-5
_FUSED_MANIFEST = json.loads((SAMPLES / "fused" / "MANIFEST.json").read_text())
FIXTURES = sorted(
    [SAMPLES / "moe_block.onnx", SAMPLES / "moe_decoder.onnx"]
    + [p for p in (SAMPLES / "fused").glob("*.onnx") if _FUSED_MANIFEST[p.stem]["expect_converted"]]
    + [
        p
        for p in [*(SAMPLES / "hf").glob("*.onnx"), *(SAMPLES / "hf" / "extra").glob("*.onnx")]
        if "eager" not in p.name
    ]
)


def _inputs(path: Path) -> dict[str, np.ndarray]:
    return dict(np.load(path.with_name(path.name.replace(".onnx", ".inputs.npz"))))


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_converted_fixture_on_the_provider_matches_stock_onnx_runtime(path, tmp_path, ep_session, relative_error):
    converted = tmp_path / "model.ndp.onnx"
    result = ndp_ep.convert_model(path, converted, shards=2)
    assert result.report.blocks, f"{path.name} did not convert: {result.report.skipped}"
    feeds = _inputs(path)
    stock = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    session = ep_session(converted, record_assignment=True)
    ours = session.run(None, feeds)
    assert session.get_providers()[0] == "NdpExecutionProvider"
    for a, b in zip(ours, stock, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert relative_error(a, b) <= FP32_RTOL
    sharded = {
        n.name for n in onnx.load(converted, load_external_data=False).graph.node if sharded_op.is_sharded_node(n)
    }
    owned = {
        node.name
        for info in session.get_provider_graph_assignment_info()
        if info.ep_name == "NdpExecutionProvider"
        for node in info.get_nodes()
    }
    assert owned == sharded and len(sharded) == len(result.report.blocks)


# gpt-oss stores experts [E, H, 2I] / [E, I, H] (x @ W); Mixtral's dynamo export [E, 2I, H] / [E, H, I] ([out, in])
LAYOUT_SOURCES = [("hf/gpt_oss_block_dynamo.onnx", "in_out"), ("hf/mixtral_block_dynamo.onnx", "out_in")]


@pytest.mark.parametrize(("name", "layout"), LAYOUT_SOURCES)
def test_shards_keep_the_source_layout_and_match_stock_onnx_runtime(name, layout, tmp_path, ep_session, relative_error):
    path = SAMPLES / name
    converted = tmp_path / "model.ndp.onnx"
    ndp_ep.convert_model(path, converted, shards=2)
    model = onnx.load(converted, load_external_data=False)
    (node, *_) = [n for n in model.graph.node if sharded_op.is_sharded_node(n)]
    attributes = {a.name: a.s.decode() for a in node.attribute if a.name.endswith("_layout")}
    assert attributes == ({} if layout == "in_out" else {"first_layout": "out_in", "down_layout": "out_in"})
    spec = sharded_op.parse_node(node)
    dims = {t.name: tuple(t.dims) for t in model.graph.initializer}
    first, down = 2 * spec.ffn // 2, spec.ffn // 2  # gated experts: F/S = 2I/S rows or columns
    expected = (
        ((spec.hidden, first), (down, spec.hidden))
        if layout == "in_out"
        else ((first, spec.hidden), (spec.hidden, down))
    )
    assert (dims[node.input[3]], dims[node.input[3 + spec.num_experts * 2]]) == expected
    feeds = _inputs(path)
    stock = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    ours = ep_session(converted).run(None, feeds)
    for a, b in zip(ours, stock, strict=True):
        assert relative_error(a, b) <= FP32_RTOL


def test_profiler_shows_the_provider_on_the_sharded_nodes_only(tmp_path):
    converted = tmp_path / "block.ndp.onnx"
    ndp_ep.convert_model(SAMPLES / "moe_block.onnx", converted, shards=2)
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    options.log_severity_level = 3
    session = ort.InferenceSession(str(converted), ndp_ep.session_options(options))
    session.run(None, _inputs(SAMPLES / "moe_block.onnx"))
    events = json.loads(Path(session.end_profiling()).read_text())
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    on_ep = {e["args"]["op_name"] for e in kernels if e["args"].get("provider") == "NdpExecutionProvider"}
    elsewhere = {e["args"]["provider"] for e in kernels if e["args"].get("provider") != "NdpExecutionProvider"}
    assert len(on_ep) == 1 and elsewhere == {"CPUExecutionProvider"}


def test_without_the_provider_a_converted_model_does_not_run(tmp_path):
    converted = tmp_path / "block.ndp.onnx"
    ndp_ep.convert_model(SAMPLES / "moe_block.onnx", converted, shards=2)
    with pytest.raises(Exception, match="ShardedMoEExperts"):
        ort.InferenceSession(str(converted), providers=["CPUExecutionProvider"])


def test_eight_threads_on_one_session_give_outputs_bit_identical_to_serial_runs(tmp_path, ep_session):
    from concurrent.futures import ThreadPoolExecutor

    converted = tmp_path / "decoder.ndp.onnx"
    ndp_ep.convert_model(SAMPLES / "moe_decoder.onnx", converted, shards=4)
    session = ep_session(converted, threads=2)
    rng = np.random.default_rng(0)
    vocab = 64
    feeds = [{"input_ids": rng.integers(0, vocab, (1, int(n)), dtype=np.int64)} for n in rng.integers(1, 9, 100)]
    serial = [session.run(None, f)[0] for f in feeds]
    with ThreadPoolExecutor(8) as pool:
        threaded = list(pool.map(lambda f: session.run(None, f)[0], feeds))
    for a, b in zip(serial, threaded, strict=True):
        assert a.tobytes() == b.tobytes()


def test_the_provider_can_be_named_in_providers_after_register(tmp_path):
    from ndp_ep.ep import _version_tuple

    if _version_tuple(ort.__version__) < (1, 26):
        pytest.skip(f"onnxruntime {ort.__version__} does not take plugin provider names in providers=")
    converted = tmp_path / "block.ndp.onnx"
    ndp_ep.convert_model(SAMPLES / "moe_block.onnx", converted, shards=2)
    ndp_ep.register()
    options = ort.SessionOptions()
    options.register_custom_ops_library(ndp_ep.get_library_path())
    options.add_session_config_entry("ep.ndpexecutionprovider.session_key", "named-in-providers")
    session = ort.InferenceSession(str(converted), options, providers=["NdpExecutionProvider", "CPUExecutionProvider"])
    assert session.get_providers() == ["NdpExecutionProvider", "CPUExecutionProvider"]
    feeds = _inputs(SAMPLES / "moe_block.onnx")
    session.run(None, feeds)
    assert ndp_ep.last_report(session).tokens == int(np.prod(feeds["hidden_states"].shape[:-1]))
    # or the key and the report's options as provider options, which reach the session, not its SessionOptions
    options = ort.SessionOptions()
    options.register_custom_ops_library(ndp_ep.get_library_path())
    named = {"session_key": "named-with-options", "ndp_units": "2", "policy": "monde"}
    providers = ["NdpExecutionProvider", "CPUExecutionProvider"]
    session = ort.InferenceSession(str(converted), options, providers=providers, provider_options=[named, {}])
    session.run(None, feeds)
    report = ndp_ep.last_report(session)
    assert (report.ndp_units, report.policy) == (2, "monde")
    assert report.tokens == int(np.prod(feeds["hidden_states"].shape[:-1]))


def test_a_node_that_breaks_the_contract_fails_the_session_and_the_provider_says_why(tmp_path, capfd):
    converted = tmp_path / "block.ndp.onnx"
    ndp_ep.convert_model(SAMPLES / "moe_block.onnx", converted, shards=2)
    model = onnx.load(converted)
    node = next(n for n in model.graph.node if sharded_op.is_sharded_node(n))
    next(a for a in node.attribute if a.name == "shards").i = 3  # the FFN width is not divisible by 3
    with pytest.raises(Exception, match="implementation for ShardedMoEExperts"):
        ort.InferenceSession(model.SerializeToString(), ndp_ep.session_options())
    # ONNX Runtime logs the provider's refusal (GetCapability's status) before it gives up on the node
    assert "ndp-ep: moe: ffn is not divisible by shards" in capfd.readouterr().err


def test_routing_nobody_reads_is_bounded_and_the_drop_is_counted(tmp_path):
    from ndp_ep.ep import RoutingReader

    converted = tmp_path / "decoder.ndp.onnx"
    ndp_ep.convert_model(SAMPLES / "moe_decoder.onnx", converted, shards=2)
    session = ort.InferenceSession(str(converted), ndp_ep.session_options(session_key="bounded", routing_capacity=4))
    feeds = _inputs(SAMPLES / "moe_decoder.onnx")
    for _ in range(5):  # 3 MoE layers per run: 15 records into a log of 4
        session.run(None, feeds)
    reader = RoutingReader("bounded")
    run_ids, layers, _, totals, counts = reader.take(8)
    assert len(run_ids) == 4 and reader.dropped() == 11 and counts.shape == (4, 8)
    assert layers == [2, 0, 1, 2]  # the newest records, oldest first
    assert totals == counts.sum(axis=1).tolist()


def test_sessions_sharing_a_key_refuse_to_report_until_only_one_is_left(tmp_path):
    import gc

    converted = tmp_path / "block.ndp.onnx"
    ndp_ep.convert_model(SAMPLES / "moe_block.onnx", converted, shards=2)
    options = ndp_ep.session_options()  # one key, reused for two sessions as ONNX Runtime allows
    first = ort.InferenceSession(str(converted), options)
    second = ort.InferenceSession(str(converted), options)
    first.run(None, {"hidden_states": np.ones((1, 5, 64), np.float32)})
    second.run(None, {"hidden_states": np.ones((1, 1, 64), np.float32)})
    for session in (first, second):  # each would read the other's routing (or its own, depending on order)
        with pytest.raises(ndp_ep.NdpEpError, match="several live sessions were created with the session key"):
            ndp_ep.last_report(session)
    del second, session  # the loop's variable too
    gc.collect()
    first.run(None, {"hidden_states": np.ones((1, 3, 64), np.float32)})
    from ndp_ep.reporter import reporter_for

    assert [r.tokens for r in reporter_for(first).reports] == [5, 3]  # its own runs, in order


def test_a_plain_sessions_model_file_gone_before_its_first_report_is_a_typed_error(tmp_path):
    converted = tmp_path / "block.ndp.onnx"
    ndp_ep.convert_model(SAMPLES / "moe_block.onnx", converted, shards=2)
    feeds = {"hidden_states": np.ones((1, 2, 64), np.float32)}
    bound = ort.InferenceSession(str(converted), ndp_ep.session_options())
    assert ndp_ep.last_report(bound) is None  # read once: what its reports need is kept
    late = ort.InferenceSession(str(converted), ndp_ep.session_options())
    converted.unlink()
    bound.run(None, feeds)
    late.run(None, feeds)
    assert ndp_ep.last_report(bound).tokens == 2
    with pytest.raises(ndp_ep.NdpEpError, match="cannot read the session's model .* again to build its report"):
        ndp_ep.last_report(late)


def test_routing_counts_are_the_routers_top_k_choices_per_expert_in_run_order(tmp_path):
    from ndp_ep.ep import RoutingReader

    converted = tmp_path / "block.ndp.onnx"
    ndp_ep.convert_model(SAMPLES / "moe_block.onnx", converted, shards=2)
    session = ort.InferenceSession(str(converted), ndp_ep.session_options(session_key="large-prefill"))
    router = onnx.numpy_helper.to_array(  # the router Gemm's B (transB=1)
        next(t for t in onnx.load(str(converted)).graph.initializer if t.name == "moe.gate.weight")
    )
    rng = np.random.default_rng(9)
    # more records than the reader takes per call (RoutingReader.BATCH)
    batches = [rng.standard_normal((1, tokens, 64)).astype(np.float32) for tokens in [300] + [1] * 299]
    for hidden in batches:
        session.run(None, {"hidden_states": hidden})
    _, _, tokens, totals, counts = RoutingReader("large-prefill").take(8)
    assert totals == [2 * t for t in tokens]  # top-2: two expert slots per token
    assert tokens == [300] + [1] * 299
    for hidden, row in zip(batches, counts, strict=True):  # the top-2 of the router's logits, counted by numpy
        logits = hidden[0] @ router.T
        top = np.argsort(-logits, axis=1, kind="stable")[:, :2]
        np.testing.assert_array_equal(row, np.bincount(top.ravel(), minlength=8))
