"""Convert a synthetic MoE model far larger than memory and compare against a plain copy of its weights.

    python benchmarks/bench_large_model.py                  # ~4.5 GB of float32 expert weights, temp dir
    python benchmarks/bench_large_model.py --dir /data/tmp --keep --experts 8   # smaller, kept on disk
    python benchmarks/bench_large_model.py --dtype float16 --experts 90         # ~4.5 GB of float16 weights

The model is a chain of MoE blocks in the dynamo form of ``sample_models.build_samples`` (router
Gemm → Softmax → TopK, GatherND of stacked ``[E, 2I, H]`` gate_up and ``[E, H, I]`` down weights):

    hidden_states[T,H] ─► MoE block 0 ─► MoE block 1 ─► ... ─► output[T,H]

Its expert weights are written chunk by chunk (one expert at a time) to one external-data file, so
building it never holds more than one expert in memory. In the same run the script then

1. copies the weight file (``shutil.copyfile``) and fsyncs the copy, once before and once after the
   conversion: the faster of the two is the *copy time*;
2. converts the model in a child process (``python -m ndp_ep convert IN -o OUT --external-data --json``)
   and fsyncs the files it wrote: the *convert time*; the child's peak RSS comes from ``os.wait4``;
3. checks the output: one sharded op per block with the source's ``out_in`` layout (so nothing was
   transposed), every shard initializer external, and a few shard tensors (read by memmap) equal to the
   matching slices of the source weights (gate rows then up rows; a column block of down).

Both timings include the fsync so that each ends with its bytes on the disk (the page-cache-only
figures are printed too). The copy goes through the page cache; the converter writes its data file past it
(``O_DIRECT``, see graph_passes/data_writers.py) where the file system allows, so its page-cache-only time already
has its bytes on the disk. Targets: convert ≤ 1.5× copy, peak RSS ≤ 1 GiB + the largest single tensor.
The CPU seconds (user + system) each side used are printed as well: on a machine shared with other
jobs the wall times follow the CPU left over, while the CPU times show what each side costs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from graph_passes.sharded_op import DOMAIN, OP_TYPE  # noqa: E402
from sample_models.build_samples import OPSET, GraphBuilder, MoEBlockSpec, add_moe_block  # noqa: E402

GIB = 2**30
RSS_ALLOWANCE_BYTES = GIB
DTYPES = {"float32": (np.float32, TensorProto.FLOAT), "float16": (np.float16, TensorProto.FLOAT16)}
COPY_RATIO_TARGET = 1.5  # convert vs a plain copy of the same files (issue: GenAI/quantized conversion)


@dataclass(frozen=True)
class LargeModelSpec:
    layers: int
    num_experts: int
    top_k: int
    hidden: int
    ffn: int
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("layers", "num_experts", "top_k", "hidden", "ffn"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.top_k > self.num_experts:
            raise ValueError("top_k must not exceed num_experts")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}")

    @property
    def itemsize(self) -> int:
        return np.dtype(DTYPES[self.dtype][0]).itemsize

    @property
    def expert_weight_bytes(self) -> int:
        per_expert = 3 * self.hidden * self.ffn * self.itemsize  # gate_up [2I, H] + down [H, I]
        return self.layers * self.num_experts * per_expert

    @property
    def largest_tensor_bytes(self) -> int:
        return self.num_experts * 2 * self.ffn * self.hidden * self.itemsize


class StreamingBuilder(GraphBuilder):
    """A GraphBuilder whose stacked expert weights go straight to an external-data file, one expert at a time."""

    def __init__(self, seed: int, data_file, data_name: str, dtype: str = "float32") -> None:
        super().__init__(seed)
        self.data_file = data_file
        self.data_name = data_name
        self.np_dtype, self.onnx_dtype = DTYPES[dtype]

    def weight(self, name: str, shape: tuple[int, ...], scale: float | None = None) -> str:
        if ".experts." not in name:
            name = super().weight(name, shape, scale)
            if self.np_dtype != np.float32:  # every float weight of the model in the same precision
                array = onnx.numpy_helper.to_array(self.initializers[-1]).astype(self.np_dtype)
                self.initializers[-1].CopyFrom(onnx.numpy_helper.from_array(array, name))
            return name
        std = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
        offset = self.data_file.tell()
        per_expert = int(np.prod(shape[1:]))
        for _ in range(shape[0]):
            # uniform with the same standard deviation as the in-memory builder's normal weights
            chunk = self.rng.random(per_expert, dtype=np.float32)
            chunk -= np.float32(0.5)
            chunk *= np.float32(std * np.sqrt(12.0))
            chunk.astype(self.np_dtype, copy=False).tofile(self.data_file)
        tensor = TensorProto()
        tensor.name, tensor.data_type = name, self.onnx_dtype
        tensor.dims.extend(shape)
        tensor.data_location = TensorProto.EXTERNAL
        length = self.data_file.tell() - offset
        for key, value in (("location", self.data_name), ("offset", str(offset)), ("length", str(length))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.initializers.append(tensor)
        return name


def build_large_model(spec: LargeModelSpec, directory: Path, seed: int = 0) -> tuple[Path, Path]:
    """Write ``large_moe.onnx`` and ``large_moe.onnx.data`` into ``directory``; returns both paths."""
    model_path = directory / "large_moe.onnx"
    data_path = directory / "large_moe.onnx.data"
    block = MoEBlockSpec(num_experts=spec.num_experts, top_k=spec.top_k, hidden=spec.hidden, ffn=spec.ffn)
    with open(data_path, "wb") as data_file:
        builder = StreamingBuilder(seed, data_file, data_path.name, spec.dtype)
        x = "hidden_states"
        for layer in range(spec.layers):
            x = add_moe_block(builder, x, f"model.layers.{layer}.mlp", block)
        builder.nodes.append(helper.make_node("Identity", [x], ["output"], name="output/Identity"))
        data_file.flush()
        os.fsync(data_file.fileno())
    onnx_dtype = DTYPES[spec.dtype][1]
    x_info = helper.make_tensor_value_info("hidden_states", onnx_dtype, ["tokens", spec.hidden])
    y_info = helper.make_tensor_value_info("output", onnx_dtype, ["tokens", spec.hidden])
    graph = helper.make_graph(builder.nodes, "large_moe", [x_info], [y_info], builder.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ndp-ep bench")
    model.ir_version = 9
    model_path.write_bytes(model.SerializeToString())
    return model_path, data_path


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def cpu_seconds(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def time_copy(data_path: Path) -> tuple[float, float, float]:
    """Seconds to copy ``data_path`` next to itself, without and with fsync of the copy, and the CPU seconds
    this process spent on both (the kernel's copy is system time); removes the copy."""
    target = data_path.with_name(data_path.name + ".copy")
    cpu_start = cpu_seconds(resource.getrusage(resource.RUSAGE_SELF))
    start = time.perf_counter()
    shutil.copyfile(data_path, target)
    copied = time.perf_counter()
    fsync_path(target)
    synced = time.perf_counter()
    cpu = cpu_seconds(resource.getrusage(resource.RUSAGE_SELF)) - cpu_start
    target.unlink()
    return copied - start, synced - start, cpu


def run_conversion(model_path: Path, out_path: Path, shards: int) -> tuple[dict, float, float, int, float]:
    """Convert in a child process; returns its JSON, seconds without/with fsync of its files, peak RSS bytes
    and the child's CPU seconds."""
    command = [sys.executable, "-m", "ndp_ep", "convert", str(model_path), "-o", str(out_path)]
    command += ["--external-data", "--json", "--shards", str(shards)]
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        start = time.perf_counter()
        child = subprocess.Popen(command, cwd=REPO, stdout=stdout, stderr=stderr)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage (peak RSS)
        done = time.perf_counter()
        child.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        stderr.seek(0)
        output, errors = stdout.read(), stderr.read()
    if child.returncode != 0:
        raise SystemExit(f"conversion failed (exit {child.returncode}): {errors.decode(errors='replace').strip()}")
    result = json.loads(output)
    for written in result["files"]:
        fsync_path(Path(written))
    synced = time.perf_counter()
    return result, done - start, synced - start, usage.ru_maxrss * 1024, cpu_seconds(usage)


def check_output(spec: LargeModelSpec, model_path: Path, out_path: Path, shards: int, seed: int) -> list[str]:
    """Structural checks and a few shard-vs-source slice comparisons; returns the problems found."""
    problems: list[str] = []
    source = onnx.load(str(model_path), load_external_data=False)
    converted = onnx.load(str(out_path), load_external_data=False)
    ops = [n for n in converted.graph.node if n.domain == DOMAIN and n.op_type == OP_TYPE]
    if len(ops) != spec.layers:
        problems.append(f"expected {spec.layers} sharded ops, found {len(ops)}")
    layouts = {(a.name, a.s.decode()) for op in ops for a in op.attribute if a.name.endswith("_layout")}
    if layouts != {("first_layout", "out_in"), ("down_layout", "out_in")}:  # the source stacks are [out, in]
        problems.append(f"expected out_in shards of the [out, in] source, found layouts {sorted(layouts)}")
    shard_tensors = {t.name: t for t in converted.graph.initializer if ".shard" in t.name}
    expected_count = spec.layers * spec.num_experts * shards * 2
    if len(shard_tensors) != expected_count:
        problems.append(f"expected {expected_count} shard initializers, found {len(shard_tensors)}")
    inline = [n for n, t in shard_tensors.items() if t.data_location != TensorProto.EXTERNAL]
    if inline:
        problems.append(f"{len(inline)} shard initializers are not external (first: {inline[0]})")

    def memmap(tensor: TensorProto, base: Path) -> np.ndarray:
        info = {e.key: e.value for e in tensor.external_data}
        return np.memmap(
            base / info["location"],
            dtype=DTYPES[spec.dtype][0],
            mode="r",
            offset=int(info["offset"]),
            shape=tuple(tensor.dims),
        )

    sources = {t.name: t for t in source.graph.initializer}
    width = spec.ffn // shards
    rng = np.random.default_rng(seed)
    for _ in range(4):
        layer, expert, shard = (int(rng.integers(n)) for n in (spec.layers, spec.num_experts, shards))
        block = f"model.layers.{layer}.mlp"
        gate_up_src = memmap(sources[f"{block}.experts.gate_up_proj"], model_path.parent)[expert]  # [2I, H]
        down_src = memmap(sources[f"{block}.experts.down_proj"], model_path.parent)[expert]  # [H, I]
        gate_up = memmap(shard_tensors[f"{block}.experts.{expert}.shard{shard}.gate_up"], out_path.parent)
        down = memmap(shard_tensors[f"{block}.experts.{expert}.shard{shard}.down"], out_path.parent)
        cols = slice(shard * width, (shard + 1) * width)
        # out_in shards: the gate rows then the up rows of the shard, and its columns of down
        want_gate_up = np.concatenate([gate_up_src[: spec.ffn][cols], gate_up_src[spec.ffn :][cols]], axis=0)
        if not np.array_equal(gate_up, want_gate_up):
            problems.append(f"{block} expert {expert} shard {shard}: gate_up differs from the source slice")
        if not np.array_equal(down, down_src[:, cols]):
            problems.append(f"{block} expert {expert} shard {shard}: down differs from the source slice")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir in the repo)")
    parser.add_argument("--keep", action="store_true", help="keep the generated and converted files")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=45)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--ffn", type=int, default=2048)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="expert weight precision")
    args = parser.parse_args()
    spec = LargeModelSpec(args.layers, args.experts, args.top_k, args.hidden, args.ffn, args.dtype)

    parent = args.dir if args.dir is not None else REPO
    parent.mkdir(parents=True, exist_ok=True)
    needed = int(3.1 * spec.expert_weight_bytes) + 256 * 2**20  # source, converted and a copy at once
    free = shutil.disk_usage(parent).free
    print(f"disk free at {parent}: {free / 1e9:.1f} GB, needed: {needed / 1e9:.1f} GB")
    if free < needed:
        print(f"NOT ENOUGH DISK SPACE: need {needed / 1e9:.1f} GB at {parent}, have {free / 1e9:.1f} GB")
        return 1
    work = Path(tempfile.mkdtemp(prefix="bench_large_model.", dir=parent))
    try:
        start = time.perf_counter()
        model_path, data_path = build_large_model(spec, work, args.seed)
        build_s = time.perf_counter() - start
        weight_bytes = data_path.stat().st_size
        print(
            f"built {spec.layers} MoE layers x {spec.num_experts} experts (H={spec.hidden}, I={spec.ffn}) "
            f"in {build_s:.1f} s"
        )
        copy_before = time_copy(data_path)
        out_path = work / "converted.onnx"
        result, convert_s, convert_sync_s, peak_rss, convert_cpu_s = run_conversion(model_path, out_path, args.shards)
        copy_after = time_copy(data_path)
        # the disk is shared and noisy: compare against the faster of the two copies (the stricter figure)
        copy_s, copy_sync_s, copy_cpu_s = min(copy_before, copy_after, key=lambda times: times[1])
        problems = check_output(spec, model_path, out_path, args.shards, args.seed)
        rss_target = RSS_ALLOWANCE_BYTES + spec.largest_tensor_bytes
        ratio = convert_sync_s / copy_sync_s
        figures = {
            "weight_bytes": weight_bytes,
            "largest_tensor_bytes": spec.largest_tensor_bytes,
            "blocks_converted": len(result["moe_blocks"]),
            "copy_s": round(copy_s, 2),
            "copy_with_fsync_s": round(copy_sync_s, 2),
            "copy_runs_with_fsync_s": [round(copy_before[1], 2), round(copy_after[1], 2)],
            "convert_s": round(convert_s, 2),
            "convert_with_fsync_s": round(convert_sync_s, 2),
            "ratio_to_copy": round(ratio, 2),
            "ratio_to_copy_page_cache": round(convert_s / copy_s, 2),
            "copy_cpu_s": round(copy_cpu_s, 2),
            "convert_cpu_s": round(convert_cpu_s, 2),
            "load_average": round(os.getloadavg()[0], 2),
            "peak_rss_bytes": peak_rss,
            "rss_target_bytes": rss_target,
        }
        print(f"weight bytes:          {weight_bytes / 1e9:.2f} GB ({weight_bytes / GIB:.2f} GiB)")
        print(f"largest tensor:        {spec.largest_tensor_bytes / 2**20:.0f} MiB")
        print(
            f"copy (+fsync):         {copy_s:.2f} s ({copy_sync_s:.2f} s), the faster of "
            f"{copy_before[1]:.2f} s before and {copy_after[1]:.2f} s after converting"
        )
        print(f"convert (+fsync):      {convert_s:.2f} s ({convert_sync_s:.2f} s), {len(result['moe_blocks'])} blocks")
        verdict = "PASS" if ratio <= COPY_RATIO_TARGET else "MISS"
        print(f"ratio to copy:         {ratio:.2f} (target <= {COPY_RATIO_TARGET}) {verdict}")
        print(f"  page cache only:     {convert_s / copy_s:.2f}")
        print(f"CPU (user + system):   copy {copy_cpu_s:.2f} s, convert {convert_cpu_s:.2f} s")
        print(f"load average (1 min):  {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        verdict = "PASS" if peak_rss <= rss_target else "MISS"
        print(f"peak RSS:              {peak_rss / 2**20:.0f} MiB (target <= {rss_target / 2**20:.0f} MiB) {verdict}")
        print("output check:          " + ("ok" if not problems else "; ".join(problems)))
        print(json.dumps(figures))
        return 1 if problems else 0
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
