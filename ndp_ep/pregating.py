"""Pre-gating: each MoE layer's experts predicted from the previous layer's hidden state, and its hit rate measured.

``ndp_ep.InferenceSession(..., pre_gating=True)``. A converted model's sharded op ``l`` reads the flat hidden state
``X_l`` (input 0) and its selected expert ids (input 1), which its router computes from ``X_l``: for the bundled
samples ``ids = TopK(Softmax(Gemm(X_l, W_gate_l)), k).indices`` (Hugging Face exports add a Reshape and a Cast).
Where layer ``l + 1``'s ids come from a TopK (through id-preserving Cast/Reshape/Squeeze/... nodes) whose values
are computed from ``X_{l+1}`` by nodes whose other inputs are constants (initializers, Constant nodes, or nodes of
constants only), :func:`plan_predictors` clones that chain, the constants shared rather than copied, with
``X_{l+1}`` replaced by ``X_l``, ending in a TopK of the same ``k``: its indices are layer ``l + 1``'s experts as
its router would pick them from layer ``l``'s hidden state, known one layer ahead (the look-ahead prefetcher's
input, ``tp+lb+prefetch+lookahead``). Other layers get no predictor and :class:`LayerPredictor` says why (the first
layer, a router reading other tensors, ids not from a TopK, a different hidden width, ...).

The session hands ONNX Runtime the model with the cloned nodes added and their indices as extra graph outputs
(beside every op's ids, :mod:`ndp_ep.slots`); the caller's nodes and outputs are untouched. Each ``run`` then
counts per predicted layer ``hits = |predicted ∩ actual|`` per token over the actual slots (:meth:`PreGating.count`):
the run's report carries them (:attr:`ndp_ep.report.RunReport.pre_gating`) and :attr:`PreGating.cumulative`
sums every run's.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ndp_ep.pending import PendingRuns

OUTPUT_PREFIX = "ndp_ep.pregating/"  # the cloned nodes' names and outputs
MAX_CHAIN_NODES = 64  # a router is a handful of nodes; a longer chain is not one
# nodes between a TopK's indices and the op's ids input that keep every id's value and order
_ID_PRESERVING = frozenset({"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})
# ops a clone would not compute the same (random draws) or that read tensors outside their inputs (subgraphs)
_NOT_CLONED = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Dropout", "Bernoulli"}
)


@dataclass(frozen=True)
class LayerPredictor:
    """Layer ``layer``'s (named ``name``) predictor from layer ``source``'s hidden state: the graph output of its
    predicted ids ``[tokens, top_k]`` and the nodes that compute them, or the ``reason`` it has none."""

    layer: int
    name: str
    source: int | None = None
    output: str = ""
    top_k: int = 0
    reason: str = ""
    nodes: tuple[Any, ...] = field(default=(), compare=False, repr=False)  # the cloned onnx NodeProtos, in order

    def __post_init__(self) -> None:
        if bool(self.output) == bool(self.reason):
            raise ValueError(f"{self.name}: a predictor has either an output or the reason it has none")
        if self.output and (self.source is None or self.top_k < 1 or not self.nodes):
            raise ValueError(f"{self.name}: a predictor needs its source layer, top_k >= 1 and its nodes")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"layer": self.layer, "name": self.name}
        if not self.output:
            return {**out, "reason": self.reason}
        return {**out, "source": self.source, "nodes": len(self.nodes)}


@dataclass(frozen=True)
class LayerHits:
    """Of layer ``layer``'s ``slots`` actual (token, expert) slots, the ``hits`` its predicted ids held."""

    layer: int
    name: str
    hits: int
    slots: int

    def __post_init__(self) -> None:
        if not 0 <= self.hits <= self.slots:
            raise ValueError(f"{self.name}: hits must be within 0..slots, got {self.hits} of {self.slots}")

    @property
    def rate(self) -> float | None:
        return self.hits / self.slots if self.slots else None

    def to_json(self) -> dict[str, Any]:
        return {"layer": self.layer, "name": self.name, "hits": self.hits, "slots": self.slots, "rate": self.rate}


@dataclass(frozen=True)
class PreGatingHits:
    """Pre-gating hits of the predicted layers (those with a predictor, in layer order) over one run or many."""

    layers: tuple[LayerHits, ...]

    @property
    def hits(self) -> int:
        return sum(layer.hits for layer in self.layers)

    @property
    def slots(self) -> int:
        return sum(layer.slots for layer in self.layers)

    @property
    def rate(self) -> float | None:
        """The fraction of the actual slots predicted (None without any)."""
        return self.hits / self.slots if self.slots else None

    def to_json(self) -> dict[str, Any]:
        return {
            "hits": self.hits,
            "slots": self.slots,
            "rate": self.rate,
            "layers": [layer.to_json() for layer in self.layers],
        }

    def format_text(self) -> str:
        """One line: the overall rate, then each layer's."""
        if not self.slots:
            return "pre-gating: no slots predicted"
        layers = ", ".join(f"{layer.name} {layer.rate:.1%}" for layer in self.layers if layer.rate is not None)
        return f"pre-gating: {self.rate:.1%} of {self.slots} expert slot(s) predicted a layer ahead ({layers})"


@dataclass(frozen=True)
class PreGatingRun:
    """One run's pre-gating: its hits, and per layer (in the reporter's order) the expert counts its predicted ids
    give (None for a layer without a prediction), the look-ahead prefetcher's predictions."""

    hits: PreGatingHits
    predicted_counts: tuple[np.ndarray | None, ...]


class PreGating:
    """A session's pre-gating predictors (:func:`plan_predictors`) and the hits of its runs (see the module
    docstring): :meth:`add_to` puts the predictors into the model ONNX Runtime gets, :meth:`count` scores a run's
    predicted ids against its actual ones, :meth:`take` hands the run's counts to its report."""

    def __init__(self, model, claimed: Sequence[Any]) -> None:
        self.predictors = plan_predictors(model, claimed)
        self.outputs = [p.output for p in self.predictors if p.output]
        self._widths = [c.spec.num_experts for c in claimed]
        self._totals = {p.layer: [0, 0] for p in self.predictors if p.output}  # layer -> [hits, slots]
        self._pending = PendingRuns()  # per run tag: its PreGatingRun, until its report takes it
        self._lock = threading.Lock()  # the totals

    def add_to(self, model) -> None:
        """Add the predictors' nodes and outputs to ``model`` (a copy ONNX Runtime gets)."""
        for predictor in self.predictors:
            model.graph.node.extend(predictor.nodes)
            if predictor.output:
                model.graph.output.add().name = predictor.output  # ONNX Runtime infers its type

    def count(self, tag: int, actual: Sequence[np.ndarray], predicted: Sequence[Any]) -> PreGatingRun:
        """Score run ``tag``: ``actual[l]`` is layer ``l``'s expert ids (every layer), ``predicted`` the values of
        :attr:`outputs` (in order); kept for :meth:`take` and added to :attr:`cumulative`."""
        layers: list[LayerHits] = []
        counts: list[np.ndarray | None] = [None] * len(actual)
        for predictor, values in zip((p for p in self.predictors if p.output), predicted, strict=True):
            index, k = predictor.layer, predictor.top_k
            ids, real = np.asarray(values).reshape(-1), np.asarray(actual[index]).reshape(-1)
            if ids.size != real.size or ids.size % k:  # the two layers ran on different tokens: nothing to compare
                continue
            ids, real = ids.reshape(-1, k), real.reshape(-1, k)
            hits = int((real[:, :, None] == ids[:, None, :]).any(axis=2).sum())  # actual slots predicted
            layers.append(LayerHits(index, predictor.name, hits, real.size))
            counts[index] = np.bincount(ids.reshape(-1), minlength=self._widths[index])[: self._widths[index]]
        run = PreGatingRun(PreGatingHits(tuple(layers)), tuple(counts))
        with self._lock:
            for layer in layers:
                total = self._totals[layer.layer]
                total[0] += layer.hits
                total[1] += layer.slots
        self._pending.put(tag, run)
        return run

    def take(self, tag: int) -> PreGatingRun | None:
        """The pre-gating of the run tagged ``tag`` (removed), or None."""
        return self._pending.take(tag)

    @property
    def cumulative(self) -> PreGatingHits:
        """Every counted run's hits, per predicted layer."""
        names = {p.layer: p.name for p in self.predictors}
        with self._lock:
            return PreGatingHits(tuple(LayerHits(i, names[i], h, s) for i, (h, s) in self._totals.items()))

    @property
    def rate(self) -> float | None:
        """The cumulative hit rate (None before any slot was predicted)."""
        return self.cumulative.rate

    def unpredicted(self) -> dict[str, str]:
        """Layer name -> why it has no predictor."""
        return {p.name: p.reason for p in self.predictors if not p.output}

    def __repr__(self) -> str:
        rate = self.rate
        return (
            f"PreGating(predicted_layers={len(self.outputs)} of {len(self.predictors)}, "
            f"rate={'n/a' if rate is None else f'{rate:.3f}'})"
        )


class _NotRecognised(Exception):
    """The reason a layer gets no predictor."""


def plan_predictors(model, claimed: Sequence[Any]) -> tuple[LayerPredictor, ...]:
    """One :class:`LayerPredictor` per claimed sharded op of ``model`` (in the reporter's layer order); never
    raises for a graph it does not recognise (the predictor says why instead)."""
    nodes = {node.name: node for node in model.graph.node}
    producers = {output: node for node in model.graph.node for output in node.output if output}
    initializers = {t.name: t for t in model.graph.initializer}
    graph = _Graph(producers, initializers, {t.values.name for t in model.graph.sparse_initializer})
    predictors = []
    for position, claim in enumerate(claimed):
        name = claim.spec.layer
        if position == 0:
            predictors.append(LayerPredictor(position, name, reason="the first layer: no previous hidden state"))
            continue
        previous, op = claimed[position - 1], nodes[claim.name]
        source_x = nodes[previous.name].input[0]
        try:
            if previous.spec.hidden != claim.spec.hidden:
                raise _NotRecognised(f"its hidden width {claim.spec.hidden} differs from the previous layer's")
            cloned, output, top_k = graph.clone_router(op, source_x, f"{OUTPUT_PREFIX}{position}/")
            if top_k != claim.spec.top_k:
                raise _NotRecognised(f"its TopK's k {top_k} is not the op's top_k {claim.spec.top_k}")
        except _NotRecognised as exc:
            predictors.append(LayerPredictor(position, name, reason=str(exc)))
            continue
        predictors.append(LayerPredictor(position, name, position - 1, output, top_k, nodes=tuple(cloned)))
    return tuple(predictors)


class _Graph:
    """The producers and constants of a graph, to find and clone routers in."""

    def __init__(self, producers: dict[str, Any], initializers: dict[str, Any], sparse: set[str]) -> None:
        self.producers = producers
        self.initializers = initializers
        self.constants = set(initializers) | sparse
        self._constant: dict[str, bool] = {}

    def is_constant(self, name: str) -> bool:
        """An initializer, a Constant node's output, or computed from those alone (iteratively: no recursion)."""
        stack = [name]
        while stack:
            top = stack[-1]
            if top in self._constant or top in self.constants:
                stack.pop()
                continue
            node = self.producers.get(top)
            if node is None or node.op_type in _NOT_CLONED or _has_subgraph(node):
                self._constant[top] = False
                stack.pop()
                continue
            pending = [i for i in node.input if i and i not in self._constant and i not in self.constants]
            if pending:
                stack.extend(pending)
                continue
            self._constant[top] = all(self._constant.get(i, True) for i in node.input if i)
            stack.pop()
        return name in self.constants or self._constant[name]

    def clone_router(self, op, source_x: str, prefix: str) -> tuple[list, str, int]:
        """The router of sharded op ``op`` reading ``source_x`` instead of its own hidden state: the cloned nodes,
        the output of their TopK's indices, its k; :class:`_NotRecognised` when the router is not of that form."""
        from onnx import helper

        own_x, topk = op.input[0], self._topk_of(op.input[1])
        k = topk.input[1] if len(topk.input) > 1 else ""
        if not k or not self.is_constant(k):
            raise _NotRecognised("its TopK's k is not a constant")
        top_k = self._constant_int(k)
        chain = self._chain(topk.input[0], own_x)
        renamed = {own_x: source_x}
        cloned = []
        for node in [*chain, topk]:
            outputs = [f"{prefix}{out}" if out else "" for out in node.output]
            renamed.update({old: new for old, new in zip(node.output, outputs, strict=True) if old})
            copy = helper.make_node(
                node.op_type,
                [renamed.get(i, i) for i in node.input],
                outputs,
                name=f"{prefix}{node.name}",
                domain=node.domain,
            )
            copy.attribute.extend(node.attribute)
            cloned.append(copy)
        return cloned, cloned[-1].output[1], top_k

    def _topk_of(self, ids: str):
        """The TopK whose indices reach ``ids`` through id-preserving nodes."""
        name = ids
        for _ in range(MAX_CHAIN_NODES):
            node = self.producers.get(name)
            if node is None:
                raise _NotRecognised(f"its expert ids {ids!r} are not computed from a TopK in the graph")
            if node.op_type == "TopK" and node.domain in ("", "ai.onnx") and list(node.output).index(name) == 1:
                return node
            if node.op_type not in _ID_PRESERVING or node.domain not in ("", "ai.onnx"):
                raise _NotRecognised(f"its expert ids come from a {node.op_type} node {node.name!r}, not a TopK")
            if any(i and not self.is_constant(i) for i in node.input[1:]):
                raise _NotRecognised(f"its expert ids pass a {node.op_type} node whose shape is not a constant")
            name = node.input[0]
        raise _NotRecognised("its expert ids pass more nodes than a router has")

    def _chain(self, values: str, own_x: str) -> list:
        """The nodes computing ``values`` from ``own_x`` and constants, in graph order (a node once)."""
        chain: dict[str, Any] = {}
        stack = [values]
        while stack:
            name = stack.pop()
            if name == own_x or self.is_constant(name):
                continue
            node = self.producers.get(name)
            if node is None:
                raise _NotRecognised(f"its router reads {name!r}, neither its hidden state nor a constant")
            if node.name in chain:
                continue
            if node.op_type in _NOT_CLONED or _has_subgraph(node) or node.domain not in ("", "ai.onnx"):
                raise _NotRecognised(f"its router has a {node.op_type} node {node.name!r}, which is not cloned")
            chain[node.name] = node
            if len(chain) > MAX_CHAIN_NODES:
                raise _NotRecognised(f"its router's values take over {MAX_CHAIN_NODES} nodes from its hidden state")
            stack.extend(i for i in node.input if i)
        order = {id(node): index for index, node in enumerate(self.producers.values())}
        return sorted(chain.values(), key=lambda node: order[id(node)])

    def _constant_int(self, name: str) -> int:
        """The one positive integer the initializer or Constant node ``name`` holds."""
        value = self.initializers.get(name)
        node = self.producers.get(name)
        if value is None and node is not None and node.op_type == "Constant" and len(node.attribute) == 1:
            from onnx import helper

            value = helper.get_attribute_value(node.attribute[0])
        return _single_int(value, name)


def _single_int(value, name: str) -> int:
    from onnx import TensorProto, numpy_helper

    if not isinstance(value, TensorProto):
        raise _NotRecognised(f"its TopK's k {name!r} is not a constant tensor it can read")
    try:
        array = numpy_helper.to_array(value).reshape(-1)
    except Exception:  # noqa: BLE001 - external data not loaded, an odd type: not a k it can read
        raise _NotRecognised(f"its TopK's k {name!r} is not a constant tensor it can read") from None
    if array.size != 1 or not np.issubdtype(array.dtype, np.integer) or array[0] < 1:
        raise _NotRecognised(f"its TopK's k {name!r} is not one positive integer")
    return int(array[0])


def _has_subgraph(node) -> bool:
    from onnx import AttributeProto

    return any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute)
