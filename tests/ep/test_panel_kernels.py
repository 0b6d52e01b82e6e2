"""The provider's matrix kernels (native/src/panel_gemm.h), each instruction set picked with NDP_EP_KERNEL_ISA:
every one matches stock ONNX Runtime's fused MoE, and a float64 reference for weights kept in every stored
precision (float32, float16, bfloat16, int8 and int4 blocks with zero points), at shapes that cross every
blocking edge of the kernels; the two FMA kernels agree bit for bit, and a name the CPU cannot run is refused
naming the variable."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import ndp_ep
from sample_models.build_fused_moe import FusedCase, build_case
from tests.core.test_kernels import build_case as build_sharded_case
from tests.core.test_kernels import reference_output, run_case

ISA_ENV = "NDP_EP_KERNEL_ISA"
FP32_RTOL = 1e-5
# hidden 300: the gate/up product's depth crosses the kernels' 256-deep k slices and the down product ends in a
# 12-column part panel; 2 shards of FFN 1200: down depth 600 (three slices); 56 tokens top-2 over 4 experts give
# ~28 rows per expert (several row blocks and a short last one), 1 and 5 tokens a single short block.
TOKENS = (1, 5, 56)


def _case(tokens: int) -> FusedCase:
    return FusedCase(
        "kernel_edges", "swiglu", top_k=2, normalize=True, biases=True, num_experts=4, hidden=300, ffn=1200,
        tokens=tokens, seed=7,
    )  # fmt: skip


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict[int, tuple[str, str, dict[str, np.ndarray]]]:
    folder = tmp_path_factory.mktemp("kernels")
    cases = {}
    for tokens in TOKENS:
        model, feeds, _ = build_case(_case(tokens))
        original, target = folder / f"t{tokens}.onnx", folder / f"t{tokens}.ndp.onnx"
        original.write_bytes(model.SerializeToString())
        assert ndp_ep.convert_model(original, target, shards=2).report.blocks
        cases[tokens] = (str(original), str(target), feeds)
    return cases


def _skip_unless_supported(isa: str, make):
    try:
        return make()
    except Exception as exc:
        if "this CPU cannot run it" in str(exc):
            pytest.skip(f"this CPU has no {isa}")
        raise


def _run_on(isa: str, model: str, feeds, monkeypatch) -> np.ndarray:
    monkeypatch.setenv(ISA_ENV, isa)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = _skip_unless_supported(isa, lambda: ort.InferenceSession(model, ndp_ep.session_options(options)))
    return session.run(None, feeds)[0]


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("isa", ["avx512f", "avx2", "portable"])
def test_each_kernel_matches_stock_onnx_runtime_across_its_blocking_edges(
    isa, tokens, converted, monkeypatch, relative_error
):
    original, target, feeds = converted[tokens]
    stock = ort.InferenceSession(original, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert relative_error(_run_on(isa, target, feeds, monkeypatch), stock) <= FP32_RTOL


@pytest.mark.parametrize("tokens", TOKENS)
def test_the_avx512_and_avx2_kernels_give_bit_identical_outputs(tokens, converted, monkeypatch):
    _, target, feeds = converted[tokens]
    wide = _run_on("avx512f", target, feeds, monkeypatch)
    assert np.array_equal(wide, _run_on("avx2", target, feeds, monkeypatch))


def test_an_unknown_kernel_name_fails_the_session_naming_the_variable(converted, monkeypatch):
    _, target, _ = converted[TOKENS[0]]
    monkeypatch.setenv(ISA_ENV, "sse9")
    with pytest.raises(Exception, match=f"{ISA_ENV} must be avx512f, avx2 or portable, got 'sse9'"):
        ort.InferenceSession(target, ndp_ep.session_options())


# hidden 304 in blocks of 16 (19 blocks, the 256-deep k slices end mid-model) and an FFN of 608 on 2 shards: the
# same edges as above for weights kept in their stored precision
PRECISIONS = ["float32", "float16", "bfloat16", "int8", "int4"]
# the reference multiplies float inputs: keep ONNX Runtime >= 1.31's int8 activations (block 16, 8 bits) out
QMOE_FLOAT = ("ORT_QMOE_CPU_QNBIT_GEMM", "fp32")


@pytest.fixture(scope="module")
def sharded_cases():
    return {
        dtype: build_sharded_case(
            "swiglu_clamp", weight_dtype=dtype, hidden=304, ffn=608, block=16, zero_points=True, first_bias=True,
            down_bias=True,
        )
        for dtype in PRECISIONS
    }  # fmt: skip


@pytest.mark.parametrize("tokens", [1, 56])
@pytest.mark.parametrize("weight_dtype", PRECISIONS)
@pytest.mark.parametrize("isa", ["avx512f", "avx2", "portable"])
def test_each_kernel_computes_weights_in_their_stored_precision_as_the_float64_reference(
    isa, weight_dtype, tokens, sharded_cases, monkeypatch, relative_error
):
    model, reference, spec = sharded_cases[weight_dtype]
    monkeypatch.setenv(ISA_ENV, isa)
    monkeypatch.setenv(*QMOE_FLOAT)
    out, (x, ids, w) = _skip_unless_supported(isa, lambda: run_case(model, spec, tokens=tokens))
    assert relative_error(out, reference_output(reference, spec, x, ids, w)) < FP32_RTOL


@pytest.mark.parametrize("weight_dtype", PRECISIONS)
def test_the_avx512_and_avx2_kernels_agree_bit_for_bit_in_every_precision(weight_dtype, sharded_cases, monkeypatch):
    model, _, spec = sharded_cases[weight_dtype]
    monkeypatch.setenv(*QMOE_FLOAT)
    outputs = []
    for isa in ("avx512f", "avx2"):
        monkeypatch.setenv(ISA_ENV, isa)
        outputs.append(_skip_unless_supported(isa, lambda: run_case(model, spec, tokens=29))[0])
    assert np.array_equal(*outputs)


@pytest.mark.parametrize(("weight_dtype", "setting"), [("int8", None), ("int4", "int8")])
@pytest.mark.parametrize("tokens", [1, 29])  # a decode-sized call split into column ranges, and one task per expert
def test_int8_activation_products_give_the_same_bits_with_every_kernel(
    weight_dtype, setting, tokens, sharded_cases, monkeypatch
):
    # ONNX Runtime >= 1.31 multiplies 8-bit experts (4-bit ones with ORT_QMOE_CPU_QNBIT_GEMM=int8) with int8
    # activations: integer dot products (VNNI, AVX2 16-bit pairs, a portable loop) and one float epilogue
    if not np.lib.NumpyVersion(ort.__version__) >= "1.31.0":
        pytest.skip(f"onnxruntime {ort.__version__} has no int8-activation QMoE")
    model, _, spec = sharded_cases[weight_dtype]
    if setting is None:
        monkeypatch.delenv(QMOE_FLOAT[0], raising=False)
    else:
        monkeypatch.setenv(QMOE_FLOAT[0], setting)
    outputs = {}
    for isa in ("avx512f", "avx2", "portable"):
        monkeypatch.setenv(ISA_ENV, isa)
        try:
            outputs[isa] = run_case(model, spec, tokens=tokens)[0]
        except Exception as exc:  # noqa: BLE001 -- a kernel this CPU cannot run fails the session naming it
            if "this CPU cannot run it" not in str(exc):
                raise
    monkeypatch.setenv(*QMOE_FLOAT)  # the float path: int8 activations move the outputs, but not far
    floats = run_case(model, spec, tokens=tokens)[0]
    first, *others = outputs.values()
    assert "portable" in outputs and all(np.array_equal(first, other) for other in others)
    assert not np.array_equal(first, floats) and np.max(np.abs(first - floats)) < 0.05 * np.max(np.abs(floats))


@pytest.mark.parametrize("isa", ["avx512f", "avx2", "portable"])
def test_quantization_blocks_longer_than_a_k_slice_keep_their_scales(isa, monkeypatch, relative_error):
    # blocks of 384 inputs: the kernels' 256-deep k slices end inside a block and a block ends inside a slice
    model, reference, spec = build_sharded_case("silu_glu", weight_dtype="int4", hidden=768, ffn=768, block=384)
    monkeypatch.setenv(ISA_ENV, isa)
    monkeypatch.setenv(*QMOE_FLOAT)
    out, (x, ids, w) = _skip_unless_supported(isa, lambda: run_case(model, spec, tokens=13))
    assert relative_error(out, reference_output(reference, spec, x, ids, w)) < FP32_RTOL


def test_the_standalone_kernel_check_passes_with_every_kernel_this_cpu_runs(tmp_path):
    # native/checks/panel_gemm_check.cc is what benchmarks/check_cross_build.py runs on other architectures: built
    # here with this machine's compiler (as pip install . builds the library), so it cannot rot unnoticed
    import shutil
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    compiler = shutil.which("c++") or shutil.which("g++")
    assert compiler is not None, "pip install . needs a C++ compiler, so the suite has one"
    binary = tmp_path / "panel_gemm_check"
    sources = [root / "native" / "checks" / "panel_gemm_check.cc"]
    sources += [root / "native" / "src" / name for name in ("panel_gemm.cc", "float_convert.cc")]
    built = subprocess.run(
        [compiler, "-std=c++17", "-O2", f"-I{root / 'native' / 'src'}", *map(str, sources), "-o", str(binary)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    checked = subprocess.run([str(binary)], capture_output=True, text=True, check=False, timeout=120)
    assert checked.returncode == 0, checked.stdout[-3000:]
    assert checked.stdout.strip().endswith(": ok") and "portable" in checked.stdout


# Block-quantized weights without zero points (one zero point for every block: the 4-bit table lookup) and with
# them, in blocks of 48: hidden 304 ends in a 16-input partial block; 2 shards of FFN 192 (two blocks each). One and
# two tokens route one or two rows to an expert (the streaming AVX-512 kernel), 64 tokens ~32 (the widened-panel
# kernel, two 12-row blocks and a short one).
QUANT_CASES = [(dtype, zero_points) for dtype in ("int4", "int8") for zero_points in (False, True)]
QUANT_TOKENS = (1, 2, 64)


@pytest.fixture(scope="module")
def quantized_cases():
    return {
        (dtype, zero_points): build_sharded_case(
            "silu_glu", weight_dtype=dtype, hidden=304, ffn=192, block=48, zero_points=zero_points, experts=4,
            seed=11,
        )
        for dtype, zero_points in QUANT_CASES
    }  # fmt: skip


def _feeds(spec, tokens: int, seed: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, spec.hidden)).astype(np.float32)
    ids = np.stack([rng.choice(spec.num_experts, spec.top_k, replace=False) for _ in range(tokens)]).astype(np.int64)
    return x, ids, rng.random((tokens, spec.top_k)).astype(np.float32)


def _run_feeds(isa: str, model, feeds, monkeypatch) -> np.ndarray:
    monkeypatch.setenv(ISA_ENV, isa)
    monkeypatch.setenv(*QMOE_FLOAT)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    make = lambda: ort.InferenceSession(model.SerializeToString(), ndp_ep.session_options(options))  # noqa: E731
    x, ids, w = feeds
    return _skip_unless_supported(isa, make).run(None, {"x": x, "ids": ids, "w": w})[0]


@pytest.mark.parametrize("tokens", QUANT_TOKENS)
@pytest.mark.parametrize(("weight_dtype", "zero_points"), QUANT_CASES)
@pytest.mark.parametrize("isa", ["avx512f", "avx2", "portable"])
def test_quantized_products_match_the_float64_reference_with_a_partial_last_block(
    isa, weight_dtype, zero_points, tokens, quantized_cases, monkeypatch, relative_error
):
    model, reference, spec = quantized_cases[weight_dtype, zero_points]
    feeds = _feeds(spec, tokens)
    out = _run_feeds(isa, model, feeds, monkeypatch)
    x, ids, w = feeds
    expected = reference_output(reference, spec, x.astype(np.float64), ids, w.astype(np.float64))
    assert relative_error(out, expected) < FP32_RTOL


@pytest.mark.parametrize(("weight_dtype", "zero_points"), QUANT_CASES)
def test_quantized_products_give_the_same_bits_for_any_kernel_and_any_rows_per_expert(
    weight_dtype, zero_points, quantized_cases, monkeypatch
):
    # every quantized kernel sums the same terms in the same order: a token computed alone (one row per expert,
    # AVX-512's streaming kernel) gives the bits it gets among 64 (widened panels, 12-row blocks), and AVX2's
    # kernels give AVX-512's
    model, _, spec = quantized_cases[weight_dtype, zero_points]
    x, ids, w = _feeds(spec, 64)
    batch = {isa: _run_feeds(isa, model, (x, ids, w), monkeypatch) for isa in ("avx512f", "avx2")}
    assert np.array_equal(batch["avx512f"], batch["avx2"])
    for t in (0, 1, 63):
        alone = _run_feeds("avx512f", model, (x[t : t + 1], ids[t : t + 1], w[t : t + 1]), monkeypatch)
        assert np.array_equal(alone[0], batch["avx512f"][t])
    pair = _run_feeds("avx512f", model, (x[2:4], ids[2:4], w[2:4]), monkeypatch)
    assert np.array_equal(pair, batch["avx512f"][2:4])
