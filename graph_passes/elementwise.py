"""An elementwise subgraph as a NumPy function: the nodes between some inputs and an output, when each is an
elementwise op with scalar constants only (:func:`elementwise_function`), evaluated in float64 so that sampled points
identify the function (:func:`graph_passes.activations.identify_plain` / ``identify_gated``)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import onnx

from graph_passes.activations import CATALOG, erf
from graph_passes.graph_index import GraphIndex, is_standard_op

# elementwise ops an activation subgraph may use, evaluated with NumPy for numeric identification
_UNARY = {
    "Neg": np.negative,
    "Abs": np.abs,
    "Sqrt": np.sqrt,
    "Exp": np.exp,
    "Tanh": np.tanh,
    "Erf": erf,
    "Sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "Relu": lambda x: np.maximum(x, 0.0),
    "Reciprocal": np.reciprocal,
    "Softplus": lambda x: np.logaddexp(0.0, x),
    "Identity": lambda x: x,
}
_BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power}
MAX_ACTIVATION_NODES = 40
# A step's NumPy evaluation: (index, node, its input arrays; None for an omitted optional input) -> output
Step = Callable[[GraphIndex, onnx.NodeProto, list], np.ndarray]


def _unary_step(f: Callable) -> Step:
    return lambda index, node, args: f(args[0])


def _binary_step(f: Callable) -> Step:
    return lambda index, node, args: f(args[0], args[1])


def _clip_step(index: GraphIndex, node: onnx.NodeProto, args: list) -> np.ndarray:
    low = args[1] if len(args) > 1 and args[1] is not None else -np.inf
    high = args[2] if len(args) > 2 and args[2] is not None else np.inf
    return np.clip(args[0], low, high)


def _gelu_step(index: GraphIndex, node: onnx.NodeProto, args: list) -> np.ndarray:
    approximate = index.attr(node, "approximate", "none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    return CATALOG["gelu_tanh" if approximate == "tanh" else "gelu"].reference(args[0])


_STEPS: dict[str, Step] = {
    **{op: _unary_step(f) for op, f in _UNARY.items()},
    **{op: _binary_step(f) for op, f in _BINARY.items()},
    "Min": lambda index, node, args: functools.reduce(np.minimum, args[1:], args[0]),
    "Max": lambda index, node, args: functools.reduce(np.maximum, args[1:], args[0]),
    "Clip": _clip_step,
    "Cast": lambda index, node, args: args[0],  # only to float types (see _is_step)
    "Gelu": _gelu_step,
}


def elementwise_function(index: GraphIndex, inputs: list[str], output: str):
    """``output`` as a NumPy function of ``inputs`` if every node between them is elementwise with scalar
    constants only (so that sampled points identify it); else None."""
    order = _elementwise_steps(index, inputs, output)
    if order is None:
        return None

    def function(*arrays: np.ndarray) -> np.ndarray:
        values: dict[str, np.ndarray] = dict(zip(inputs, arrays, strict=True))

        def get(name: str):
            if not name:
                return None
            if name in values:
                return values[name]
            return index.constant(name).astype(np.float64).reshape(())

        for node in order:
            values[node.output[0]] = _STEPS[node.op_type](index, node, [get(i) for i in node.input])
        return values[output]

    return function


def _elementwise_steps(index: GraphIndex, inputs: list[str], output: str) -> list[onnx.NodeProto] | None:
    """The nodes from ``inputs`` to ``output`` in graph order, when each is a step of :data:`_STEPS` reading
    only the inputs, earlier steps and scalar constants, and each input is read; else None."""
    nodes = index.upstream(output, stop=set(inputs))
    if not nodes or len(nodes) > MAX_ACTIVATION_NODES:
        return None
    # Constant nodes are scalars read through index.constant, not steps of the function
    order = [n for n in index.graph.node if n.name in nodes and n.op_type != "Constant"]
    in_order = {n.name for n in order}
    if not all(_is_step(index, node, inputs, in_order) for node in order):
        return None
    if not order or not all(any(i in n.input for n in order) for i in inputs):
        return None
    return order


def _is_step(index: GraphIndex, node: onnx.NodeProto, inputs: list[str], in_order: set[str]) -> bool:
    """``node`` is an op of :data:`_STEPS` (a Cast only to float) whose inputs other than ``inputs`` and the
    outputs of ``in_order`` are scalar constants."""
    if not is_standard_op(node) or node.op_type not in _STEPS:
        return False
    if node.op_type == "Cast" and index.attr(node, "to") not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
        return False
    for value in node.input:
        producer = index.producer.get(value) if value else None
        if value and value not in inputs and (producer is None or producer.name not in in_order):
            constant = index.constant(value)
            if constant is None or constant.size != 1:
                return False
    return True
