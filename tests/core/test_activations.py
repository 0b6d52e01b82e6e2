"""Every activation of the catalog: the float32 NumPy function, the ONNX emitter (run in ONNX Runtime) and the
catalog's own float64 reference agree with float64 formulas written out in this test."""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import graph_passes.activations
from graph_passes.activations import CATALOG, SWIGLU_ALPHA, SWIGLU_BETA, SWIGLU_LIMIT

ROOT = Path(__file__).resolve().parents[2]

ALPHA, LIMIT, BETA = 1.3, 2.5, 0.25  # non-default parameters, so that a dropped parameter shows


def _erf(x):
    return np.array([math.erf(v) for v in x.ravel()]).reshape(x.shape)


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


EXPECTED = {
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0))),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3))),
    "silu": lambda x: x * _sig(x),
    "silu_glu": lambda g, u: g * _sig(g) * u,
    "gelu_glu": lambda g, u: 0.5 * g * (1.0 + _erf(g / np.sqrt(2.0))) * u,
    "gelu_tanh_glu": lambda g, u: 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g**3))) * u,
    "swiglu_clamp": lambda g, u: (
        (np.clip(u, -LIMIT, LIMIT) + BETA) * np.minimum(g, LIMIT) * _sig(ALPHA * np.minimum(g, LIMIT))
    ),
}


def test_the_catalog_and_this_test_list_the_same_activations():
    assert sorted(CATALOG) == sorted(EXPECTED)
    assert (SWIGLU_ALPHA, SWIGLU_LIMIT, SWIGLU_BETA) == (1.702, 7.0, 1.0)


def _emitted(activation, arrays: list[np.ndarray]) -> np.ndarray:
    nodes, initializers, counter = [], [], iter(range(1000))

    def op(op_type, inputs, **attrs):
        out = f"{op_type}_{next(counter)}"
        nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def const(name, array):
        initializers.append(numpy_helper.from_array(np.asarray(array), f"c_{name}"))
        return f"c_{name}"

    names = ["g", "u"][: len(arrays)]
    params = (ALPHA, LIMIT, BETA) if activation.gated else ()
    out = activation.emit(op, const, *names, *params)
    inputs = [helper.make_tensor_value_info(n, 1, list(a.shape)) for n, a in zip(names, arrays, strict=True)]
    graph = helper.make_graph(nodes, "a", inputs, [helper.make_tensor_value_info(out, 1, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, dict(zip(names, arrays, strict=True)))[0]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_implementation_matches_the_float64_formula(name):
    activation = CATALOG[name]
    rng = np.random.default_rng(3)
    arrays = [rng.uniform(-6.0, 6.0, 257) for _ in range(2 if activation.gated else 1)]
    want = EXPECTED[name](*arrays)
    params = (ALPHA, LIMIT, BETA) if activation.gated else ()
    reference = activation.reference(*arrays, *params)
    np.testing.assert_allclose(reference, want, rtol=1e-12, atol=1e-12)
    as_float32 = [a.astype(np.float32) for a in arrays]
    got = activation.apply(*as_float32, *params)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    if activation.emit is not None:
        np.testing.assert_allclose(_emitted(activation, as_float32), want, rtol=2e-5, atol=2e-5)


@functools.cache
def _generator():
    """native/codegen.py (a build script, not a package module) loaded from its path."""
    spec = importlib.util.spec_from_file_location("ndp_codegen", ROOT / "native" / "codegen.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_native_generator_reads_every_catalog_entry_and_its_native_expression():
    generator = _generator()
    entries, defaults = generator.read_catalog(Path(graph_passes.activations.__file__))
    assert [(e.name, e.gated, e.native) for e in entries] == [(a.name, a.gated, a.native) for a in CATALOG.values()]
    assert all(a.native.strip() for a in CATALOG.values())
    assert defaults == {"SWIGLU_ALPHA": SWIGLU_ALPHA, "SWIGLU_LIMIT": SWIGLU_LIMIT, "SWIGLU_BETA": SWIGLU_BETA}
    header = generator.render(entries, defaults, "catalog")
    for entry in entries:
        assert f'{{"{entry.name}", Activation::{entry.enumerator}, {str(entry.gated).lower()}}}' in header
        assert f"case Activation::{entry.enumerator}:" in header


def test_the_native_generator_refuses_an_entry_without_a_native_expression(tmp_path):
    source = Path(graph_passes.activations.__file__).read_text()
    relu = 'native="std::max(x, 0.0f)"'
    assert source.count(relu) == 1
    broken = tmp_path / "activations.py"
    broken.write_text(source.replace(", " + relu, ""))
    with pytest.raises(_generator().CatalogError, match="needs literal name, gated and native"):
        _generator().read_catalog(broken)


def test_the_native_op_contract_header_carries_the_python_domain_type_and_opset(tmp_path):
    from graph_passes import sharded_op

    generator = _generator()
    assert generator.main([str(ROOT), str(tmp_path)]) == 0
    header = (tmp_path / "op_contract_gen.h").read_text()
    assert f'constexpr const char* kDomain = "{sharded_op.DOMAIN}";' in header
    assert f'constexpr const char* kOpType = "{sharded_op.OP_TYPE}";' in header
    assert f"constexpr int kOpsetVersion = {sharded_op.OPSET};" in header
    for name in sharded_op.ATTRIBUTES:  # one constant per attribute, the native reader's only spelling of it
        camel = "".join(part.capitalize() for part in name.split("_"))
        assert f'constexpr const char* k{camel} = "{name}";' in header
    assert (tmp_path / "activations_gen.h").read_text().startswith("// Generated from graph_passes/activations.py")
