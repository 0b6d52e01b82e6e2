"""A small constant folder for the integer computations exporters build from ``Shape`` (slice bounds, repeats).

Rules use :class:`ShapeEvaluator` to read a value that is computed, not stored: ``Shape`` → ``Gather`` →
``Concat`` chains and the like, evaluated with NumPy when every input is a constant or a known dimension.
"""

from __future__ import annotations

import numpy as np
import onnx

from graph_passes.graph_index import GraphIndex, is_standard_op

MAX_EVAL_DEPTH = 40


class ShapeEvaluator:
    """Evaluates the small integer computations exporters build from ``Shape`` (slice bounds, repeats).

    Unknown (symbolic) dims are ``None`` inside a ``Shape`` result; any arithmetic touching them gives None.
    """

    def __init__(self, index: GraphIndex) -> None:
        self.index = index
        self._memo: dict[str, np.ndarray | None] = {}

    def value(self, name: str, depth: int = 0) -> np.ndarray | None:
        if name in self._memo:
            return self._memo[name]
        result = None if depth > MAX_EVAL_DEPTH else self._compute(name, depth)
        self._memo[name] = result
        return result

    def ints(self, name: str) -> list[int] | None:
        """The value as a list of Python ints, or None if unknown or not integral."""
        array = self.value(name)
        if array is None:
            return None
        flat = np.asarray(array).reshape(-1).tolist()
        if any(v is None for v in flat):
            return None
        try:
            return [int(v) for v in flat]
        except (TypeError, ValueError):
            return None

    def _compute(self, name: str, depth: int) -> np.ndarray | None:
        constant = self.index.constant(name)
        if constant is not None:
            return constant
        node = self.index.producer.get(name)
        if node is None or not is_standard_op(node):
            return None
        try:
            return self._apply(node, name, depth)
        except (TypeError, ValueError, IndexError, KeyError, AttributeError, ZeroDivisionError, OverflowError):
            return None  # inputs this op cannot take (a hostile or broken graph): the value is unknown

    def _apply(self, node: onnx.NodeProto, name: str, depth: int) -> np.ndarray | None:
        op = node.op_type
        index = self.index
        if op == "Shape":
            shape = index.shape(node.input[0])
            if shape is None:
                return None
            dims = [d if isinstance(d, int) else None for d in shape]
            start = index.attr(node, "start", 0)
            end = index.attr(node, "end", len(dims))
            return np.array(dims[start:end], dtype=object)
        args = [self.value(i, depth + 1) if i else None for i in node.input]
        if op in ("Identity", "Cast"):
            if args[0] is None:
                return None
            return args[0] if op == "Identity" or args[0].dtype == object else args[0].astype(_np_type(node))
        if op == "Gather":
            data, idx = args
            if data is None or idx is None:
                return None
            return np.take(data, np.asarray(idx, dtype=np.int64), axis=index.attr(node, "axis", 0))
        if op == "Slice":
            data, starts, ends = args[0], args[1], args[2]
            axes = args[3] if len(args) > 3 and args[3] is not None else np.arange(len(starts))
            steps = args[4] if len(args) > 4 and args[4] is not None else np.ones(len(starts), dtype=np.int64)
            if data is None or starts is None or ends is None:
                return None
            slices = [slice(None)] * data.ndim
            for start, end, axis, step in zip(starts, ends, axes, steps, strict=False):
                slices[int(axis)] = slice(int(start), int(end), int(step))
            return data[tuple(slices)]
        if op == "Concat":
            if any(a is None for a in args):
                return None
            return np.concatenate([np.atleast_1d(a) for a in args], axis=index.attr(node, "axis", 0))
        if op in ("Unsqueeze", "Squeeze", "Reshape"):
            data = args[0]
            if data is None:
                return None
            if op == "Reshape":
                target = self.ints(node.input[1])
                return (
                    None
                    if target is None
                    else np.reshape(data, [d if d != 0 else data.shape[i] for i, d in enumerate(target)])
                )
            axes = self.ints(node.input[1]) if len(node.input) > 1 else index.attr(node, "axes")
            if op == "Squeeze":
                return np.squeeze(data, axis=tuple(axes)) if axes else np.squeeze(data)
            result = data
            for axis in sorted(a % (data.ndim + len(axes)) for a in axes):
                result = np.expand_dims(result, axis)
            return result
        if op in ("Add", "Sub", "Mul", "Div"):
            left, right = args
            if left is None or right is None:
                return None
            if op == "Add":
                return left + right
            if op == "Sub":
                return left - right
            if op == "Mul":
                return left * right
            integral = all(np.asarray(a).dtype.kind in "iuO" for a in (left, right))
            return left // right if integral else left / right
        if op == "OneHot":
            indices, depth_value, values = args
            if indices is None or depth_value is None or values is None:
                return None
            count = int(np.asarray(depth_value).reshape(-1)[0])
            out = np.full(np.asarray(indices).shape + (count,), values[0], dtype=object)
            for pos, i in np.ndenumerate(np.asarray(indices)):
                out[pos + (int(i) % count,)] = values[1]
            axis = index.attr(node, "axis", -1)
            return np.moveaxis(out, -1, axis) if axis != -1 else out
        return None


def _np_type(node: onnx.NodeProto) -> type:
    to = onnx.helper.get_attribute_value(next(a for a in node.attribute if a.name == "to"))
    return onnx.helper.tensor_dtype_to_np_dtype(to)
