"""Chrome trace-event export of simulated timelines: valid format, faithful busy times, lanes, bench traces."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hw_model import MoESimulator, load_system
from hw_model.bench import BenchConfig, Job, quick_config, run_bench, run_job
from hw_model.chrome_trace import (
    TraceLayer,
    busy_s_by_resource,
    chrome_trace,
    sequential_layers,
    write_bench_traces,
    write_chrome_trace,
)
from hw_model.errors import WorkloadError
from hw_model.models import get_model
from hw_model.settings import SimulationSettings

NON_EXPERT_GAP_S = 50e-6


def _events(result) -> tuple:
    """A layer result's timeline events, whether the simulator keeps them on ``.timeline`` or on the result."""
    timeline = getattr(result, "timeline", None)
    return tuple(timeline.events if timeline is not None else result.events)


def _simulate(layers: int = 3, tokens: int = 16, units: int = 4, seed: int = 0):
    """A few seeded prefill invocations of OLMoE on the paper platform; returns (simulator, invocations)."""
    model = get_model("olmoe-1b-7b")
    sim = MoESimulator(load_system("paper", units), model.moe_layer_shapes(), "tp+lb+prefetch")
    rng = np.random.default_rng(seed)
    invocations = []
    for layer in range(layers):
        counts = rng.multinomial(tokens * model.top_k, np.full(model.num_experts, 1 / model.num_experts))
        result = sim.simulate_layer(layer, counts, "prefill")
        invocations.append((layer, "prefill", _events(result), result.latency_s))
    return sim, invocations


def _thread_names(trace: dict) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }


def _process_names(trace: dict) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}


def test_trace_of_simulated_layers_is_valid_trace_event_json(tmp_path):
    _, invocations = _simulate()
    path = write_chrome_trace(tmp_path / "t.json", chrome_trace(sequential_layers(invocations, NON_EXPERT_GAP_S)))
    trace = json.loads(path.read_text())
    assert isinstance(trace["traceEvents"], list) and trace["traceEvents"]
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert spans
    for event in trace["traceEvents"]:
        assert isinstance(event["name"], str) and event["ph"] in ("X", "M")
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
    for event in spans:
        assert isinstance(event["ts"], float) and isinstance(event["dur"], float)
        assert event["ts"] >= 0 and event["dur"] >= 0
        assert isinstance(event["cat"], str) and isinstance(event["args"], dict)
    # every (pid, tid) a span uses is named by metadata
    assert {(e["pid"], e["tid"]) for e in spans} <= set(_thread_names(trace))


def test_total_busy_time_per_resource_equals_the_simulators_busy_s():
    sim, invocations = _simulate(layers=4, seed=3)
    trace = chrome_trace(sequential_layers(invocations, NON_EXPERT_GAP_S))
    busy = busy_s_by_resource(trace)
    expected = dict(sim.summary()["busy_s"])
    expected["gpu"] += 4 * NON_EXPERT_GAP_S  # the non-expert ops drawn before each of the 4 layers
    assert set(busy) == set(expected)
    for resource, seconds in expected.items():
        assert busy[resource] == pytest.approx(seconds, rel=1e-9, abs=1e-15)


def test_events_of_one_thread_never_overlap():
    _, invocations = _simulate(layers=4, seed=1)
    trace = chrome_trace(sequential_layers(invocations, NON_EXPERT_GAP_S))
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end - 1e-6  # µs; float rounding only


def test_one_process_per_resource_group_and_one_thread_per_resource():
    _, invocations = _simulate(layers=2, tokens=16, units=4)
    resources = {r for _, _, events, _ in invocations for r, *_ in events}
    assert {"gpu", "pcie", "pcie_d2h", "ndp_link", "ndp0", "ndp3"} <= resources  # this workload uses them all
    trace = chrome_trace(sequential_layers(invocations))
    processes = _process_names(trace)
    assert sorted(processes.values()) == sorted(["MoE layers", "GPU", "PCIe", "NDP", "DIMM-link"])
    threads = {(processes[pid], name) for (pid, _), name in _thread_names(trace).items()}
    assert threads == {
        ("MoE layers", "layer"),
        ("GPU", "gpu"),
        ("PCIe", "pcie h2d"),
        ("PCIe", "pcie d2h"),
        ("DIMM-link", "dimm-link"),
        *{("NDP", f"ndp unit {u}") for u in range(4)},
    }
    layer_spans = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "layer"]
    assert [e["name"] for e in layer_spans] == ["layer 0 prefill", "layer 1 prefill"]


def test_sequential_layers_start_each_layer_where_the_previous_ended():
    # layer 0: 3 s of work, layer 1: 5 s, each after a 1 s gap -> layers at [0, 4] and [4, 10] seconds
    layers = sequential_layers(
        [(0, "decode", [("ndp0", 0.0, 3.0, "e1")], 3.0), (1, "decode", [("gpu", 1.0, 5.0, "e2")], 5.0)],
        gap_before_s=1.0,
        gap_label="attention",
        names=["a", "b"],
    )
    trace = chrome_trace(layers)
    spans = sorted(
        ((e["name"], e["ts"], e["dur"], e["args"]["layer"]) for e in trace["traceEvents"] if e["ph"] == "X"),
        key=lambda s: (s[1], s[0]),
    )
    assert spans == [
        ("a decode", 0.0, 4e6, 0),
        ("attention", 0.0, 1e6, 0),
        ("e1", 1e6, 3e6, 0),
        ("attention", 4e6, 1e6, 1),
        ("b decode", 4e6, 6e6, 1),
        ("e2", 6e6, 4e6, 1),
    ]


def test_overlapping_events_of_one_resource_go_to_a_second_lane():
    layer = TraceLayer(0, 0.0, (("pcie", 0.0, 2.0, "a"), ("pcie", 1.0, 3.0, "b"), ("pcie", 2.0, 4.0, "c")))
    trace = chrome_trace([layer])
    names = _thread_names(trace)
    lanes = {e["name"]: names[(e["pid"], e["tid"])] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert lanes == {"a": "pcie h2d", "b": "pcie h2d #2", "c": "pcie h2d", "layer 0": "layer"}


@pytest.mark.parametrize(
    "event", [("gpu", 2.0, 1.0, "backwards"), ("gpu", -1.0, 1.0, "negative"), ("gpu", 0.0, float("nan"), "nan")]
)
def test_bad_events_are_rejected_with_a_typed_error(event):
    with pytest.raises(WorkloadError):
        TraceLayer(0, 0.0, (event,))


def test_layer_names_must_match_the_invocations():
    with pytest.raises(WorkloadError, match="2 layer names for 1"):
        sequential_layers([(0, "decode", [], 1.0)], names=["a", "b"])


def test_bench_traces_one_file_per_model_and_policy_from_the_gantt_mapping(tmp_path):
    config = quick_config(
        BenchConfig(
            models=("olmoe-1b-7b",), ndp_units=(4,), policies=("monde+cache", "tp+lb+prefetch"), default_units=4
        )
    )
    _, gantt = run_bench(config)
    paths = write_bench_traces(gantt, tmp_path, ndp_units=4)
    assert sorted(p.name for p in paths) == [
        "trace_olmoe-1b-7b_4ndp_monde_cache.json",
        "trace_olmoe-1b-7b_4ndp_tp_lb_prefetch.json",
    ]
    for path in paths:
        trace = json.loads(path.read_text())
        layer_spans = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "layer"]
        assert [e["args"]["phase"] for e in layer_spans] == ["prefill", "decode"]
        # the decode step starts where the prefill layer ended
        assert layer_spans[1]["ts"] == pytest.approx(layer_spans[0]["ts"] + layer_spans[0]["dur"])
        assert trace["otherData"]["ndp_units"] == 4


def test_bench_traces_accept_job_results(tmp_path):
    model = get_model("olmoe-1b-7b")
    config = quick_config(BenchConfig(models=(model.name,), ndp_units=(2,), policies=("tp",)))
    result = run_job(Job(model, SimulationSettings(ndp_units=2, policy="tp"), "typical", 1.0, want_gantt=True), config)
    (path,) = write_bench_traces([result], tmp_path)
    trace = json.loads(path.read_text())
    assert path.name == "trace_olmoe-1b-7b_2ndp_tp.json"
    expected = {}
    for events in result.gantt.values():
        for resource, start, end, _ in events:
            expected[resource] = expected.get(resource, 0.0) + end - start
    assert busy_s_by_resource(trace) == pytest.approx(expected)
