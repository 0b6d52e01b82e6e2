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
from graph_passes.plan import MoEBlockPlan, MoECandidate, Skip
from graph_passes.weights import WeightStore

DEFAULT_MAX_WEIGHT_BYTES = 512 * 2**20
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


def _insert_router_nodes(graph: onnx.GraphProto, plans: list[MoEBlockPlan]) -> None:
    """Add each plan's router nodes right after the node producing the last value they read."""
    for plan in plans:
        if not plan.router_nodes:
            continue
        produced = {o: position for position, node in enumerate(graph.node) for o in node.output}
        reads = [i for n in plan.router_nodes for i in n.input if i in produced]
        position = max((produced[i] for i in reads), default=-1) + 1
        for offset, node in enumerate(plan.router_nodes):
            graph.node.insert(position + offset, node)


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
    import onnxruntime as ort

    checkable = [c for c in candidates if _weight_bytes(c.readings[0], store) <= max_weight_bytes]
    captured: dict[str, np.ndarray] = {}
    if checkable:
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        existing = {o.name for o in probe.graph.output}
        _insert_router_nodes(probe.graph, [c.readings[0] for c in checkable])
        wanted: list[str] = []
        for candidate in checkable:
            r = candidate.readings[0]
            for value in (r.hidden_value, r.expert_ids_value, r.routing_weights_value, r.output_value):
                if value not in existing and value not in wanted:
                    wanted.append(value)
        for value in wanted:
            probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(value))
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        feeds = random_feeds(model, seed=seed, seq_len=16)
        captured = dict(zip(names, session.run(names, feeds), strict=True))

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
