"""Benchmark `ndp-ep diff` on a 10,000-node model pair with external data (target: <= 5 s per diff).

Model A: LAYERS layers of (a 36-node dense chain with per-layer weights) + (a 14-node MoE block: router,
ten expert ops on stacked weights, residual Add) = 50 nodes per layer. Model B, derived from A:
  - every 5th layer has all its node names changed (forces structural matching),
  - every 40th layer's MoE block is rewritten ndp-ep style (ShardedMoEExperts + shard initializers),
  - three nodes get a changed attribute, one layer's big weight gets different values.
All weights live in one external data file per model; the big per-layer weight ([256, 256] fp32) makes the
streaming hash do real work. Prints the build time, the diff time (load + match + classify + text + JSON + HTML),
the bytes hashed and the ratio to the 5 s target.

    python benchmarks/bench_diff.py [--layers 200] [--keep DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graph_passes.sharded_op import DOMAIN, OP_TYPE  # noqa: E402
from ndp_ep.diff import diff_models, render_html, render_text, to_json_document  # noqa: E402

TARGET_S = 5.0
HIDDEN, FFN, EXPERTS, TOP_K, SHARDS, BIG = 8, 4, 4, 2, 2, 256
CHAIN_OPS = ("MatMul", "Add", "Relu", "Mul", "Transpose", "Transpose") * 6  # 36 nodes


def _layer(rng: np.random.Generator, layer: int, x: str, prefix: str, rewrite: bool) -> tuple[list, list, str]:
    p = f"{prefix}layers.{layer}"
    nodes, inits = [], []
    big = rng.standard_normal((BIG, BIG)).astype(np.float32)
    inits.append(numpy_helper.from_array(big, f"{p}.big.weight"))
    nodes.append(
        helper.make_node("ReduceSum", [f"{p}.big.weight"], [f"{p}.big_sum"], name=f"{p}/big/ReduceSum", keepdims=0)
    )
    tensor = x
    for k, op in enumerate(CHAIN_OPS[1:], start=1):
        out = f"{p}.chain{k}"
        name = f"{p}/chain/{op}_{k}"
        if op == "MatMul":
            w = f"{p}.chain{k}.weight"
            inits.append(numpy_helper.from_array(rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32), w))
            nodes.append(helper.make_node("MatMul", [tensor, w], [out], name=name))
        elif op == "Add":
            nodes.append(helper.make_node("Add", [tensor, x], [out], name=name))
        elif op == "Mul":
            nodes.append(helper.make_node("Mul", [tensor, f"{p}.big_sum"], [out], name=name))
        elif op == "Relu":
            nodes.append(helper.make_node("Relu", [tensor], [out], name=name))
        else:
            nodes.append(helper.make_node("Transpose", [tensor], [out], name=name, perm=[1, 0]))
        tensor = out
    h = tensor
    b = f"{p}.mlp"
    gate_w = rng.standard_normal((HIDDEN, EXPERTS)).astype(np.float32)
    gate_up = rng.standard_normal((EXPERTS, 2 * FFN, HIDDEN)).astype(np.float32)
    down = rng.standard_normal((EXPERTS, HIDDEN, FFN)).astype(np.float32)
    inits += [
        numpy_helper.from_array(gate_w, f"{b}.gate.weight"),
        numpy_helper.from_array(np.array([TOP_K], dtype=np.int64), f"{b}.top_k"),
    ]
    nodes += [
        helper.make_node("MatMul", [h, f"{b}.gate.weight"], [f"{b}.logits"], name=f"{p}/mlp/gate/MatMul"),
        helper.make_node("Softmax", [f"{b}.logits"], [f"{b}.probs"], name=f"{p}/mlp/router/Softmax", axis=-1),
        helper.make_node("TopK", [f"{b}.probs", f"{b}.top_k"], [f"{b}.rw", f"{b}.ids"], name=f"{p}/mlp/router/TopK"),
    ]
    moe_out = f"{b}.moe_out"
    if not rewrite:
        e = f"{p}/mlp/experts"
        inits += [
            numpy_helper.from_array(gate_up, f"{b}.experts.gate_up_proj"),
            numpy_helper.from_array(down, f"{b}.experts.down_proj"),
            numpy_helper.from_array(np.zeros((3, EXPERTS), dtype=np.float32), f"{b}.experts.zeros"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), f"{b}.experts.axis2"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), f"{b}.experts.axis1"),
        ]
        t = f"{b}.t"
        nodes += [
            helper.make_node(
                "Einsum", [h, f"{b}.experts.gate_up_proj"], [t + "gu"], name=f"{e}/Einsum_gu", equation="th,eih->tei"
            ),
            helper.make_node("Split", [t + "gu"], [t + "g", t + "u"], name=f"{e}/Split", axis=2, num_outputs=2),
            helper.make_node("Sigmoid", [t + "g"], [t + "gs"], name=f"{e}/Sigmoid"),
            helper.make_node("Mul", [t + "g", t + "gs"], [t + "ga"], name=f"{e}/Mul_silu"),
            helper.make_node("Mul", [t + "ga", t + "u"], [t + "act"], name=f"{e}/Mul_up"),
            helper.make_node(
                "Einsum",
                [t + "act", f"{b}.experts.down_proj"],
                [t + "eo"],
                name=f"{e}/Einsum_down",
                equation="tei,ehi->teh",
            ),
            helper.make_node(
                "ScatterElements",
                [f"{b}.experts.zeros", f"{b}.ids", f"{b}.rw"],
                [t + "dw"],
                name=f"{e}/Scatter",
                axis=1,
            ),
            helper.make_node("Unsqueeze", [t + "dw", f"{b}.experts.axis2"], [t + "dw3"], name=f"{e}/Unsqueeze"),
            helper.make_node("Mul", [t + "eo", t + "dw3"], [t + "wt"], name=f"{e}/Mul_weights"),
            helper.make_node(
                "ReduceSum", [t + "wt", f"{b}.experts.axis1"], [moe_out], name=f"{e}/ReduceSum", keepdims=0
            ),
        ]
    else:
        replaced = [
            f"{p}/mlp/experts/{n}"
            for n in (
                "Einsum_gu",
                "Split",
                "Sigmoid",
                "Mul_silu",
                "Mul_up",
                "Einsum_down",
                "Scatter",
                "Unsqueeze",
                "Mul_weights",
                "ReduceSum",
            )
        ]
        gu_names, down_names, step = [], [], FFN // SHARDS
        for ex in range(EXPERTS):
            for s in range(SHARDS):
                cols = slice(s * step, (s + 1) * step)
                shard = np.concatenate([gate_up[ex, :FFN].T[:, cols], gate_up[ex, FFN:].T[:, cols]], axis=1)
                gu_names.append(f"{b}.experts.{ex}.shard{s}.gate_up")
                down_names.append(f"{b}.experts.{ex}.shard{s}.down")
                inits.append(numpy_helper.from_array(np.ascontiguousarray(shard), gu_names[-1]))
                inits.append(numpy_helper.from_array(np.ascontiguousarray(down[ex].T[cols]), down_names[-1]))
        op = helper.make_node(
            OP_TYPE, [h, f"{b}.ids", f"{b}.rw", f"{b}.packed_gu", f"{b}.packed_down"], [moe_out],
            name=f"{p}/mlp/{OP_TYPE}", domain=DOMAIN, layer=b, num_experts=str(EXPERTS), top_k=str(TOP_K),
            shards=str(SHARDS), hidden=str(HIDDEN), ffn=str(FFN), activation="silu",
        )  # fmt: skip
        for key, value in (
            ("ndp_ep.replaced_nodes", json.dumps(replaced)),
            ("ndp_ep.placement", json.dumps({"device": "ndp"})),
        ):
            prop = op.metadata_props.add()
            prop.key, prop.value = key, value
        nodes += [
            helper.make_node("Concat", gu_names, [f"{b}.packed_gu"], name=f"{p}/mlp/pack_gate_up", axis=0),
            helper.make_node("Concat", down_names, [f"{b}.packed_down"], name=f"{p}/mlp/pack_down", axis=0),
            op,
        ]
    out = f"{p}.out"
    nodes.append(helper.make_node("Add", [h, moe_out], [out], name=f"{p}/residual/Add"))
    return nodes, inits, out


def build_model(layers: int, variant: str) -> onnx.ModelProto:
    nodes, inits, x = [], [], "x"
    for layer in range(layers):
        rng = np.random.default_rng(layer)
        renamed = variant == "b" and layer % 5 == 3
        rewrite = variant == "b" and layer % 40 == 7
        layer_nodes, layer_inits, x = _layer(rng, layer, x, "", rewrite)
        if renamed:
            for node in layer_nodes:
                node.name = "renamed/" + node.name
        nodes += layer_nodes
        inits += layer_inits
    if variant == "b":
        for node in nodes:
            if node.name in ("layers.10/chain/Transpose_4", "layers.100/chain/Transpose_10"):
                del node.attribute[:]
                node.attribute.append(helper.make_attribute("perm", [0, 1]))
            if node.name == "layers.50/mlp/router/Softmax":
                node.attribute[0].i = 0
        for tensor in inits:
            if tensor.name == "layers.60.big.weight":
                tensor.raw_data = (numpy_helper.to_array(tensor) * 2).astype(np.float32).tobytes()
    graph = helper.make_graph(
        nodes,
        "bench",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, HIDDEN])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [3, HIDDEN])],
        initializer=inits,
    )
    opsets = [helper.make_opsetid("", 18)] + ([helper.make_opsetid(DOMAIN, 1)] if variant == "b" else [])
    return helper.make_model(graph, opset_imports=opsets)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=200, help="50 nodes per layer (default 200 → 10,000 nodes)")
    parser.add_argument("--repeat", type=int, default=3, help="timed diff runs (the median is reported)")
    parser.add_argument("--keep", type=Path, help="write the models here instead of a temporary directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_diff_") as temp:
        directory = args.keep or Path(temp)
        directory.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        paths = []
        for variant in ("a", "b"):
            path = directory / f"bench_{variant}.onnx"
            onnx.save_model(
                build_model(args.layers, variant),
                str(path),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=f"bench_{variant}.weights.bin",
                size_threshold=0,
            )
            paths.append(path)
        build_s = time.perf_counter() - started
        times, result = [], None
        for _ in range(max(1, args.repeat)):
            started = time.perf_counter()
            result = diff_models(*paths)
            render_text(result)
            render_html(result, to_json_document(result))
            times.append(time.perf_counter() - started)
        assert result is not None
        diff_s = statistics.median(times)
        weights_bytes = sum((directory / f"bench_{v}.weights.bin").stat().st_size for v in ("a", "b"))
        print(f"nodes: A {result.a.node_count}, B {result.b.node_count}; build {build_s:.2f} s")
        print(f"node counts: {dict(result.node_counts)}")
        print(f"initializer counts: { {k: v for k, v in result.initializer_counts.items() if v} }")
        print(f"MoE blocks: {len(result.moe_blocks)}, regions: {len(result.regions)}, equivalent: {result.equivalent}")
        print(f"hashed {result.hashed_bytes / 2**20:.1f} MiB of {weights_bytes / 2**20:.1f} MiB external data")
        print(f"diff time (median of {len(times)}): {diff_s:.2f} s; runs {', '.join(f'{t:.2f}' for t in times)}")
        verdict = "PASS" if diff_s <= TARGET_S else "FAIL"
        print(f"ratio to the {TARGET_S:.0f} s target: {diff_s / TARGET_S:.2f} ({verdict})")
        renamed_layers = sum(1 for layer in range(args.layers) if layer % 5 == 3)
        rewritten = sum(1 for layer in range(args.layers) if layer % 40 == 7)
        expected = {"renamed": 50 * renamed_layers, "removed": 10 * rewritten, "added": 3 * rewritten}
        found = {key: result.node_counts[key] for key in expected}
        ok = found == expected and len(result.moe_blocks) == rewritten
        print(f"classification check: {'OK' if ok else 'MISMATCH'} (expected {expected}, found {found})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
