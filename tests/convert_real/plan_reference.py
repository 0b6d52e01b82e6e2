"""A NumPy evaluator of MoE block plans, independent of the rewriter: proves a rule's plan numerically.

Given a model, its feeds and a plan, it runs the original model in ONNX Runtime with the plan's input values
(hidden state, expert ids, routing weights, or the router logits of a fused plan) and output value exposed,
recomputes the block from the plan alone

    y[t] = sum_k rw[t, k] * Expert_{ids[t, k]}(hidden[t])

reading every expert matrix through the plan's layout / column selection, and returns both results.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from graph_passes.plan import MoEBlockPlan, StackedBias, StackedMatrix

COLUMN_SLICES = {
    "all": slice(None),
    "even": slice(0, None, 2),
    "odd": slice(1, None, 2),
}


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run_with_values(model: onnx.ModelProto, feeds: dict[str, np.ndarray], values: list[str]) -> dict[str, np.ndarray]:
    """Run ``model`` and return the named intermediate values too."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    present = {o.name for o in exposed.graph.output}
    for name in values:
        if name not in present:
            exposed.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
    session = _session(exposed)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def _columns(matrix: np.ndarray, columns: str) -> np.ndarray:
    """Select output columns of an ``x @ W`` matrix ``[in, out]``."""
    if columns in COLUMN_SLICES:
        return matrix[:, COLUMN_SLICES[columns]]
    half = matrix.shape[1] // 2
    return matrix[:, :half] if columns == "first_half" else matrix[:, half:]


def expert_matrix(inits: dict[str, np.ndarray], stacked: StackedMatrix, expert: int) -> np.ndarray:
    """Expert ``expert``'s matrix in ``x @ W`` layout ``[in, out]``."""
    w = inits[stacked.per_expert[expert]] if stacked.per_expert else inits[stacked.initializer][expert]
    w = w.T if stacked.layout == "out_in" else w
    return _columns(w.astype(np.float64), stacked.columns)


def expert_bias(inits: dict[str, np.ndarray], bias: StackedBias | None, expert: int) -> np.ndarray | float:
    if bias is None:
        return 0.0
    row = inits[bias.initializer][expert].astype(np.float64)
    return _columns(row[None, :], bias.columns)[0]


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def expert_forward(inits: dict[str, np.ndarray], plan: MoEBlockPlan, expert: int, x: np.ndarray) -> np.ndarray:
    w = plan.weights
    up = x @ expert_matrix(inits, w.up, expert) + expert_bias(inits, w.up_bias, expert)
    if plan.gated:
        gate = x @ expert_matrix(inits, w.gate, expert) + expert_bias(inits, w.gate_bias, expert)
        if plan.activation == "silu_glu":
            act = _silu(gate) * up
        elif plan.activation == "gelu_glu":
            act = _gelu(gate) * up
        else:  # swiglu_clamp
            limit = plan.activation_limit
            g = np.minimum(gate, limit)
            u = np.clip(up, -limit, limit)
            act = (u + plan.activation_beta) * g / (1.0 + np.exp(-plan.activation_alpha * g))
    else:
        act = {"relu": lambda v: np.maximum(v, 0.0), "silu": _silu, "gelu": _gelu, "gelu_tanh": _gelu_tanh}[
            plan.activation
        ](up)
    return act @ expert_matrix(inits, w.down, expert) + expert_bias(inits, w.down_bias, expert)


def router_outputs(plan: MoEBlockPlan, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run a fused plan's ``router_nodes`` on the router logits (in ONNX Runtime)."""
    nodes = list(plan.router_nodes)
    produced = {o for n in nodes for o in n.output}
    logits_name = next(i for n in nodes for i in n.input if i and i not in produced)
    graph = helper.make_graph(
        nodes,
        "router",
        [helper.make_tensor_value_info(logits_name, onnx.TensorProto.FLOAT, list(logits.shape))],
        [onnx.ValueInfoProto(name=plan.expert_ids_value), onnx.ValueInfoProto(name=plan.routing_weights_value)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    ids, weights = _session(model).run(None, {logits_name: logits.astype(np.float32)})
    return ids, weights


def evaluate_plan(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], plan: MoEBlockPlan
) -> tuple[np.ndarray, np.ndarray]:
    """(the block output as the original model computes it, the same output recomputed from the plan)."""
    router_nodes = getattr(plan, "router_nodes", ())
    if router_nodes:
        produced = {o for n in router_nodes for o in n.output}
        logits_value = next(i for n in router_nodes for i in n.input if i and i not in produced)
        wanted = [plan.hidden_value, logits_value, plan.output_value]
    else:
        wanted = [plan.hidden_value, plan.expert_ids_value, plan.routing_weights_value, plan.output_value]
    values = run_with_values(model, feeds, wanted)
    if router_nodes:
        ids, rw = router_outputs(plan, values[logits_value])
    else:
        ids, rw = values[plan.expert_ids_value], values[plan.routing_weights_value]
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    hidden = values[plan.hidden_value].astype(np.float64).reshape(-1, plan.hidden)
    ids = ids.reshape(hidden.shape[0], plan.top_k)
    rw = rw.astype(np.float64).reshape(hidden.shape[0], plan.top_k)
    recomputed = np.zeros_like(hidden)
    for t in range(hidden.shape[0]):
        for k in range(plan.top_k):
            recomputed[t] += rw[t, k] * expert_forward(inits, plan, int(ids[t, k]), hidden[t : t + 1])[0]
    original = values[plan.output_value].reshape(-1, plan.hidden)
    return original, recomputed
