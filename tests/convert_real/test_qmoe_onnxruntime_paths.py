"""Converted int8 / int4 experts give what stock ONNX Runtime's CPU ``com.microsoft.QMoE`` gives by default, and
under each value of ``ORT_QMOE_CPU_QNBIT_GEMM``.

From onnxruntime 1.31 the CPU QMoE kernel (onnxruntime/contrib_ops/cpu/moe/moe_quantization_cpu.cc) runs
block-wise experts on MLAS's QNBit GEMM: 8-bit experts with their activations quantized to int8 per weight block
(MLAS CompInt8) unless the variable is ``fp32`` or ``0``, 4-bit ones in float unless it is ``int8``; earlier
releases dequantize and run SGEMM whatever the variable says. The first test pins that arithmetic with a NumPy
reading written here (per block: scale = amax / 127, round half to even, integer dot products); the others run
the provider on converted models against stock ONNX Runtime on the originals, with the same setting on both
sides, at the acceptance tolerance (1e-3 of the largest output), and check that the int8 path stays
deterministic.
"""

from __future__ import annotations

import contextlib
import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ndp_ep
from graph_passes.convert import convert
from graph_passes.rewrite import materialize
from ndp_ep.ep import _version_tuple
from tests.convert_real.test_precisions import _unpack, qmoe_layer
from tests.genai.conftest import GENAI_DIR, manifest

ENV = "ORT_QMOE_CPU_QNBIT_GEMM"
QNBIT_QMOE = _version_tuple(ort.__version__) >= (1, 31)  # the first onnxruntime whose QMoE reads ENV
TOLERANCE = 1e-3  # the acceptance tolerance for int8 / int4, relative to the largest output
LAYER_TOLERANCE = 1e-4  # one layer on identical inputs: float rounding only (the old float kernel is ~1e-2 off)
TOKENS = 7


def _layer(bits: int, block: int, zero_points: bool, hidden: int, ffn: int, seed: int, experts: int = 4):
    """A QMoE layer with seeded random weights (GPT-OSS SwiGLU for 8 bits, SiLU-GLU for 4) and feeds."""
    rng = np.random.default_rng(seed)
    model, inputs = qmoe_layer(rng, bits, block, zero_points, hidden, ffn, experts=experts)
    feeds = {
        "x": rng.standard_normal((TOKENS, hidden)).astype(np.float32),
        "logits": rng.standard_normal((TOKENS, experts)).astype(np.float32),
    }
    return model, feeds, inputs


def _options(threads: int = 1) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return options


def _stock(model: onnx.ModelProto, feeds) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), _options(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _converted(model: onnx.ModelProto) -> bytes:
    rewritten, report = convert(model, shards=2)
    assert report.blocks and not report.skipped, report.skipped
    return materialize(rewritten).SerializeToString()


@pytest.mark.parametrize("env", [None, "fp32", "int8"])
def test_a_wide_int8_layer_converts_under_each_onnxruntime_arithmetic(env, monkeypatch):
    """The converter proves a block against stock ONNX Runtime with float and with int8-activation readings of
    its quantized weights, so a layer wide enough for int8 activations to move its output by more than the
    float check's tolerance still converts (it was skipped when only the float reading was tried)."""
    if env is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, env)
    model, _, _ = _layer(8, 32, False, hidden=512, ffn=256, seed=3)
    _, report = convert(model, shards=2)
    assert len(report.blocks) == 1 and not report.skipped, report.skipped


def _provider_session(converted: bytes, threads: int = 1) -> ort.InferenceSession:
    return ort.InferenceSession(converted, ndp_ep.session_options(_options(threads)))


def _relative(got: np.ndarray, expected: np.ndarray) -> float:
    got, expected = got.astype(np.float64), expected.astype(np.float64)
    return float(np.max(np.abs(got - expected)) / np.max(np.abs(expected)))


def _reference(inputs, feeds, bits: int, block: int, int8_activations: bool) -> np.ndarray:
    """The QMoE layer in float64 with ONNX Runtime's router; each projection either multiplies the dequantized
    weights or, as MLAS CompInt8, int8 activations per block: q = round-half-even(a * 127 / amax), integer dot
    products with (q_w - zero_point), scaled by (amax / 127) * weight scale per block."""
    x, logits = feeds["x"], feeds["logits"]
    swiglu = bits == 8

    def project(a: np.ndarray, name: str, e: int) -> np.ndarray:
        q = _unpack(inputs[name][e], bits).astype(np.int64)
        scales = inputs[name + "_scales"][e].astype(np.float64)
        zp_name = name + "_zp"
        zp = _unpack(inputs[zp_name][e], bits)[:, : scales.shape[1]] if zp_name in inputs else 2 ** (bits - 1)
        w = (q.reshape(q.shape[0], -1, block) - np.asarray(zp)[..., None]).astype(np.int64)  # [out, blocks, block]
        if not int8_activations:
            return (w * scales[..., None]).reshape(q.shape[0], -1).astype(np.float64) @ a.astype(np.float64)
        blocks = a.astype(np.float32).reshape(-1, block)
        amax = np.abs(blocks).max(axis=1)
        inverse = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
        qa = np.rint((blocks * inverse[:, None]).astype(np.float32)).astype(np.int64)  # rint: half to even
        dots = np.einsum("obk,bk->ob", w, qa).astype(np.float64)
        return (dots * scales * (amax / np.float32(127)).astype(np.float64)).sum(axis=1)

    out = np.zeros(x.shape, np.float64)
    for t in range(x.shape[0]):
        ids = np.argsort(-logits[t], kind="stable")[:2]
        weights = np.exp(logits[t][ids].astype(np.float64) - logits[t][ids].max())
        weights /= weights.sum()
        for e, weight in zip(ids, weights, strict=True):
            h = (project(x[t], "fc1", e) + inputs["fc1_bias"][e]).astype(np.float32)
            gate, up = h[0::2].astype(np.float64), h[1::2].astype(np.float64)
            if swiglu:
                gate, up = np.minimum(gate, 7.0), np.clip(up, -7.0, 7.0)
                act = (up + 1.0) * gate / (1.0 + np.exp(-1.702 * gate))
            else:
                act = gate / (1.0 + np.exp(-gate)) * up
            out[t] += weight * (project(act.astype(np.float32), "fc2", e) + inputs["fc2_bias"][e])
    return out


@pytest.mark.parametrize(
    ("bits", "env", "int8_activations"),
    [(8, None, QNBIT_QMOE), (8, "fp32", False), (4, None, False), (4, "int8", QNBIT_QMOE)],
)
def test_onnxruntime_qmoe_quantizes_activations_to_int8_per_block_where_documented(
    bits, env, int8_activations, monkeypatch
):
    block = 32
    model, feeds, inputs = _layer(bits, block, zero_points=False, hidden=64, ffn=64, seed=bits)
    if env:
        monkeypatch.setenv(ENV, env)
    else:
        monkeypatch.delenv(ENV, raising=False)
    stock = _stock(model, feeds)
    expected = _reference(inputs, feeds, bits, block, int8_activations)
    other = _reference(inputs, feeds, bits, block, not int8_activations)
    assert _relative(stock, expected) < 1e-5
    assert _relative(stock, other) > 1e-3  # the two arithmetics are told apart on this layer


@pytest.mark.parametrize(
    ("bits", "block", "zero_points", "hidden", "ffn", "env"),
    [
        (8, 32, False, 64, 64, None),
        (8, 16, True, 64, 64, None),
        (8, 64, True, 128, 128, None),
        (8, 32, False, 64, 64, "fp32"),
        (8, 32, False, 64, 64, "0"),
        (8, 32, False, 64, 64, "int8"),
        (8, 512, False, 512, 512, None),  # no MLAS QNBit kernel for this block: dequantize then SGEMM
        (4, 32, False, 64, 128, None),
        (4, 32, True, 64, 128, "int8"),
        (4, 64, False, 128, 128, "fp32"),
        # input widths that are not multiples of block_size: ONNX Runtime multiplies such a projection in float
        # (dequantize + SGEMM) even where it gives a whole-block one int8 activations, projection by projection
        (8, 32, False, 80, 64, None),  # the first projection in float (hidden 2.5 blocks), the down one in int8
        (8, 32, False, 64, 48, None),  # the other way round (one shard: ffn 1.5 blocks)
        (8, 16, True, 72, 40, None),  # both in float
        (8, 32, False, 80, 64, "fp32"),
        (4, 32, False, 80, 64, None),
        (4, 32, True, 64, 48, "int8"),
        (4, 64, True, 96, 80, None),
        (4, 128, False, 160, 96, "int8"),  # a block wider than the FFN: one partial block
    ],
)
def test_provider_reproduces_onnxruntime_qmoe_under_each_setting(
    bits, block, zero_points, hidden, ffn, env, monkeypatch
):
    model, feeds, _ = _layer(bits, block, zero_points, hidden, ffn, seed=bits * 1000 + block + hidden)
    if env:
        monkeypatch.setenv(ENV, env)
    else:
        monkeypatch.delenv(ENV, raising=False)
    stock = _stock(model, feeds)
    ours = _provider_session(_converted(model)).run(None, feeds)[0]
    assert _relative(ours, stock) < LAYER_TOLERANCE


def test_a_setting_onnxruntime_refuses_fails_the_provider_session_with_one_line(monkeypatch):
    if not QNBIT_QMOE:
        pytest.skip(f"onnxruntime {ort.__version__} does not read {ENV}")
    model, _, _ = _layer(8, 32, False, 64, 64, seed=3)
    converted = _converted(model)
    monkeypatch.setenv(ENV, "fast")
    with pytest.raises(Exception, match=f"{ENV} must be 0, fp32 or int8 .*got 'fast'") as failure:
        _provider_session(converted)
    with pytest.raises(Exception, match=ENV):  # stock ONNX Runtime refuses it too
        _stock(model, {})
    assert "\n" not in str(failure.value).strip()


def test_int8_activation_runs_are_bit_identical_across_threads(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    model, _, _ = _layer(8, 32, False, 64, 64, seed=11, experts=8)
    for value in [*model.graph.input, *model.graph.output]:  # any token count
        value.type.tensor_type.shape.dim[0].dim_param = "tokens"
    session = _provider_session(_converted(model), threads=2)
    rng = np.random.default_rng(0)
    feeds = [
        {
            "x": rng.standard_normal((int(n), 64)).astype(np.float32),
            "logits": rng.standard_normal((int(n), 8)).astype(np.float32),
        }
        for n in rng.integers(1, 20, 100)
    ]
    serial = [session.run(None, f)[0] for f in feeds]
    with ThreadPoolExecutor(8) as pool:
        threaded = list(pool.map(lambda f: session.run(None, f)[0], feeds))
    assert all(a.tobytes() == b.tobytes() for a, b in zip(serial, threaded, strict=True))


QUANTIZED_FIXTURES = sorted(
    name for name, e in manifest().items() if e["weight_dtype"] in ("int8", "int4") and e["cpu_outputs"]
)


@pytest.mark.parametrize("env", [None, "fp32"])
@pytest.mark.parametrize("name", QUANTIZED_FIXTURES)
def test_converted_quantized_fixtures_match_stock_onnxruntime(name, env, tmp_path, monkeypatch):
    from ndp_ep.cli import main

    if env:
        monkeypatch.setenv(ENV, env)
    else:
        monkeypatch.delenv(ENV, raising=False)
    source = GENAI_DIR / name / "model.onnx"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["convert", str(source), "-o", str(tmp_path / "model.onnx")]) == 0
    feeds = dict(np.load(GENAI_DIR / name / "inputs.npz"))
    stock = ort.InferenceSession(str(source), _options(), providers=["CPUExecutionProvider"])
    ours = ort.InferenceSession(str(tmp_path / "model.onnx"), ndp_ep.session_options(_options()))
    assert _relative(ours.run(["logits"], feeds)[0], stock.run(["logits"], feeds)[0]) <= TOLERANCE
