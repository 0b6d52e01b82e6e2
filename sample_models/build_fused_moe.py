"""Build models with ONNX Runtime's fused ``com.microsoft.MoE`` contrib op, as GenAI model builders emit it.

    python sample_models/build_fused_moe.py     # writes sample_models/fused/*.onnx, *.inputs.npz, *.outputs.npz

Each model routes with an ordinary Gemm and hands the router *logits* to the fused op, which does softmax,
top-k and the optional renormalisation inside::

    x[T,H] ─┬─ Gemm(router W[E,H]) ─ logits[T,E] ─┐
            └────────────────────────────────────── com.microsoft.MoE(k, activation_type, ...) ─ y[T,H]
                 fc1 [E, F*I, H] (F = 2 for fused swiglu), fc1_bias [E, F*I], fc2 [E, H, I], fc2_bias [E, H]

Weights are in ONNX Runtime's ``[E, out, in]`` layout. The reference outputs are computed by ONNX Runtime's
CPU provider (which runs this op); the script also checks them against a NumPy model of the op's documented
semantics, so a change in ONNX Runtime's behaviour is caught here rather than as a converter bug:

    probs = softmax(logits); ids, p = topk(probs, k); p /= sum(p) if normalize_routing_weights
    relu | silu:  h = act(x @ W1[e].T + b1[e])          gelu: tanh approximation (the CPU kernel's)
    swiglu (swiglu_fusion=1, interleaved rows: even = gate, odd = linear):
        g = min(h[::2], limit); l = clip(h[1::2], -limit, limit); h = g * sigmoid(alpha * g) * (l + beta)
    y = sum_k p_k * (h @ W2[e].T + b2[e])

``*_skip_*`` files are negative cases the converter must leave untouched (listed in ``MANIFEST``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FUSED_DIR = Path(__file__).resolve().parent / "fused"
OPSET = 18
MS_OPSET = 1
ATOL = 1e-5


@dataclass(frozen=True)
class FusedCase:
    """One fused-MoE fixture: a chain of ``layers`` MoE blocks (with residual adds when layers > 1)."""

    name: str
    activation: str  # relu | gelu | silu | swiglu
    top_k: int
    normalize: bool
    biases: bool
    num_experts: int = 4
    hidden: int = 16
    ffn: int = 24
    tokens: int = 5
    batch: int = 0  # 0: 2-D input [T, H]; otherwise 3-D input [batch, tokens, H]
    layers: int = 1
    activation_alpha: float = 1.702
    activation_beta: float = 1.0
    swiglu_limit: float = 7.0
    expect_converted: bool = True
    expect_reason: str = ""  # for negative cases: a substring of the skip reason
    seed: int = 0


CASES = (
    FusedCase("relu_k1", "relu", top_k=1, normalize=False, biases=False),
    FusedCase("relu_k2_norm_bias", "relu", top_k=2, normalize=True, biases=True, seed=1),
    FusedCase("gelu_k2_bias", "gelu", top_k=2, normalize=False, biases=True, seed=2),
    FusedCase("silu_k2_norm", "silu", top_k=2, normalize=True, biases=False, seed=3),
    FusedCase("swiglu_k2_norm_bias", "swiglu", top_k=2, normalize=True, biases=True, swiglu_limit=1.5, seed=4),
    FusedCase(
        "swiglu_k4_bias_3d",
        "swiglu",
        top_k=4,
        normalize=False,
        biases=True,
        num_experts=8,
        batch=2,
        tokens=3,
        seed=5,
    ),
    FusedCase(
        "swiglu_plain_k2",  # alpha 1, beta 0, no limit: plain SiLU-GLU on interleaved rows
        "swiglu",
        top_k=2,
        normalize=True,
        biases=False,
        activation_alpha=1.0,
        activation_beta=0.0,
        swiglu_limit=float("inf"),
        seed=6,
    ),
    FusedCase("gelu_k1_norm_3layers", "gelu", top_k=1, normalize=True, biases=True, layers=3, seed=7),
    FusedCase(
        "skip_swiglu_beta",  # (l + 0.5): once skipped, now expressed by the op's activation_beta attribute
        "swiglu",
        top_k=2,
        normalize=True,
        biases=True,
        activation_beta=0.5,
        seed=8,
    ),
)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(0.7978845608 * (x + 0.044715 * x**3)))


def reference_moe(case: FusedCase, x: np.ndarray, logits: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    """NumPy model of com.microsoft.MoE (float64), for checking what ONNX Runtime computes."""
    x = x.astype(np.float64).reshape(-1, case.hidden)
    probs = softmax(logits.astype(np.float64))
    ids = np.argsort(-probs, axis=-1, kind="stable")[:, : case.top_k]
    p = np.take_along_axis(probs, ids, axis=-1)
    if case.normalize:
        p = p / p.sum(axis=-1, keepdims=True)
    y = np.zeros_like(x)
    for t in range(x.shape[0]):
        for slot in range(case.top_k):
            e = ids[t, slot]
            h = x[t] @ w["fc1"][e].T.astype(np.float64) + (w["fc1_bias"][e] if "fc1_bias" in w else 0.0)
            if case.activation == "relu":
                h = np.maximum(h, 0.0)
            elif case.activation == "gelu":
                h = gelu_tanh(h)
            elif case.activation == "silu":
                h = h / (1.0 + np.exp(-h))
            else:
                gate = np.minimum(h[0::2], case.swiglu_limit)
                linear = np.clip(h[1::2], -case.swiglu_limit, case.swiglu_limit)
                h = gate / (1.0 + np.exp(-case.activation_alpha * gate)) * (linear + case.activation_beta)
            out = h @ w["fc2"][e].T.astype(np.float64) + (w["fc2_bias"][e] if "fc2_bias" in w else 0.0)
            y[t] += p[t, slot] * out
    return y


def build_case(case: FusedCase) -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(100 + case.seed)
    h, i, e = case.hidden, case.ffn, case.num_experts
    fusion = 2 if case.activation == "swiglu" else 1
    input_shape = [case.tokens, h] if case.batch == 0 else [case.batch, case.tokens, h]
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    weights_per_layer: list[dict[str, np.ndarray]] = []

    def init(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    current = "x"
    for layer in range(case.layers):
        p = f"layers.{layer}.moe"
        w = {
            "router": rng.standard_normal((e, h)) * 1.5 / np.sqrt(h),
            "fc1": rng.standard_normal((e, fusion * i, h)) * 2.0 / np.sqrt(h),
            "fc2": rng.standard_normal((e, h, i)) * 1.0 / np.sqrt(i),
        }
        if case.biases:
            w["fc1_bias"] = rng.standard_normal((e, fusion * i)) * 0.3
            w["fc2_bias"] = rng.standard_normal((e, h)) * 0.3
        w = {k: v.astype(np.float32) for k, v in w.items()}
        weights_per_layer.append(w)
        router_in = current
        if case.batch:
            router_in = f"{p}/flat"
            inits.append(numpy_helper.from_array(np.array([-1, h], dtype=np.int64), f"{p}/flat_shape"))
            nodes.append(helper.make_node("Reshape", [current, f"{p}/flat_shape"], [router_in]))
        logits = f"{p}/router_logits"
        nodes.append(helper.make_node("Gemm", [router_in, init(f"{p}.router.weight", w["router"])], [logits], transB=1))
        moe_inputs = [
            current,
            logits,
            init(f"{p}.fc1", w["fc1"]),
            init(f"{p}.fc1_bias", w["fc1_bias"]) if case.biases else "",
            init(f"{p}.fc2", w["fc2"]),
            init(f"{p}.fc2_bias", w["fc2_bias"]) if case.biases else "",
        ]
        attrs: dict = {
            "k": case.top_k,
            "activation_type": case.activation,
            "normalize_routing_weights": int(case.normalize),
        }
        if case.activation == "swiglu":
            attrs.update(swiglu_fusion=1, activation_alpha=case.activation_alpha, activation_beta=case.activation_beta)
            if np.isfinite(case.swiglu_limit):
                attrs["swiglu_limit"] = case.swiglu_limit
        moe_out = f"{p}/out"
        nodes.append(helper.make_node("MoE", moe_inputs, [moe_out], name=f"{p}/MoE", domain="com.microsoft", **attrs))
        if case.layers > 1:
            nodes.append(helper.make_node("Add", [current, moe_out], [f"{p}/residual"]))
            current = f"{p}/residual"
        else:
            current = moe_out
    nodes.append(helper.make_node("Identity", [current], ["y"]))
    graph = helper.make_graph(
        nodes,
        f"fused_moe_{case.name}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, input_shape)],
        inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", MS_OPSET)],
        producer_name="ndp-ep sample_models/build_fused_moe.py",
    )
    model.ir_version = 9
    onnx.checker.check_model(model)
    x = np.random.default_rng(200 + case.seed).standard_normal(input_shape).astype(np.float32)
    return model, {"x": x}, weights_per_layer


def numpy_model(case: FusedCase, x: np.ndarray, weights_per_layer: list[dict[str, np.ndarray]]) -> np.ndarray:
    current = x.astype(np.float64).reshape(-1, case.hidden)
    for w in weights_per_layer:
        logits = current @ w["router"].T.astype(np.float64)
        moe = reference_moe(case, current, logits, w)
        current = current + moe if case.layers > 1 else moe
    return current.reshape(x.shape)


def main() -> int:
    import onnxruntime as ort

    FUSED_DIR.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for case in CASES:
        model, feeds, weights = build_case(case)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        (y,) = session.run(None, feeds)
        expected = numpy_model(case, feeds["x"], weights)
        error = float(np.abs(y - expected).max())
        if error > ATOL * max(1.0, float(np.abs(expected).max())):
            raise SystemExit(f"{case.name}: ONNX Runtime differs from the NumPy model of MoE by {error:.3g}")
        stem = f"fused_moe_{case.name}"
        onnx.save(model, FUSED_DIR / f"{stem}.onnx")
        np.savez(FUSED_DIR / f"{stem}.inputs.npz", **feeds)
        np.savez(FUSED_DIR / f"{stem}.outputs.npz", y=y)
        entry = asdict(case)
        entry["swiglu_limit"] = case.swiglu_limit if np.isfinite(case.swiglu_limit) else None
        manifest[stem] = entry
        print(f"{stem}: ok (ORT vs NumPy {error:.2e}, max |y| {float(np.abs(y).max()):.2f})")
    (FUSED_DIR / "MANIFEST.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
