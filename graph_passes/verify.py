"""Numeric check of MoE block readings: the chosen reading must reproduce the block's real output.

One ONNX Runtime run of the *original* model on random feeds captures, for every candidate block, the
values the block reads (hidden state, expert ids, routing weights) and the value it produces. Each reading
then recomputes the block with :mod:`graph_passes.expert_math` from the captured inputs; the first reading
whose output matches within tolerance is kept. A block with no matching reading is skipped, never
rewritten. Blocks whose weights exceed ``max_weight_bytes`` cannot be checked this way and keep their best
structural reading (the caller reports that).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from graph_passes.expert_math import expert_ffn, group_slots_by_expert, load_expert
from graph_passes.feeds import random_feeds
from graph_passes.graph_index import live_nodes
from graph_passes.plan import MoEBlockPlan, MoECandidate, Skip
from graph_passes.weights import WeightStore

DEFAULT_MAX_WEIGHT_BYTES = 512 * 2**20
PROBE_SEQ_LEN = 16
RTOL = 1e-4
ATOL = 1e-5


@dataclass(frozen=True)
class Verdict:
    plan: MoEBlockPlan | None
    skip: Skip | None
    checked_numerically: bool
    max_abs_error: float | None = None


def reference_block(plan: MoEBlockPlan, store: WeightStore, x, ids, rw) -> np.ndarray:
    """The block's output per ``plan``, computed expert by expert from the stored weights."""
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).astype(np.float32)
    ids2 = ids.reshape(-1, plan.top_k)
    rw2 = rw.reshape(-1, plan.top_k).astype(np.float32)
    out = np.zeros_like(x2)
    for expert, rows, slots in group_slots_by_expert(ids2, plan.num_experts):
        y = expert_ffn(plan, x2[rows], load_expert(plan, store.expert, expert))
        out[rows] += y * rw2.reshape(-1)[slots][:, None]
    return out.reshape(x.shape[:-1] + (hidden,))


def _with_router_nodes(nodes: list[onnx.NodeProto], plan: MoEBlockPlan) -> list[onnx.NodeProto]:
    """``nodes`` plus ``plan``'s router nodes right after the node producing the last value they read."""
    if not plan.router_nodes:
        return nodes
    produced = {o: position for position, node in enumerate(nodes) for o in node.output}
    reads = [i for n in plan.router_nodes for i in n.input if i in produced]
    position = max((produced[i] for i in reads), default=-1) + 1
    return [*nodes[:position], *plan.router_nodes, *nodes[position:]]


def _weight_bytes(plan: MoEBlockPlan, store: WeightStore) -> int:
    w = plan.weights
    names = {m.initializer for m in (w.up, w.down, w.gate) if m is not None}
    return sum(store.nbytes(n) for n in names)


def choose_readings(
    model: onnx.ModelProto,
    candidates: list[MoECandidate],
    store: WeightStore,
    max_weight_bytes: int = DEFAULT_MAX_WEIGHT_BYTES,
    seed: int = 0,
) -> list[Verdict]:
    """Pick, for every candidate, the reading that reproduces its output on a real run of ``model``."""
    checkable, probe = _probe_model(model, candidates, store, max_weight_bytes)
    captured = _capture(probe, store, random_feeds(model, seed=seed, seq_len=PROBE_SEQ_LEN)) if checkable else {}
    verdicts: list[Verdict] = []
    for candidate in candidates:
        if candidate not in checkable:
            verdicts.append(Verdict(candidate.readings[candidate.structural_choice], None, False))
            continue
        first = candidate.readings[0]
        x = captured[first.hidden_value]
        ids = captured[first.expert_ids_value]
        rw = captured[first.routing_weights_value]
        expected = captured[first.output_value]
        best_error = np.inf
        chosen = None
        for reading in candidate.readings:
            try:
                got = reference_block(reading, store, x, ids, rw)
            except ValueError:
                continue
            if got.shape != expected.shape:
                continue
            error = float(np.max(np.abs(got - expected))) if expected.size else 0.0
            best_error = min(best_error, error)
            if error <= ATOL + RTOL * float(np.max(np.abs(expected), initial=0.0)):
                chosen = reading
                break
        if chosen is None:
            verdicts.append(
                Verdict(
                    None,
                    Skip(
                        first.name,
                        f"no reading of the expert computation reproduces its output "
                        f"(best max abs error {best_error:.3g} over {len(candidate.readings)} readings)",
                    ),
                    True,
                    best_error,
                )
            )
        else:
            verdicts.append(Verdict(chosen, None, True, best_error))
    return verdicts


def _capture(probe: onnx.ModelProto, store: WeightStore, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``probe`` once on ``feeds``; every weight array it loaded is released on return."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    # no arena: the large per-slot weight copies a gathered block makes are returned to the system at once
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    # external weights are handed over as arrays (no copy into the proto); a model loaded from bytes
    # could not resolve their relative file names anyway
    external = [t.name for t in probe.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        values = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(store.full(n))) for n in external]
        options.add_external_initializers(external, values)
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def _activation_bytes(plan: MoEBlockPlan, store: WeightStore) -> int:
    """What running the block may hold at once besides its weights: a copy of the selected experts' weights
    per routed slot (the gathered form materialises exactly that) for the probe's tokens."""
    per_expert = _weight_bytes(plan, store) // max(plan.num_experts, 1)
    return PROBE_SEQ_LEN * plan.top_k * per_expert


def _wanted_values(plan: MoEBlockPlan) -> list[str]:
    return [plan.hidden_value, plan.expert_ids_value, plan.routing_weights_value, plan.output_value]


def _probe_model(
    model: onnx.ModelProto, candidates: list[MoECandidate], store: WeightStore, max_weight_bytes: int
) -> tuple[list[MoECandidate], onnx.ModelProto]:
    """The candidates that can be checked, and a model computing exactly the values their check needs.

    Candidates are taken in order while the weights of every initializer the probe reads (the block's
    experts and everything upstream of it), plus the largest block's per-slot weight copies, stay within
    ``max_weight_bytes`` in total, so the check never holds much more than that. External initializers
    stay headers in the probe (the caller supplies arrays).
    """
    initializers = {t.name: t for t in model.graph.initializer}
    nodes = list(model.graph.node)  # references: trials below never copy a NodeProto
    chosen: list[MoECandidate] = []
    for candidate in candidates:
        reading = candidate.readings[0]
        if _weight_bytes(reading, store) > max_weight_bytes:
            continue
        trial = _with_router_nodes(nodes, reading)
        wanted = [v for c in [*chosen, candidate] for v in _wanted_values(c.readings[0])]
        _, reads = live_nodes(trial, wanted)
        activations = max(_activation_bytes(c.readings[0], store) for c in [*chosen, candidate])
        if sum(store.nbytes(n) for n in reads if n in initializers) + activations > max_weight_bytes:
            continue
        chosen.append(candidate)
        nodes = trial
    probe = onnx.ModelProto()
    if not chosen:
        return chosen, probe
    wanted = list(dict.fromkeys(v for c in chosen for v in _wanted_values(c.readings[0])))
    nodes, reads = live_nodes(nodes, wanted)
    for field_name in ("ir_version", "producer_name", "domain", "model_version"):
        setattr(probe, field_name, getattr(model, field_name))
    probe.opset_import.extend(model.opset_import)
    probe.functions.extend(model.functions)
    probe.graph.name = model.graph.name
    probe.graph.input.extend(model.graph.input)
    probe.graph.node.extend(nodes)
    probe.graph.initializer.extend(initializers[n] for n in initializers if n in reads)
    probe.graph.value_info.extend(v for v in model.graph.value_info if v.name in reads)
    for value in wanted:
        probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(value))
    return chosen, probe
