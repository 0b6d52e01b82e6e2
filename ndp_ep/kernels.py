"""The sharded expert kernel and its registration as an ONNX Runtime custom op.

ONNX Runtime runs ``NdpShardedMoE`` nodes through onnxruntime-extensions' Python-op bridge. Two things of
that bridge are replaced here:

* its package ``__init__`` is not imported (it pulls in tokenizer converters and, with torch installed,
  takes seconds): the native extension module is loaded directly from the installed package;
* its stock invocation hook returns outputs as Python lists (~120 ns per element); ours returns the
  numpy arrays themselves, which the bridge copies with one memcpy.

Like a real execution provider, the session hands each kernel its weights when the session is created
(they are "resident" on the NDP units), so the op in ONNX Runtime's graph only receives activations:

    NdpShardedMoE(hidden[..,H] f32, expert_ids[..,K] i64, routing_weights[..,K] f32) -> [..,H] f32
    attribute kernel: key of the prepared kernel in this process's registry

The session compiles each claimed node so that decode steps (one token) run as ONNX Runtime kernels instead
(:mod:`ndp_ep.decode_graph`); this Python kernel serves prefill, where it groups tokens by expert.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.machinery
import importlib.util
import itertools
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np
from scipy.special import expit

from graph_passes.expert_math import gated_activation, plain_activation
from graph_passes.plan import GATED_ACTIVATIONS
from ndp_ep.errors import NdpEpError

CUSTOM_DOMAIN = "ai.onnx.contrib"  # the domain onnxruntime-extensions registers Python ops in
ORT_OP_TYPE = "NdpShardedMoE"
_NATIVE_NAME = "onnxruntime_extensions._extensions_pydll"
RESERVED_PYTHON_OP_SLOTS = 15  # with ours, 17 entries: a doubling vector then has capacity 32


class ExtensionsUnavailableError(NdpEpError):
    """onnxruntime-extensions is not installed or its native module cannot be loaded."""


@dataclass(frozen=True)
class ShardedExperts:
    """One MoE block's expert weights packed per shard, and how to apply them."""

    layer: str
    num_experts: int
    top_k: int
    shards: int
    activation: str
    activation_alpha: float
    activation_limit: float
    first: np.ndarray  # [E, S, H, W] with W = 2*I/S (gate then up) for GLU experts, I/S otherwise
    down: np.ndarray  # [E, S, I/S, H]
    first_bias: np.ndarray | None = None  # [E, S, W]
    down_bias: np.ndarray | None = None  # [E, H]
    gated: bool = field(init=False)
    # [E, H, S*W]: every shard's first-projection columns side by side, one matrix-vector product per expert
    _first_by_expert: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gated", self.activation in GATED_ACTIVATIONS)
        experts, shards, hidden, width = self.first.shape
        by_expert = np.ascontiguousarray(self.first.transpose(0, 2, 1, 3).reshape(experts, hidden, shards * width))
        object.__setattr__(self, "_first_by_expert", by_expert)

    def _activate(self, h: np.ndarray) -> np.ndarray:
        if not self.gated:
            return plain_activation(self.activation, h)
        half = h.shape[-1] // 2
        gate, up = h[..., :half], h[..., half:]
        if self.activation == "silu_glu":
            act = gate * expit(gate)
            act *= up
            return act
        return gated_activation(self.activation, gate, up, self.activation_alpha, self.activation_limit)

    def __call__(self, hidden: np.ndarray, expert_ids: np.ndarray, routing_weights: np.ndarray) -> np.ndarray:
        width = hidden.shape[-1]
        tokens = hidden.size // width if width else 0
        if expert_ids.size != tokens * self.top_k or routing_weights.size != expert_ids.size:
            raise ValueError(
                f"{self.layer}: expected {self.top_k} expert ids and weights per token, got "
                f"{expert_ids.shape} and {routing_weights.shape} for {tokens} tokens"
            )
        if tokens == 0:
            return np.zeros_like(hidden)
        if tokens == 1:  # decode: few experts, so plain Python ints and floats beat numpy scalars
            ids = expert_ids.ravel().tolist()
            if min(ids) < 0 or max(ids) >= self.num_experts:
                raise ValueError(f"{self.layer}: expert id out of range 0..{self.num_experts - 1}")
            out = self._single_token(hidden.reshape(1, width), ids, routing_weights.ravel().tolist())
            return out.reshape(hidden.shape)
        ids = expert_ids.reshape(-1)
        if ids.min() < 0 or ids.max() >= self.num_experts:
            raise ValueError(f"{self.layer}: expert id out of range 0..{self.num_experts - 1}")
        return self._grouped(hidden.reshape(tokens, width), ids, routing_weights.reshape(-1)).reshape(hidden.shape)

    def _single_token(self, x: np.ndarray, ids: list[int], weights: list[float]) -> np.ndarray:
        """Decode step: per selected expert, all shards' first projection in one matrix-vector product,
        then each shard's partial down projection ([S, 1, H]) reduced over shards."""
        shards, width = self.first.shape[1], self.first.shape[3]
        out = None
        for expert, weight in zip(ids, weights, strict=True):
            h = (x @ self._first_by_expert[expert]).reshape(shards, 1, width)
            if self.first_bias is not None:
                h += self.first_bias[expert][:, None, :]
            y = np.matmul(self._activate(h), self.down[expert]).sum(axis=0)  # reduce the shards' partial sums
            if self.down_bias is not None:
                y += self.down_bias[expert]
            y *= weight
            if out is None:
                out = y
            else:
                out += y
        return out

    def _grouped(self, x: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Tokens grouped by expert; each expert's shards in one batched product ([S, n, W])."""
        out = np.zeros_like(x)
        order = np.argsort(ids, kind="stable")
        counts = np.bincount(ids, minlength=self.num_experts)
        start = 0
        for expert in np.flatnonzero(counts):
            slots = order[start : start + counts[expert]]
            start += counts[expert]
            rows = slots // self.top_k
            h = np.matmul(x[rows], self.first[expert])  # [S, n, W]: every shard's first projection
            if self.first_bias is not None:
                h += self.first_bias[expert][:, None, :]
            y = np.matmul(self._activate(h), self.down[expert]).sum(axis=0)  # reduce the shards' partial sums
            if self.down_bias is not None:
                y += self.down_bias[expert]
            out[rows] += y * weights[slots, None]
        return out


class KernelRegistry:
    """Kernels prepared by live sessions, by key; entries vanish when their session is collected."""

    def __init__(self) -> None:
        self._kernels: dict[str, Callable] = {}
        # (thread, kernel key) -> the first error of a failed invocation, not yet reported
        self._errors: dict[tuple[int, str], str] = {}
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def add(self, kernel: Callable, owner: object) -> str:
        """Register ``kernel`` until ``owner`` (its session) is garbage-collected."""
        with self._lock:
            key = f"k{next(self._counter)}"
            self._kernels[key] = kernel
        weakref.finalize(owner, self._kernels.pop, key, None)
        return key

    def record_error(self, key: str, error: BaseException) -> None:
        """Keep a kernel's failure for its session to raise: an exception must not cross ONNX Runtime's C++
        frames (it would terminate the process)."""
        with self._lock:
            self._errors.setdefault((threading.get_ident(), key), f"{type(error).__name__}: {error}")

    def take_error(self, keys: Iterable[str]) -> str | None:
        """A pending error of any of ``keys`` (cleared), or None: this thread's first (ONNX Runtime's sequential
        executor runs the kernels on the caller's thread), else one recorded on another thread (parallel
        executor). A failed invocation's output is NaN, so a run that cannot be told apart is never plausible."""
        wanted = set(keys)
        with self._lock:
            mine = [k for k in self._errors if k[1] in wanted and k[0] == threading.get_ident()]
            chosen = mine or [k for k in self._errors if k[1] in wanted]
            return self._errors.pop(chosen[0]) if chosen else None

    def get(self, key: str) -> Callable:
        bound = self._kernels.get(key)
        if bound is None:
            raise RuntimeError(f"ndp-ep kernel {key!r} is not registered (its session was closed)")
        return bound


def _load_native() -> ModuleType:
    module = sys.modules.get(_NATIVE_NAME)
    if module is not None:
        return module
    spec = importlib.util.find_spec("onnxruntime_extensions")
    if spec is None or spec.origin is None:
        raise ExtensionsUnavailableError("onnxruntime-extensions is not installed (pip install onnxruntime-extensions)")
    candidates = glob.glob(os.path.join(os.path.dirname(spec.origin), "_extensions_pydll*"))
    candidates = [c for c in candidates if c.endswith((".so", ".pyd", ".dylib"))]
    if not candidates:
        raise ExtensionsUnavailableError("onnxruntime-extensions has no native Python-op module")
    loader = importlib.machinery.ExtensionFileLoader(_NATIVE_NAME, candidates[0])
    native_spec = importlib.util.spec_from_file_location(_NATIVE_NAME, candidates[0], loader=loader)
    module = importlib.util.module_from_spec(native_spec)
    loader.exec_module(module)
    sys.modules[_NATIVE_NAME] = module
    return module


class PythonOpBridge:
    """Our op definitions in onnxruntime-extensions' native module and the array-returning hook."""

    def __init__(self) -> None:
        self.native = _load_native()
        self.registry = KernelRegistry()
        definition = self.native.PyCustomOpDef()
        definition.op_type = ORT_OP_TYPE
        definition.obj_id = id(self.registry)
        types = self.native.PyCustomOpDef
        definition.input_types = [types.dt_float, types.dt_int64, types.dt_float]
        definition.output_types = [types.dt_float]
        definition.attrs = {"kernel": types.dt_string}
        self._our_op_id = definition.obj_id
        self._add_for_process_lifetime(definition)
        self._reserve_op_slots()
        self.install_hook()

    def _add_for_process_lifetime(self, definition) -> None:
        # The native op table keeps a raw pointer to the definition for the life of the process: never let
        # Python free it.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(definition))
        self.native.add_custom_op(definition)

    def _reserve_op_slots(self) -> None:
        """Pad the native op table so that later Python ops do not move it.

        onnxruntime-extensions keeps each domain's Python-op factories in a ``std::vector`` and hands ONNX
        Runtime pointers into it; a later ``add_custom_op`` that grows the vector (``import
        onnxruntime_extensions`` itself adds one, a user's ``@onnx_op`` another) leaves every session created
        before with dangling pointers, which crash when it runs. Growing the vector now, while no session of
        ours exists, to just past a doubling leaves room for ``RESERVED_PYTHON_OP_SLOTS`` later additions.
        """
        types = self.native.PyCustomOpDef
        for slot in range(RESERVED_PYTHON_OP_SLOTS + 1):
            placeholder = types()
            placeholder.op_type = f"NdpEpReservedSlot{slot}"
            placeholder.obj_id = 0  # never invoked: no node uses these op types
            placeholder.input_types = [types.dt_float]
            placeholder.output_types = [types.dt_float]
            placeholder.attrs = {}
            self._add_for_process_lifetime(placeholder)

    @property
    def library_path(self) -> str:
        return self.native.__file__

    def install_hook(self) -> None:
        """(Re)install our hook; ops of onnxruntime_extensions' own ``onnx_op`` still reach theirs."""
        self.native.PyCustomOpDef.install_hooker(self._invoke)

    def _invoke(self, op_id: int, feed, attributes):
        if op_id != self._our_op_id:  # an op defined with onnxruntime_extensions.onnx_op
            ocos = sys.modules.get("onnxruntime_extensions._ocos")
            if ocos is None:
                raise RuntimeError(f"no Python op with id {op_id}")
            return ocos._on_pyop_invocation(op_id, feed, attributes)
        key = attributes["kernel"]
        try:
            out = self.registry.get(key)(*feed)
        except Exception as error:  # noqa: BLE001 - raising here would abort the process (see record_error)
            self.registry.record_error(key, error)
            out = np.full(np.shape(feed[0]), np.nan, np.float32)
        if not out.flags.c_contiguous:
            out = np.ascontiguousarray(out)
        return op_id, out.shape, out.reshape(-1)


_bridge_lock = threading.Lock()
_bridge: PythonOpBridge | None = None


def python_op_bridge() -> PythonOpBridge:
    """The process-wide bridge (the native op table is process-wide, so this must be too)."""
    global _bridge
    with _bridge_lock:
        if _bridge is None:
            _bridge = PythonOpBridge()
        return _bridge
