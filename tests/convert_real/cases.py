"""The real-exporter fixtures, what a correct conversion of each must report, and negative-case builders.

Fixtures are committed under ``sample_models/hf`` (``sample_models/export_hf.py``: PyTorch exports of
Hugging Face MoE models) and ``sample_models/fused`` (``sample_models/build_fused_moe.py``: the
``com.microsoft.MoE`` contrib op). Each ``X.onnx`` has ``X.inputs.npz`` and ``X.outputs.npz`` (the outputs
PyTorch, or ONNX Runtime's CPU provider for the fused op, computed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

REPO_ROOT = Path(__file__).resolve().parents[2]
HF_DIR = REPO_ROOT / "sample_models" / "hf"
FUSED_DIR = REPO_ROOT / "sample_models" / "fused"
EAGER_REASON = "eager export unrolled only the experts hit while tracing"

# family -> (num_experts, top_k, hidden, ffn) of the configs in sample_models/export_hf.py
HF_SHAPES = {"mixtral": (4, 2, 32, 48), "qwen2_moe": (6, 2, 32, 40), "gpt_oss": (4, 2, 32, 32)}
HF_LAYERS = {"block": 1, "model": 2}
SWITCH_SPARSE_LAYERS = {"block": 1, "model": 4}
# generalisation fixtures (sample_models/hf/extra: single blocks of more families, other routers and layouts)
EXTRA_DIR = HF_DIR / "extra"
EXTRA_SHAPES = {
    "qwen3_moe": (6, 2, 32, 40),
    "olmoe": (6, 2, 32, 48),
    "deepseek_v3": (6, 2, 32, 40),  # grouped top-k router with score bias, plus a dense shared expert
    "phimoe": (6, 2, 32, 48),  # sparse-mixer router: expert ids from ArgMax pairs, not TopK
    "granitemoe": (6, 2, 32, 48),
    # non-gated experts (transformers' batched_mm with has_gate=False); GELU exported decomposed (erf / tanh)
    "plain_relu": (6, 2, 32, 48),
    "plain_gelu": (6, 2, 32, 48),
    "plain_gelu_tanh": (6, 2, 32, 48),
}


@dataclass(frozen=True)
class Expected:
    """What ``ndp-ep convert --json`` must report for one fixture."""

    stem: str
    path: Path
    blocks: tuple[tuple[int, int, int, int], ...]  # (num_experts, top_k, hidden, ffn) per converted block
    skipped: int = 0  # how many skips at least
    skip_reason: str = ""  # a substring every skip reason must contain (when skipped > 0)

    @property
    def inputs(self) -> Path:
        return self.path.with_name(self.stem + ".inputs.npz")

    @property
    def outputs(self) -> Path:
        return self.path.with_name(self.stem + ".outputs.npz")


def hf_cases() -> list[Expected]:
    cases = []
    for path in sorted(HF_DIR.glob("*.onnx")):
        stem = path.stem
        family = next((f for f in (*HF_SHAPES, "switch") if stem.startswith(f + "_")), None)
        kind = stem[len(family) + 1 :].split("_")[0] if family else ""
        if family is None or kind not in HF_LAYERS:
            raise AssertionError(f"fixture {path.name} is not described in tests/convert_real/cases.py")
        if "_eager_" in stem:
            layers = SWITCH_SPARSE_LAYERS[kind] if family == "switch" else 1
            cases.append(Expected(stem, path, (), skipped=layers, skip_reason=EAGER_REASON))
        else:
            cases.append(Expected(stem, path, (HF_SHAPES[family],) * HF_LAYERS[kind]))
    return cases


def extra_cases() -> list[Expected]:
    cases = []
    for path in sorted(EXTRA_DIR.glob("*.onnx")):
        family = next((f for f in EXTRA_SHAPES if path.stem.startswith(f + "_block_")), None)
        if family is None:
            raise AssertionError(f"fixture {path.name} is not described in tests/convert_real/cases.py")
        cases.append(Expected(path.stem, path, (EXTRA_SHAPES[family],)))
    return cases


def fused_cases() -> list[Expected]:
    manifest = json.loads((FUSED_DIR / "MANIFEST.json").read_text())
    cases = []
    for stem, case in sorted(manifest.items()):
        shape = (case["num_experts"], case["top_k"], case["hidden"], case["ffn"])
        if case["expect_converted"]:
            cases.append(Expected(stem, FUSED_DIR / f"{stem}.onnx", (shape,) * case["layers"]))
        else:
            cases.append(Expected(stem, FUSED_DIR / f"{stem}.onnx", (), skipped=1, skip_reason=case["expect_reason"]))
    return cases


# ---------------------------------------------------------------- negative cases built from good fixtures


def _selections(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Gather/GatherND nodes reading a stacked rank-3 initializer (expert weights selected by expert id)."""
    ranks = {t.name: len(t.dims) for t in model.graph.initializer}
    return [n for n in model.graph.node if n.op_type in ("Gather", "GatherND") and ranks.get(n.input[0]) == 3]


def scale_gathered_weight(model: onnx.ModelProto, factor: float = 1.5) -> onnx.ModelProto:
    """Insert ``Mul(selected expert weight, factor)`` before the first expert MatMul of every block.

    The model stays valid and computes something else than a plain MoE, so a converter must skip the block.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    firsts = {}
    for node in _selections(out):
        firsts.setdefault(node.input[1], node)  # graph order: the first selection of a block is gate_up
    for position, selection in enumerate(firsts.values()):
        scale_name = f"negative/scale{position}"
        scaled = f"{selection.output[0]}/scaled"
        graph.initializer.append(numpy_helper.from_array(np.array(factor, dtype=np.float32), scale_name))
        for node in graph.node:
            for i, value in enumerate(node.input):
                if value == selection.output[0]:
                    node.input[i] = scaled
        mul = onnx.helper.make_node("Mul", [selection.output[0], scale_name], [scaled], name=f"negative/Mul{position}")
        index = list(graph.node).index(selection)
        graph.node.insert(index + 1, mul)
    onnx.checker.check_model(out)
    return out


def unweighted_combine(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop the routing-weight multiply before the sum over the top-k slots: ``y = sum_k expert_k(x)``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    producer = {o: n for n in graph.node for o in n.output}
    removed = []
    for reduce in [n for n in graph.node if n.op_type == "ReduceSum"]:
        reshape = producer.get(reduce.input[0])
        mul = producer.get(reshape.input[0]) if reshape is not None and reshape.op_type == "Reshape" else None
        if mul is None or mul.op_type != "Mul":
            continue
        expert_side = [v for v in mul.input if v in producer and producer[v].op_type in ("Squeeze", "Add")]
        weight_side = [v for v in mul.input if v in producer and producer[v].op_type == "Unsqueeze"]
        if len(expert_side) != 1 or len(weight_side) != 1:
            continue
        reshape.input[0] = expert_side[0]
        removed.append(mul)
    if not removed:
        raise AssertionError("no routing-weighted combine found to break")
    for node in removed:
        graph.node.remove(node)
    onnx.checker.check_model(out)
    return out
