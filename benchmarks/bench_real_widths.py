"""Real models' widths, built without downloads: convert, session and run costs against a copy and stock ONNX Runtime.

    python benchmarks/bench_real_widths.py                      # every case (about 11 GB of weights, one at a time)
    python benchmarks/bench_real_widths.py --cases lfm2_int4 qwen3_int4 --quick
    python benchmarks/bench_real_widths.py --dir /data/tmp --repeats 20
    python benchmarks/bench_real_widths.py --convert-only --convert-repeats 3 --cases lfm2_int4 --layers 24

Cases (seeded random weights; ``--quick``: the same widths with fewer experts or layers, see ``CASES``):

    lfm2_int4 / lfm2_int8   LFM2-8B-A1B widths: hidden 2048, 32 experts top-4, expert FFN 1792, 4 QMoE layers
    qwen3_int4              Qwen3-30B-A3B widths: hidden 2048, 128 experts top-8, expert FFN 768, 4 QMoE layers
    gpt_oss_fp32 / _fp16    GPT-OSS-20B widths: hidden 2880, 32 experts top-4, FFN 2880, clamped SwiGLU, one MoE layer
    mixtral_fp16_torch      a torch (dynamo) export at Mixtral widths: hidden 4096, 8 experts top-2, FFN 14336,
                            fp16, 2.8 GB of external data (bench_large_model.py's builder)

The fused cases come from sample_models/build_real_widths.py (the layout ONNX Runtime GenAI's model builder emits:
router Gemm → ``com.microsoft.QMoE``/``MoE``); onnxruntime-genai's builder itself needs torch and the checkpoint
classes, which this benchmark does without. Per case, in one run, contenders alternating:

* convert / cp: ``ndp-ep convert --external-data`` in a child process (peak RSS from ``os.wait4``) between two
  copies of the weight file (the faster copy counts); both with fsync (bench_large_model.py's helpers). Target
  ≤ 1.5× cp, peak RSS ≤ 1 GiB + one expert's tensors. ``CPU s`` is the child's user + system time: on a shared
  machine the wall times follow the CPU left over. ``--convert-only`` measures just this (``--convert-repeats``
  conversions alternating with copies: the best of each, and the spread of each conversion's ratio to the faster
  of its neighbouring copies; ``proofs``: the blocks numerically proven on their own, the others covered by a
  proof of their signature); ``--layers`` sets the built cases' MoE layer count.
* session: ONNX Runtime sessions created in child processes, stock (CPU provider, original model) and EP
  (the converted model with NdpExecutionProvider, ``ndp_ep.session_options``), alternating ``--sessions`` times;
  creation wall time (best) and the peak RSS right after creation (``ru_maxrss`` in the child). Target ≤ 1.1×.
* runs: in those same children, median of ``--repeats`` runs at 1 and 64 tokens (intra-op threads
  ``--threads``; the best child's). Target ≤ 1.0×. Stock ONNX Runtime runs the torch export at 1 token only: its
  gathered form copies each routed slot's expert weights (60 GB at 64 tokens), so the 64-token ratio is n/a there.
* rel err: max |provider − stock| / max |stock| of one 4-token run (the last children's).
* GenAI 512 + 128: for a GenAI folder (``--genai DIR ...``, e.g. one exported by ONNX Runtime GenAI's model
  builder at LFM2-8B-A1B's widths, ``python sample_models/build_genai.py --real-width lfm2_int4 --out DIR``;
  ``--cases`` with no name measures only those) with onnxruntime-genai installed: greedy generation of
  128 tokens after a 512-token prompt (model load included), ``ndp-ep generate`` on the converted folder against
  stock GenAI on the original, alternating children, best of ``--sessions``; and whether the tokens agree. The
  ratio times GenAI's model load and loop in each child (ours: no conversion, the reports costed after it); beside
  it the same span's CPU time (all threads; steadier than wall time on a shared machine) and the whole child
  process's wall time (start-up, imports, ``ndp-ep generate``'s checks and reports too). The built cases are bare
  models: n/a.

Every model and output lives in a temporary folder under ``--dir`` (default /tmp), removed after its case.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_large_model import (  # noqa: E402
    COPY_RATIO_TARGET,
    RSS_ALLOWANCE_BYTES,
    LargeModelSpec,
    build_large_model,
    run_conversion,
    time_copy,
)
from sample_models.build_real_widths import RealWidthSpec, build_real_width_model  # noqa: E402

SESSION_RATIO_TARGET = 1.1
RUN_RATIO_TARGET = 1.0
MIB = 2**20


@dataclass(frozen=True)
class Case:
    """One benchmark model: a fused-op ``spec`` or a torch-export ``torch`` spec, and its ``--quick`` variant."""

    name: str
    spec: RealWidthSpec | LargeModelSpec | Path  # a Path: an existing GenAI folder (``--genai``)
    quick: RealWidthSpec | LargeModelSpec | Path
    stock_tokens: tuple[int, ...] = (1, 64)  # token counts stock ONNX Runtime runs (the provider runs 1 and 64)

    def chosen(self, quick: bool) -> RealWidthSpec | LargeModelSpec | Path:
        return self.quick if quick else self.spec


def genai_case(folder: Path) -> Case:
    """A case for an ONNX Runtime GenAI folder (its ``model.onnx``, ``model.onnx.data``, ``genai_config.json``)."""
    return Case(folder.name, folder, folder)


def _fused(layers: int, experts: int, top_k: int, hidden: int, ffn: int, precision: str, gpt_oss: bool = False):
    return RealWidthSpec(layers, experts, top_k, hidden, ffn, precision, gpt_oss_swiglu=gpt_oss)


CASES = {
    case.name: case
    for case in (
        Case("lfm2_int4", _fused(4, 32, 4, 2048, 1792, "int4"), _fused(1, 32, 4, 2048, 1792, "int4")),
        Case("lfm2_int8", _fused(4, 32, 4, 2048, 1792, "int8"), _fused(1, 32, 4, 2048, 1792, "int8")),
        Case("qwen3_int4", _fused(4, 128, 8, 2048, 768, "int4"), _fused(1, 128, 8, 2048, 768, "int4")),
        Case("gpt_oss_fp32", _fused(1, 32, 4, 2880, 2880, "fp32", True), _fused(1, 8, 4, 2880, 2880, "fp32", True)),
        Case("gpt_oss_fp16", _fused(1, 32, 4, 2880, 2880, "fp16", True), _fused(1, 8, 4, 2880, 2880, "fp16", True)),
        Case(
            "mixtral_fp16_torch",
            LargeModelSpec(layers=1, num_experts=8, top_k=2, hidden=4096, ffn=14336, dtype="float16"),
            LargeModelSpec(layers=1, num_experts=4, top_k=2, hidden=4096, ffn=14336, dtype="float16"),
            stock_tokens=(1,),  # the gathered form copies each slot's expert: 64 tokens x top-2 = 60 GB
        ),
    )
}


def expert_bytes(spec: RealWidthSpec | LargeModelSpec | Path) -> int:
    """One expert's tensors as stored (the peak-RSS allowance beyond 1 GiB): for a GenAI folder the largest expert
    tensor of its model divided by its expert count."""
    if isinstance(spec, Path):
        import onnx

        from graph_passes.weights import WeightStore

        model = onnx.load(str(spec / "model.onnx"), load_external_data=False)
        store = WeightStore(model, spec)
        stacked = [t for t in model.graph.initializer if ".experts." in t.name and len(t.dims) >= 2]
        return sum(store.nbytes(t.name) // t.dims[0] for t in stacked) // max(1, _moe_layers(stacked))
    if isinstance(spec, RealWidthSpec):
        return spec.expert_bytes
    return spec.largest_tensor_bytes // spec.num_experts + spec.hidden * spec.ffn * spec.itemsize


def _moe_layers(stacked: list) -> int:
    return len({t.name.split(".experts.")[0] for t in stacked})


def build(spec: RealWidthSpec | LargeModelSpec | Path, directory: Path) -> tuple[Path, Path]:
    """The case's model and its weight file in ``directory`` (a GenAI folder: a copy of it there)."""
    if isinstance(spec, Path):  # copied first: every file the benchmark writes stays in its work folder
        model = Path(shutil.copytree(spec, directory / spec.name)) / "model.onnx"
        return model, model.with_name("model.onnx.data")
    if isinstance(spec, RealWidthSpec):
        model = build_real_width_model(spec, directory)
        return model, model.with_name("model.onnx.data")
    return build_large_model(spec, directory)


SESSION_CHILD = r"""
import json, resource, statistics, sys, time
import numpy as np
import onnxruntime as ort
kind, path, threads, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
token_counts = [int(t) for t in sys.argv[6].split(",")]
options = ort.SessionOptions()
options.intra_op_num_threads = threads
options.log_severity_level = 3
start = time.perf_counter()
if kind == "stock":
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
else:
    import ndp_ep
    session = ort.InferenceSession(path, ndp_ep.session_options(options, record_routing=0))
created = time.perf_counter() - start
created_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
inputs = session.get_inputs()
if len(inputs) == 1:  # a bare MoE stack: hidden states in, hidden states out
    (value,) = inputs
    dtype = np.float16 if value.type == "tensor(float16)" else np.float32
    rng = np.random.default_rng(0)

    def feeds(tokens, seed=0):
        rng = np.random.default_rng(seed)
        return {value.name: rng.standard_normal((tokens, value.shape[-1])).astype(dtype)}
else:  # a GenAI decoder: token ids, masks, empty caches (graph_passes.feeds, from its genai_config.json)
    import onnx
    from graph_passes.feeds import random_feeds, read_genai_config
    graph = onnx.load(path, load_external_data=False)
    config = read_genai_config(path)

    def feeds(tokens, seed=0):
        return random_feeds(graph, seed=seed, seq_len=tokens, config=config)
runs = {}
for tokens in token_counts:
    feed = feeds(tokens)
    session.run(None, feed)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - t)
    runs[tokens] = statistics.median(times)
out = session.run(None, feeds(4, seed=7))[0]
np.save(sys.argv[5], out)
print(json.dumps({"created_s": created, "created_rss": created_rss, "runs": runs}))
"""


STOCK_GENAI_CHILD = r"""
import json, sys, time
import numpy as np
import onnxruntime_genai as og
from pathlib import Path
from ndp_ep.commands.generate import _greedy
from ndp_ep.genai import read_config
folder, prompt_tokens, new_tokens = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
config = read_config(folder)
prompt = np.random.default_rng(0).integers(0, config["model"].get("vocab_size", 2), prompt_tokens).tolist()
start, start_cpu = time.perf_counter(), time.process_time()
tokens = _greedy(og, folder, config, prompt, new_tokens, None)
print(json.dumps({"wall_s": time.perf_counter() - start, "cpu_s": time.process_time() - start_cpu, "tokens": tokens}))
"""
GENAI_PROMPT, GENAI_NEW = 512, 128


def _child_json(command: list[str], what: str) -> dict:
    """The child's JSON, with ``process_s``: its whole run (start-up, imports, its own checks and reports)."""
    import time

    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
    process_s = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{what} failed: {done.stderr.strip()[-2000:]}")
    return {**json.loads(done.stdout), "process_s": process_s}


def genai_ratio(original: Path, converted: Path, repeats: int) -> str:
    """GenAI 512 + 128 greedy generation wall time (model load included), provider (``ndp-ep generate`` on the
    converted folder) / stock GenAI on the original folder's CPU provider, the best of ``repeats`` alternating
    children each; and whether the tokens agree."""
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        return "n/a (no onnxruntime-genai)"
    context = json.loads((original / "genai_config.json").read_text())["model"].get("context_length", 1 << 30)
    new = min(GENAI_NEW, context // 5)  # a model with a shorter context: the same 4:1 split of what fits
    prompt = min(GENAI_PROMPT, context - new)
    stock, ours = [], []
    for _ in range(repeats):
        command = [sys.executable, "-c", STOCK_GENAI_CHILD, str(original), str(prompt), str(new)]
        stock.append(_child_json(command, "stock GenAI"))
        command = [sys.executable, "-m", "ndp_ep", "generate", str(converted), "--prompt-tokens", str(prompt)]
        command += ["--new-tokens", str(new), "--seed", "0", "--no-check", "--json"]
        ours.append(_child_json(command, "ndp-ep generate"))
    same = ours[0]["tokens"] == stock[0]["tokens"]

    def ratio(key: str) -> float:
        return min(r[key] for r in ours) / min(r[key] for r in stock)

    return (
        f"{ratio('wall_s'):.2f} at {prompt}+{new} (CPU {ratio('cpu_s'):.2f}, whole process {ratio('process_s'):.2f}; "
        f"tokens {'identical' if same else 'differ'})"
    )


def session_child(kind: str, model: Path, args: argparse.Namespace, output: Path, tokens: tuple[int, ...]) -> dict:
    """Create a session (``stock`` on the original, ``ep`` on the converted model) in a child process, time it
    and its runs at ``tokens``; the child's whole peak RSS comes from ``os.wait4``."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, "-c", SESSION_CHILD, kind, str(model), str(args.threads), str(args.repeats)]
    command += [str(output), ",".join(map(str, tokens))]
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        stdout.seek(0)
        stderr.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{kind} session failed: {stderr.read().decode(errors='replace').strip()[-2000:]}")
        result = json.loads(stdout.read())
    result["peak_rss"] = usage.ru_maxrss * 1024
    return result


def with_layers(spec: RealWidthSpec | LargeModelSpec | Path, layers: int | None):
    """``spec`` with ``layers`` MoE layers (None: as it is; a GenAI folder is left as it is)."""
    if layers is None or isinstance(spec, Path):
        return spec
    return dataclasses.replace(spec, layers=layers)


def convert_figures(model: Path, data: Path, converted: Path, spec, args: argparse.Namespace) -> dict:
    """convert / cp: ``--convert-repeats`` conversions, each between two copies of the weight file (contenders
    alternating: cp, convert, cp, convert, ..., cp); the ratio of the best of each, and its spread (the worst and
    best ratio of a conversion to the faster of its neighbouring copies)."""
    copies = [time_copy(data)]
    conversions = []
    for _ in range(args.convert_repeats):
        conversions.append(run_conversion(model, converted, args.shards))
        copies.append(time_copy(data))
    _, copy_s, copy_cpu = min(copies, key=lambda times: times[1])
    best = min(conversions, key=lambda c: c[2])
    result, _, convert_s, _, convert_cpu = best
    ratios = [c[2] / min(copies[i][1], copies[i + 1][1]) for i, c in enumerate(conversions)]
    return {
        "weights_gb": data.stat().st_size / 1e9,
        "blocks": len(result["moe_blocks"]),
        "copy_s": copy_s,
        "convert_s": convert_s,
        "convert_cpu_s": convert_cpu,
        "copy_cpu_s": copy_cpu,
        "convert_ratio": convert_s / copy_s,
        "convert_ratio_spread": (min(ratios), max(ratios)),
        "convert_rss_mib": max(c[3] for c in conversions) / MIB,
        "rss_target_mib": (RSS_ALLOWANCE_BYTES + expert_bytes(spec)) / MIB,
        "proofs": sum(1 for b in result["moe_blocks"] if b.get("checked_numerically") and not b.get("proven_by")),
    }


def measure(case: Case, work: Path, args: argparse.Namespace) -> dict:
    """Every figure of one case (see the module docstring)."""
    import numpy as np

    spec = with_layers(case.chosen(args.quick), args.layers)
    model, data = build(spec, work)
    converted = work / "converted" / model.name
    converted.parent.mkdir()
    figures = convert_figures(model, data, converted, spec, args)
    figures["case"] = case.name
    if args.convert_only:
        return figures
    sessions: dict[str, list[dict]] = {"stock": [], "ep": []}
    for _ in range(args.sessions):
        for kind, path, tokens in (("stock", model, case.stock_tokens), ("ep", converted, (1, 64))):
            sessions[kind].append(session_child(kind, path, args, work / f"{kind}.npy", tokens))
    stock, ours = np.load(work / "stock.npy").astype(np.float64), np.load(work / "ep.npy").astype(np.float64)
    error = float(np.max(np.abs(ours - stock)) / max(np.max(np.abs(stock)), 1e-30))

    def best(kind: str, key: str) -> float:
        return min(s[key] for s in sessions[kind])

    def run_s(kind: str, tokens: str) -> float | None:
        times = [s["runs"][tokens] for s in sessions[kind] if tokens in s["runs"]]
        return min(times) if times else None

    def run_ratio(tokens: str) -> float | None:
        ours, stock = run_s("ep", tokens), run_s("stock", tokens)
        return ours / stock if ours is not None and stock is not None else None

    return {
        **figures,
        "stock_session_s": best("stock", "created_s"),
        "session_ratio": best("ep", "created_s") / best("stock", "created_s"),
        "stock_session_mib": best("stock", "created_rss") / MIB,
        "session_rss_ratio": best("ep", "created_rss") / best("stock", "created_rss"),
        "run1_ratio": run_ratio("1"),
        "run64_ratio": run_ratio("64"),
        "stock_run1_ms": run_s("stock", "1") * 1e3,
        "ep_run64_ms": run_s("ep", "64") * 1e3,
        "relative_error": error,
        "genai": genai_ratio(model.parent, converted.parent, args.sessions) if isinstance(spec, Path) else "n/a",
    }


HEADER = (
    f"{'case':<19} {'GB':>5} {'cp s':>6} {'conv s':>7} {'conv/cp':>7} {'CPU s':>6} {'RSS MiB':>8} {'target':>7} "
    f"{'sess s':>7} {'sess/st':>7} {'sess MiB':>8} {'RSS/st':>6} {'1 tok/st':>8} {'64 tok/st':>9} "
    f"{'st 1 ms':>8} {'ep 64 ms':>8} {'rel err':>8} genai"
)


def row(f: dict) -> str:
    return (
        f"{f['case']:<19} {f['weights_gb']:>5.2f} {f['copy_s']:>6.2f} {f['convert_s']:>7.2f} "
        f"{f['convert_ratio']:>7.2f} {f['convert_cpu_s']:>6.2f} {f['convert_rss_mib']:>8.0f} "
        f"{f['rss_target_mib']:>7.0f} "
        f"{f['stock_session_s']:>7.2f} {f['session_ratio']:>7.2f} {f['stock_session_mib']:>8.0f} "
        f"{f['session_rss_ratio']:>6.2f} {_ratio(f['run1_ratio']):>8} {_ratio(f['run64_ratio']):>9} "
        f"{f['stock_run1_ms']:>8.2f} {f['ep_run64_ms']:>8.2f} {f['relative_error']:>8.1e} {f['genai']}"
    )


CONVERT_HEADER = (
    f"{'case':<19} {'GB':>5} {'blocks':>6} {'proofs':>6} {'cp s':>6} {'conv s':>7} {'conv/cp':>7} {'spread':>11} "
    f"{'CPU s':>6} {'RSS MiB':>8} {'target':>7}"
)


def convert_row(f: dict) -> str:
    low, high = f["convert_ratio_spread"]
    return (
        f"{f['case']:<19} {f['weights_gb']:>5.2f} {f['blocks']:>6} {f['proofs']:>6} {f['copy_s']:>6.2f} "
        f"{f['convert_s']:>7.2f} {f['convert_ratio']:>7.2f} {f'{low:.2f}-{high:.2f}':>11} {f['convert_cpu_s']:>6.2f} "
        f"{f['convert_rss_mib']:>8.0f} {f['rss_target_mib']:>7.0f}"
    )


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--quick", action="store_true", help="the same widths with fewer experts or layers")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=2, help="alternating session children per contender")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs per token count in each child")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads of both sessions")
    parser.add_argument("--convert-only", action="store_true", help="measure convert / cp only (no sessions, runs)")
    parser.add_argument("--convert-repeats", type=int, default=1, help="conversions per case, alternating with cp")
    parser.add_argument("--layers", type=int, help="MoE layers of every built case (default: the case's own)")
    parser.add_argument("--json", action="store_true", help="also print each case's figures as JSON")
    parser.add_argument(
        "--genai", nargs="*", type=Path, default=[], metavar="DIR", help="ONNX Runtime GenAI folders to measure too"
    )
    args = parser.parse_args()
    print(f"targets: convert <= {COPY_RATIO_TARGET}x cp, RSS <= 1 GiB + one expert; session time and RSS")
    print(f"<= {SESSION_RATIO_TARGET}x stock; runs <= {RUN_RATIO_TARGET}x stock ({args.threads} threads); ours/stock")
    print(CONVERT_HEADER if args.convert_only else HEADER)
    cases = [CASES[name] for name in args.cases] + [genai_case(folder) for folder in args.genai]
    for case in cases:
        work = Path(tempfile.mkdtemp(prefix=f"bench_real_widths.{case.name}.", dir=args.dir))
        try:
            figures = measure(case, work, args)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print((convert_row if args.convert_only else row)(figures), flush=True)
        if args.json:
            print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
