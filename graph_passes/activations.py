"""The expert activation catalog: the one place an expert activation and its constants are defined.

Every activation the sharded op supports has one :class:`Activation` entry in :data:`CATALOG` with

- ``gated``: whether it multiplies a gate projection with an up projection (GLU) or maps one projection;
- ``apply``: the float32 NumPy function the verifier and the Python kernels compute with;
- ``reference``: an independent float64 formula (used to identify decomposed activations numerically);
- ``emit``: an ONNX emitter building the same function out of standard ops;
- ``native``: the float32 C++ expression the native kernel computes per element: over ``float x`` for a plain
  activation, over ``float g, u, alpha, limit, beta`` for a gated one. It may call ``std::`` math and the plain
  activations of this catalog as ``act_<name>(x)``.

Plain activations have signature ``f(x)``; gated ones ``f(gate, up, alpha, limit, beta)``. The clamped SwiGLU
of GPT-OSS (``swiglu_clamp``) is::

    g = min(gate, limit);  u = clip(up, -limit, limit);  act = (u + beta) * g * sigmoid(alpha * g)

with :data:`SWIGLU_ALPHA`, :data:`SWIGLU_LIMIT`, :data:`SWIGLU_BETA` as defaults. Adding an activation means
adding one entry here and nothing else: the native build (``native/codegen.py``, run by CMake) reads this
file with :mod:`ast` and generates the kernel's activation enum, name table, gated flags and per-element loops
from the ``Activation(...)`` entries and the three defaults, so those must stay literals.

``gelu`` needs erf: SciPy's vectorised erf is imported lazily on first use (never on the import path of the
converter), with a ``math.erf`` fallback.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0
SWIGLU_BETA = 1.0

_F32 = np.float32


def erf(x: np.ndarray) -> np.ndarray:
    """Elementwise erf of ``x`` (same dtype), via SciPy when installed."""
    try:
        from scipy.special import erf as scipy_erf
    except ImportError:  # pragma: no cover - scipy is a dependency
        return np.frompyfunc(math.erf, 1, 1)(x).astype(np.asarray(x).dtype)
    return scipy_erf(x).astype(np.asarray(x).dtype, copy=False)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function in ``x``'s float dtype."""
    x = np.asarray(x)
    one = x.dtype.type(1)
    with np.errstate(over="ignore"):  # exp(-x) overflows to inf for very negative x: the limit 0 is right
        return (one / (one + np.exp(-x))).astype(x.dtype, copy=False)


def _relu(x):
    return np.maximum(x, x.dtype.type(0))


def _gelu(x):
    t = x.dtype.type
    return (t(0.5) * x * (t(1) + erf(x / t(math.sqrt(2.0))))).astype(x.dtype, copy=False)


def _gelu_tanh(x):
    t = x.dtype.type
    inner = t(math.sqrt(2.0 / math.pi)) * (x + t(0.044715) * x * x * x)
    return (t(0.5) * x * (t(1) + np.tanh(inner))).astype(x.dtype, copy=False)


def _silu(x):
    return x * sigmoid(x)


def _silu_glu(gate, up, alpha, limit, beta):
    return _silu(gate) * up


def _gelu_glu(gate, up, alpha, limit, beta):
    return _gelu(gate) * up


def _gelu_tanh_glu(gate, up, alpha, limit, beta):
    return _gelu_tanh(gate) * up


def _swiglu_clamp(gate, up, alpha, limit, beta):
    t = gate.dtype.type
    g = np.minimum(gate, t(limit))
    u = np.clip(up, t(-limit), t(limit))
    return (u + t(beta)) * (g * sigmoid(t(alpha) * g))


# float64 references, written out independently of the functions above
def _ref_relu(x):
    return np.where(x > 0, x, 0.0)


def _ref_gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _ref_gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _ref_silu(x):
    return x / (1.0 + np.exp(-x))


def _ref_silu_glu(gate, up, alpha, limit, beta):
    return _ref_silu(gate) * up


def _ref_gelu_glu(gate, up, alpha, limit, beta):
    return _ref_gelu(gate) * up


def _ref_gelu_tanh_glu(gate, up, alpha, limit, beta):
    return _ref_gelu_tanh(gate) * up


def _ref_swiglu_clamp(gate, up, alpha, limit, beta):
    g = np.where(gate > limit, limit, gate)
    u = np.where(up > limit, limit, np.where(up < -limit, -limit, up))
    return (u + beta) * g / (1.0 + np.exp(-alpha * g))


# ONNX emitters: ``op(op_type, inputs, **attrs) -> value`` adds a node, ``const(name, array) -> value`` a constant
Op = Callable[..., str]
Const = Callable[[str, np.ndarray], str]


def _emit_relu(op: Op, const: Const, x: str) -> str:
    return op("Relu", [x])


def _emit_gelu(op: Op, const: Const, x: str) -> str:
    erf_value = op("Erf", [op("Mul", [x, const("inv_sqrt2", _F32(1 / math.sqrt(2.0)))])])
    return op("Mul", [op("Mul", [x, const("half", _F32(0.5))]), op("Add", [erf_value, const("one", _F32(1.0))])])


def _emit_gelu_tanh(op: Op, const: Const, x: str) -> str:
    cube = op("Mul", [op("Mul", [x, x]), x])
    inner = op("Add", [x, op("Mul", [cube, const("c044715", _F32(0.044715))])])
    tanh = op("Tanh", [op("Mul", [inner, const("sqrt_2_pi", _F32(math.sqrt(2.0 / math.pi)))])])
    return op("Mul", [op("Mul", [x, const("half_t", _F32(0.5))]), op("Add", [tanh, const("one_t", _F32(1.0))])])


def _emit_silu(op: Op, const: Const, x: str) -> str:
    return op("Mul", [x, op("Sigmoid", [x])])


def _emit_silu_glu(op: Op, const: Const, gate: str, up: str, alpha: float, limit: float, beta: float) -> str:
    return op("Mul", [_emit_silu(op, const, gate), up])


def _emit_gelu_glu(op: Op, const: Const, gate: str, up: str, alpha: float, limit: float, beta: float) -> str:
    return op("Mul", [_emit_gelu(op, const, gate), up])


def _emit_gelu_tanh_glu(op: Op, const: Const, gate: str, up: str, alpha: float, limit: float, beta: float) -> str:
    return op("Mul", [_emit_gelu_tanh(op, const, gate), up])


def _emit_swiglu_clamp(op: Op, const: Const, gate: str, up: str, alpha: float, limit: float, beta: float) -> str:
    g = op("Min", [gate, const("limit", _F32(limit))])
    u = op("Clip", [up, const("neg_limit", _F32(-limit)), const("pos_limit", _F32(limit))])
    glu = op("Mul", [g, op("Sigmoid", [op("Mul", [g, const("alpha", _F32(alpha))])])])
    return op("Mul", [op("Add", [u, const("beta", _F32(beta))]), glu])


@dataclass(frozen=True)
class Activation:
    """One expert activation (see the module docstring for the function signatures)."""

    name: str
    gated: bool
    apply: Callable[..., np.ndarray]
    reference: Callable[..., np.ndarray]
    emit: Callable[..., str] | None
    description: str
    native: str

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").isalnum():
            raise ValueError(f"activation name must be an identifier, got {self.name!r}")
        if not callable(self.apply) or not callable(self.reference):
            raise ValueError(f"activation {self.name}: apply and reference must be callable")
        if not self.native.strip():
            raise ValueError(f"activation {self.name}: the native C++ expression is empty")


CATALOG: dict[str, Activation] = {
    a.name: a
    for a in (
        Activation(
            "silu_glu",
            True,
            _silu_glu,
            _ref_silu_glu,
            _emit_silu_glu,
            "silu(x Wg) * (x Wu): Mixtral, Qwen",
            native="act_silu(g) * u",
        ),
        Activation(
            "swiglu_clamp",
            True,
            _swiglu_clamp,
            _ref_swiglu_clamp,
            _emit_swiglu_clamp,
            "clamped SwiGLU: GPT-OSS",
            native="(std::clamp(u, -limit, limit) + beta)"
            " * (std::min(g, limit) * (1.0f / (1.0f + std::exp(-alpha * std::min(g, limit)))))",
        ),
        Activation(
            "gelu_glu", True, _gelu_glu, _ref_gelu_glu, _emit_gelu_glu, "gelu(x Wg) * (x Wu)", native="act_gelu(g) * u"
        ),
        Activation(
            "gelu_tanh_glu",
            True,
            _gelu_tanh_glu,
            _ref_gelu_tanh_glu,
            _emit_gelu_tanh_glu,
            "gelu_tanh(x Wg) * (x Wu): GeGLU of Gemma-4 MoE (com.microsoft.MoE activation_type=geglu)",
            native="act_gelu_tanh(g) * u",
        ),
        Activation("relu", False, _relu, _ref_relu, _emit_relu, "relu(x W1)", native="std::max(x, 0.0f)"),
        Activation(
            "gelu",
            False,
            _gelu,
            _ref_gelu,
            _emit_gelu,
            "erf GELU",
            native="0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f))",
        ),
        Activation(
            "gelu_tanh",
            False,
            _gelu_tanh,
            _ref_gelu_tanh,
            _emit_gelu_tanh,
            "tanh-approximated GELU",
            native="0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)))",
        ),
        Activation(
            "silu", False, _silu, _ref_silu, _emit_silu, "x * sigmoid(x)", native="x * (1.0f / (1.0f + std::exp(-x)))"
        ),
    )
}

GATED_ACTIVATIONS = tuple(name for name, a in CATALOG.items() if a.gated)
PLAIN_ACTIVATIONS = tuple(name for name, a in CATALOG.items() if not a.gated)
ACTIVATIONS = tuple(CATALOG)


def get(name: str) -> Activation:
    """The catalog entry of ``name``; ``ValueError`` for an unknown name."""
    try:
        return CATALOG[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r} (known: {', '.join(CATALOG)})") from None


def apply_plain(name: str, x: np.ndarray) -> np.ndarray:
    activation = get(name)
    if activation.gated:
        raise ValueError(f"{name} is a gated activation")
    return activation.apply(x)


def apply_gated(
    name: str,
    gate: np.ndarray,
    up: np.ndarray,
    alpha: float = SWIGLU_ALPHA,
    limit: float = SWIGLU_LIMIT,
    beta: float = SWIGLU_BETA,
) -> np.ndarray:
    activation = get(name)
    if not activation.gated:
        raise ValueError(f"{name} is not a gated activation")
    return activation.apply(gate, up, alpha, limit, beta)


# -- numeric identification: which catalog activation a NumPy function computes, from sampled points --

ACTIVATION_SAMPLES = 2001
ACTIVATION_RTOL = 1e-5
_REFERENCE = {name: CATALOG[name].reference for name in PLAIN_ACTIVATIONS}


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.all(np.abs(a - b) <= ACTIVATION_RTOL * (1.0 + np.abs(b))))


def identify_plain(function) -> str | None:
    """The plain activation ``function(x)`` computes (its float64 reference within :data:`ACTIVATION_RTOL` at
    :data:`ACTIVATION_SAMPLES` points of [-8, 8]), or None."""
    x = np.linspace(-8.0, 8.0, ACTIVATION_SAMPLES)
    try:
        y = np.asarray(function(x), dtype=np.float64)
    except (TypeError, ValueError, FloatingPointError):
        return None
    return next((name for name, f in _REFERENCE.items() if y.shape == x.shape and _close(y, f(x))), None)


def identify_gated(function) -> str | None:
    """The gated activation ``function(gate, up)`` computes (``silu_glu`` or ``gelu_glu`` at the SwiGLU defaults,
    within :data:`ACTIVATION_RTOL` at :data:`ACTIVATION_SAMPLES` seeded random points), or None."""
    rng = np.random.default_rng(0)
    gate, up = rng.uniform(-8.0, 8.0, (2, ACTIVATION_SAMPLES))
    try:
        y = np.asarray(function(gate, up), dtype=np.float64)
    except (TypeError, ValueError, FloatingPointError):
        return None
    for name in ("silu_glu", "gelu_glu"):
        reference = CATALOG[name].reference(gate, up, SWIGLU_ALPHA, SWIGLU_LIMIT, SWIGLU_BETA)
        if y.shape == gate.shape and _close(y, reference):
            return name
    return None
