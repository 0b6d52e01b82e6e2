"""Tiny random MoE decoders exported with ONNX Runtime GenAI's model builder, as ONNX Runtime users have them.

Needs the ``export`` extra (torch, transformers, onnxruntime-genai, tokenizers)::

    python sample_models/build_genai.py                  # writes sample_models/genai/<name>/ + MANIFEST.json
    python sample_models/build_genai.py --held-out DIR   # the held-out configurations, into DIR (tests only)
    python sample_models/build_genai.py --outputs-only   # recomputes inputs.npz / outputs.npz of the committed
                                                         # fixtures with this onnxruntime (no export; no torch)
    python sample_models/build_genai.py --real-width lfm2_int4 --out /tmp/genai_lfm2 --layers 4
                                                         # one folder at a real model's widths (never committed:
                                                         # GBs of weights; REAL_WIDTHS lists them)

For every fixture it builds a Hugging Face checkpoint from its transformers config class with seeded random
weights (no download), saves a tiny word-level tokenizer beside it (the builder needs one), and runs
``python -m onnxruntime_genai.models.builder -i HF -o OUT -p PREC -e EP``: ``fp32`` on ``cpu``, ``fp16`` with
``-e cuda`` (the builder writes it without a GPU), ``int4`` on ``cpu`` and ``int8`` as ``-p int4
--extra_options moe_quant_type=int8``. GPT-OSS quantized exports read the original MXFP4 expert tensors,
so its checkpoints also carry random MXFP4 blocks and scales. Each output folder keeps the model
(``model.onnx`` + ``model.onnx.data``), ``genai_config.json`` and the tokenizer files, plus

    inputs.npz    first-step feeds (empty past, sliding caches at their window, zero conv states)
    outputs.npz   what stock ONNX Runtime (CPU) computes on them — absent when stock ORT cannot run the model
                  on CPU (LFM2 fp16: its GroupQueryAttention q/k norm has only CUDA/WebGPU kernels; Gemma-4
                  MoE: its MoE/QMoE's activation_type=geglu is CUDA only)
    hf_logits.npz Gemma-4 MoE fp32 only: Hugging Face torch's logits on the same input_ids, its reference

Gemma-4 MoE needs transformers >= 5.2x and a config shim for the builder (``_gemma4_config_shim``).

Expected outputs are stock ONNX Runtime's default path: ``ORT_QMOE_CPU_QNBIT_GEMM`` is unset while they are
computed. That path depends on the onnxruntime version (from 1.31 its CPU QMoE runs 8-bit experts with
int8-quantized activations, docs/genai.md), so ``MANIFEST.json`` records the version that computed them
(``outputs_onnxruntime``) beside each fixture's architecture, precision, expert count, top-k, MoE layer count
and widths. Export failures are written to ``genai/EXPORT_NOTES.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

GENAI_DIR = Path(__file__).resolve().parent / "genai"
VOCAB = 100  # unlike every layer width: the builder takes any Linear with vocab_size outputs for the LM head
SEQ = 5
FEED_SEED = 5
KEEP_FILES = ("model.onnx", "model.onnx.data", "genai_config.json", "tokenizer.json", "tokenizer_config.json")
PRECISION_ARGS = {
    "fp32": ["-p", "fp32", "-e", "cpu"],
    "fp16": ["-p", "fp16", "-e", "cuda"],
    "int4": ["-p", "int4", "-e", "cpu"],
    "int8": ["-p", "int4", "-e", "cpu", "--extra_options", "moe_quant_type=int8"],
}
WEIGHT_DTYPE = {"fp32": "float32", "fp16": "float16", "int4": "int4", "int8": "int8"}
QUANT_BLOCK = 32  # the builder's default QMoE block size


@dataclass(frozen=True)
class Fixture:
    """One exported model: an architecture at one precision with its MoE shape."""

    name: str
    arch: str  # a key of ARCHITECTURES
    precision: str
    num_experts: int
    top_k: int
    layers: int
    hidden: int
    ffn: int
    seed: int
    # the real-width folders' (REAL_WIDTHS) sizes; the committed fixtures keep these defaults
    vocab: int = VOCAB
    heads: int = 4
    kv_heads: int = 2
    context: int = 128
    dense_ffn: int = 0  # a dense MLP's width (LFM2's first layer); 0: 2 * hidden
    init_std: float | None = 0.2  # every weight drawn N(0, std) (outputs O(1), routing far from ties); None: the
    # model's own initialization (at real widths std 0.2 blows the activations up layer after layer)

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {self.arch!r}")
        if self.precision not in PRECISION_ARGS:
            raise ValueError(f"unknown precision {self.precision!r}")
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"{self.name}: top_k {self.top_k} not in 1..{self.num_experts}")
        if self.arch == "gpt_oss" and (self.hidden % 32 or self.ffn % 32):
            raise ValueError(f"{self.name}: GPT-OSS hidden and ffn must be multiples of 32 (its MXFP4 blocks)")

    @property
    def moe_layers(self) -> int:
        return self.layers - 1 if self.arch == "lfm2_moe" else self.layers  # LFM2: the first layer is dense


def _alternating_attention(f: Fixture, heads: int, kv_heads: int, head_dim: int) -> dict:
    """Config fields of ``f.layers`` layers alternating sliding-window (window 8) and full attention."""
    return {
        "num_hidden_layers": f.layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "sliding_window": 8,
        "max_position_embeddings": 128,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(f.layers)],
    }


def _gpt_oss(f: Fixture):
    import transformers

    config = transformers.GptOssConfig(
        vocab_size=VOCAB,
        hidden_size=f.hidden,
        intermediate_size=f.ffn,
        num_local_experts=f.num_experts,
        num_experts_per_tok=f.top_k,
        tie_word_embeddings=False,
        **_alternating_attention(f, heads=4, kv_heads=2, head_dim=16),
    )
    return transformers.GptOssForCausalLM(config)


def _lfm2_moe(f: Fixture):
    import transformers

    layer_types = ["full_attention" if i % 2 else "conv" for i in range(f.layers)]
    config = transformers.Lfm2MoeConfig(
        vocab_size=f.vocab,
        hidden_size=f.hidden,
        intermediate_size=f.dense_ffn or 2 * f.hidden,
        moe_intermediate_size=f.ffn,
        num_hidden_layers=f.layers,
        num_attention_heads=f.heads,
        num_key_value_heads=f.kv_heads,
        num_experts=f.num_experts,
        num_experts_per_tok=f.top_k,
        num_dense_layers=1,
        layer_types=layer_types,
        max_position_embeddings=f.context,
    )
    return transformers.Lfm2MoeForCausalLM(config)


def _gemma4_moe(f: Fixture):
    """Gemma-4 MoE (gemma-4-26B-A4B's layout: a dense MLP beside top-k GeGLU experts in every layer), text only."""
    import transformers

    text = transformers.Gemma4TextConfig(
        vocab_size=VOCAB,
        vocab_size_per_layer_input=VOCAB,
        hidden_size=f.hidden,
        hidden_size_per_layer_input=0,
        intermediate_size=2 * f.hidden,
        moe_intermediate_size=f.ffn,
        enable_moe_block=True,
        num_experts=f.num_experts,
        top_k_experts=f.top_k,
        global_head_dim=32,
        per_layer_config={},
        **_alternating_attention(f, heads=2, kv_heads=1, head_dim=32),
    )
    return transformers.Gemma4ForConditionalGeneration(transformers.Gemma4Config(text_config=text.to_dict()))


def _gemma4_config_shim(directory: Path) -> None:
    """The builder (onnxruntime-genai 0.18) reads ``global_head_dim`` and ``num_global_key_value_heads`` from the
    top level of a Gemma-4 config, which transformers >= 5.2x no longer writes (full-attention layers take theirs
    from ``per_layer_config``, empty here: every layer has the sliding layers' head_dim and KV heads)."""
    path = directory / "config.json"
    config = json.loads(path.read_text())
    text = config["text_config"]
    config["global_head_dim"] = text["head_dim"]
    config["num_global_key_value_heads"] = text["num_key_value_heads"]
    path.write_text(json.dumps(config, indent=1))


def _write_hf_logits(checkpoint: Path, out_dir: Path) -> None:
    """``hf_logits.npz``: Hugging Face torch's logits on the fixture's first-step ``input_ids`` (the reference of
    a model stock ONNX Runtime cannot run on CPU)."""
    import torch
    import transformers

    model = transformers.AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32).eval()
    input_ids = torch.from_numpy(np.load(out_dir / "inputs.npz")["input_ids"].astype(np.int64))
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits
    np.savez(out_dir / "hf_logits.npz", logits=logits.float().numpy())


def _qwen3_5_moe(f: Fixture):
    """Qwen3.5-MoE (Qwen3.5-35B-A3B's layout: three Gated DeltaNet linear-attention layers to one full-attention
    layer, top-k experts plus a gated shared expert in every layer, interleaved multimodal RoPE), text only."""
    import transformers

    text = transformers.Qwen3_5MoeTextConfig(
        vocab_size=VOCAB,
        hidden_size=f.hidden,
        moe_intermediate_size=f.ffn,
        shared_expert_intermediate_size=f.ffn + 32,
        num_experts=f.num_experts,
        num_experts_per_tok=f.top_k,
        num_hidden_layers=f.layers,
        layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(f.layers)],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_num_value_heads=4,
        linear_value_head_dim=16,
        max_position_embeddings=128,
        # the builder emits MRotaryEmbedding only with mrope_section (what Qwen3.5 checkpoints carry); without it the
        # graph declares [3, batch, seq] position ids that its plain RotaryEmbedding cannot read
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
    )
    vision = {"depth": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 32, "out_hidden_size": f.hidden}
    config = transformers.Qwen3_5MoeConfig(text_config=text.to_dict(), vision_config=vision)
    return transformers.Qwen3_5MoeForConditionalGeneration(config)


ARCHITECTURES = {
    "gpt_oss": _gpt_oss,
    "lfm2_moe": _lfm2_moe,
    "gemma4_moe": _gemma4_moe,
    "qwen3_5_moe": _qwen3_5_moe,
}
CONFIG_SHIMS = {"gemma4_moe": _gemma4_config_shim}
HF_LOGITS = {("gemma4_moe", "fp32")}  # fixtures stock ONNX Runtime cannot run on CPU, compared with torch instead

FIXTURES = (
    Fixture("gpt_oss_fp32", "gpt_oss", "fp32", num_experts=4, top_k=2, layers=2, hidden=64, ffn=32, seed=1),
    Fixture("gpt_oss_fp16", "gpt_oss", "fp16", num_experts=8, top_k=2, layers=2, hidden=64, ffn=64, seed=2),
    Fixture("gpt_oss_int4", "gpt_oss", "int4", num_experts=4, top_k=2, layers=2, hidden=64, ffn=128, seed=3),
    Fixture("gpt_oss_int8", "gpt_oss", "int8", num_experts=8, top_k=4, layers=3, hidden=64, ffn=64, seed=4),
    Fixture("lfm2_moe_fp32", "lfm2_moe", "fp32", num_experts=8, top_k=2, layers=3, hidden=64, ffn=32, seed=5),
    Fixture("lfm2_moe_fp16", "lfm2_moe", "fp16", num_experts=4, top_k=2, layers=3, hidden=64, ffn=64, seed=6),
    Fixture("lfm2_moe_int4", "lfm2_moe", "int4", num_experts=4, top_k=2, layers=4, hidden=64, ffn=128, seed=7),
    Fixture("lfm2_moe_int8", "lfm2_moe", "int8", num_experts=8, top_k=3, layers=3, hidden=64, ffn=64, seed=8),
    # GeGLU experts, which stock ONNX Runtime's CPU kernels refuse; ffn 88 ends in a partial QMoE block of 32
    Fixture("gemma4_moe_fp32", "gemma4_moe", "fp32", num_experts=4, top_k=2, layers=2, hidden=64, ffn=88, seed=9),
    Fixture("gemma4_moe_int4", "gemma4_moe", "int4", num_experts=4, top_k=2, layers=2, hidden=64, ffn=88, seed=10),
    # linear-attention + full-attention layers, shared experts beside the QMoE/MoE op
    Fixture("qwen3_5_moe_fp32", "qwen3_5_moe", "fp32", num_experts=4, top_k=2, layers=4, hidden=64, ffn=32, seed=11),
    Fixture("qwen3_5_moe_int4", "qwen3_5_moe", "int4", num_experts=8, top_k=2, layers=4, hidden=64, ffn=96, seed=12),
)
# tried and left out, with what happened (written to EXPORT_NOTES.md)
NOT_BUILT = (
    "- GraniteMoeHybrid (fp32, 4 experts): the installed builder exports only the dense shared MLP, no MoE op.",
    "- Phi-3.5-MoE: the builder forces int4 + CUDA and rejects longrope here.",
    "- bfloat16 (`-p bf16 -e cuda`): exports, but stock ONNX Runtime has no CPU kernels for it (unit-tested).",
)

# other expert counts, top-k, layer counts and widths; only the acceptance test generates these
HELD_OUT = (
    Fixture("held_gpt_oss_fp32", "gpt_oss", "fp32", num_experts=6, top_k=3, layers=1, hidden=32, ffn=96, seed=21),
    Fixture("held_gpt_oss_fp16", "gpt_oss", "fp16", num_experts=5, top_k=1, layers=3, hidden=96, ffn=32, seed=22),
    Fixture("held_gpt_oss_int8", "gpt_oss", "int8", num_experts=6, top_k=2, layers=1, hidden=96, ffn=128, seed=23),
    Fixture("held_lfm2_moe_int4", "lfm2_moe", "int4", num_experts=6, top_k=3, layers=2, hidden=96, ffn=64, seed=24),
    Fixture("held_lfm2_moe_fp32", "lfm2_moe", "fp32", num_experts=3, top_k=1, layers=5, hidden=32, ffn=64, seed=25),
)


# real models' widths with a few layers (--real-width NAME --layers N): LFM2-8B-A1B (hidden 2048, 32 experts top-4,
# expert FFN 1792, vocabulary 65,536, 32 heads / 8 KV heads, dense MLP 7168 in its first layer), int4 and int8 as the
# builder quantizes them. Qwen3-30B-A3B is not here: onnxruntime-genai 0.18's builder has no Qwen3MoeForCausalLM.
REAL_WIDTHS = {
    "lfm2_int4": Fixture(
        "lfm2_int4", "lfm2_moe", "int4", num_experts=32, top_k=4, layers=4, hidden=2048, ffn=1792, seed=31,
        vocab=65536, heads=32, kv_heads=8, context=4096, dense_ffn=7168, init_std=None,
    ),
    "lfm2_int8": Fixture(
        "lfm2_int8", "lfm2_moe", "int8", num_experts=32, top_k=4, layers=4, hidden=2048, ffn=1792, seed=33,
        vocab=65536, heads=32, kv_heads=8, context=4096, dense_ffn=7168, init_std=None,
    ),
}  # fmt: skip


def _mxfp4_tensors(f: Fixture, rng: np.random.Generator) -> dict:
    """Random MXFP4 expert blocks/scales as the original GPT-OSS checkpoints store them (the builder's
    quantized export reads these instead of the float weights)."""
    import torch

    tensors = {}
    for layer in range(f.layers):
        prefix = f"model.layers.{layer}.mlp.experts"
        for name, rows, cols in (("gate_up_proj", 2 * f.ffn, f.hidden), ("down_proj", f.hidden, f.ffn)):
            blocks = rng.integers(0, 256, (f.num_experts, rows, cols // 32, 16), dtype=np.uint8)
            scales = rng.integers(122, 125, (f.num_experts, rows, cols // 32), dtype=np.uint8)  # 2**-5 .. 2**-3
            tensors[f"{prefix}.{name}_blocks"] = torch.from_numpy(blocks)
            tensors[f"{prefix}.{name}_scales"] = torch.from_numpy(scales)
    return tensors


def make_checkpoint(f: Fixture, directory: Path) -> None:
    """A random-weight HF checkpoint and a word-level tokenizer for ``f`` in ``directory``."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(f.seed)
    model = ARCHITECTURES[f.arch](f).eval()
    if f.init_std is not None:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.normal_(0.0, f.init_std)
    model.save_pretrained(directory)
    if f.arch in CONFIG_SHIMS:
        CONFIG_SHIMS[f.arch](directory)
    if f.arch == "gpt_oss" and f.precision in ("int4", "int8"):
        from safetensors.torch import load_file, save_file

        path = directory / "model.safetensors"
        tensors = load_file(path)
        tensors.update(_mxfp4_tensors(f, np.random.default_rng(f.seed)))
        save_file(tensors, path, metadata={"format": "pt"})
    vocab = {f"t{i}": i for i in range(f.vocab)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0", eos_token="t1")
    fast.save_pretrained(directory)


def export(f: Fixture, out_dir: Path) -> str | None:
    """Export ``f`` into ``out_dir`` (feeds and expected outputs included); returns an error line or None."""
    with tempfile.TemporaryDirectory(prefix=f"genai_{f.name}_") as tmp:
        hf, built = Path(tmp) / "hf", Path(tmp) / "out"
        make_checkpoint(f, hf)
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(built)]
        command += [*PRECISION_ARGS[f.precision], "-c", str(Path(tmp) / "cache")]
        done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if done.returncode != 0 or not (built / "model.onnx").is_file():
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            return lines[-1] if lines else f"builder exited {done.returncode}"
        dead = _dead_moe_ops(built / "model.onnx")
        if dead:
            return f"the exported graph does not use {dead} of its MoE ops (LM head mis-detected?)"
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.mkdir(parents=True)
        for name in KEEP_FILES:
            if (built / name).is_file():
                shutil.copy2(built / name, out_dir / name)
        write_feeds_and_outputs(out_dir)
        if (f.arch, f.precision) in HF_LOGITS:
            _write_hf_logits(hf, out_dir)
    return None


def _dead_moe_ops(path: Path) -> int:
    import onnx

    from graph_passes.graph_index import live_nodes

    model = onnx.load(str(path), load_external_data=False)
    live, _ = live_nodes(list(model.graph.node), {o.name for o in model.graph.output})
    fused = ("MoE", "QMoE")
    return sum(n.op_type in fused for n in model.graph.node) - sum(n.op_type in fused for n in live)


# the fields only REAL_WIDTHS set: not in MANIFEST.json (its entries stay as they were)
REAL_WIDTH_FIELDS = ("vocab", "heads", "kv_heads", "context", "dense_ffn", "init_std")
QNBIT_GEMM_ENV = "ORT_QMOE_CPU_QNBIT_GEMM"  # read by ONNX Runtime's CPU QMoE kernel when a session is created


def write_feeds_and_outputs(out_dir: Path) -> bool:
    """``inputs.npz`` (first-step feeds) and, when stock ORT runs the model on CPU, ``outputs.npz`` (its
    default path: ``ORT_QMOE_CPU_QNBIT_GEMM`` unset)."""
    import onnx
    import onnxruntime as ort

    from graph_passes.feeds import random_feeds, read_genai_config

    path = out_dir / "model.onnx"
    model = onnx.load(str(path), load_external_data=False)
    feeds = random_feeds(model, seed=FEED_SEED, seq_len=SEQ, config=read_genai_config(path))
    np.savez(out_dir / "inputs.npz", **feeds)
    previous = os.environ.pop(QNBIT_GEMM_ENV, None)
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        outputs = dict(zip(names, session.run(names, feeds), strict=True))
    except Exception as exc:  # onnxruntime's own exception types: the model has no CPU kernels for some op
        (out_dir / "outputs.npz").unlink(missing_ok=True)
        (out_dir / "NO_CPU_OUTPUTS.txt").write_text(str(exc).splitlines()[0] + "\n")
        return False
    finally:
        if previous is not None:
            os.environ[QNBIT_GEMM_ENV] = previous
    np.savez(out_dir / "outputs.npz", **outputs)
    return True


def build(fixtures: tuple[Fixture, ...], root: Path, notes_path: Path | None) -> dict[str, dict]:
    manifest_path = root / "MANIFEST.json"
    manifest: dict[str, dict] = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    known = {f.name for f in FIXTURES + HELD_OUT}
    manifest = {name: entry for name, entry in manifest.items() if name in known}
    failures: list[str] = []
    for f in fixtures:
        error = export(f, root / f.name)
        if error is not None:
            manifest.pop(f.name, None)
            failures.append(f"- `{f.name}` ({f.arch}, {f.precision}): {error}")
            print(f"{f.name}: export failed: {error}", file=sys.stderr)
            continue
        entry = {
            **{k: v for k, v in asdict(f).items() if k not in REAL_WIDTH_FIELDS},
            "moe_layers": f.moe_layers,
            "weight_dtype": WEIGHT_DTYPE[f.precision],
            "quant_block_size": QUANT_BLOCK if f.precision in ("int4", "int8") else 0,
            **_outputs_entry(root / f.name),
        }
        manifest[f.name] = entry
        print(f"{f.name}: exported ({'with' if entry['cpu_outputs'] else 'without'} CPU outputs)")
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    if notes_path is not None:
        lines = ["# GenAI builder export notes", "", "Fixtures the builder could not export (build_genai.py):", ""]
        lines += failures or ["(none)"]
        lines += ["", "Architectures and precisions left out:", "", *NOT_BUILT]
        notes_path.write_text("\n".join(lines) + "\n")
    return manifest


def _outputs_entry(folder: Path) -> dict:
    import onnxruntime as ort

    cpu_outputs = (folder / "outputs.npz").is_file()
    return {"cpu_outputs": cpu_outputs, "outputs_onnxruntime": ort.__version__ if cpu_outputs else None}


def refresh_outputs(fixtures: tuple[Fixture, ...], root: Path) -> dict[str, dict]:
    """Recompute ``inputs.npz`` / ``outputs.npz`` of already exported fixtures (the models stay as they are)."""
    manifest_path = root / "MANIFEST.json"
    manifest: dict[str, dict] = json.loads(manifest_path.read_text())
    for f in fixtures:
        if f.name not in manifest or not (root / f.name / "model.onnx").is_file():
            raise SystemExit(f"{f.name}: not exported under {root}; run without --outputs-only first")
        write_feeds_and_outputs(root / f.name)
        manifest[f.name].update(_outputs_entry(root / f.name))
        print(f"{f.name}: outputs {'recomputed' if manifest[f.name]['cpu_outputs'] else 'not computable on CPU'}")
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def build_real_width(name: str, out: Path | None, layers: int | None) -> int:
    """``REAL_WIDTHS[name]`` (with ``layers`` decoder layers) exported into ``out``; no manifest entry."""
    if out is None:
        raise SystemExit("--real-width needs --out DIR (a real-width folder is never written into sample_models/)")
    f = REAL_WIDTHS[name]
    if layers is not None:
        f = replace(f, layers=layers)
    error = export(f, out)
    if error is not None:
        print(f"{name}: export failed: {error}", file=sys.stderr)
        return 1
    print(f"{name}: {f.layers} layers ({f.moe_layers} MoE) exported into {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held-out", type=Path, help="write the held-out configurations into this directory")
    parser.add_argument("--only", nargs="*", help="fixture names to (re)build")
    parser.add_argument(
        "--outputs-only", action="store_true", help="recompute the feeds and expected outputs only (no export)"
    )
    parser.add_argument("--real-width", choices=sorted(REAL_WIDTHS), help="one folder at a real model's widths")
    parser.add_argument("--out", type=Path, help="--real-width: the folder to write (replaced if it exists)")
    parser.add_argument("--layers", type=int, help="--real-width: decoder layers (default: REAL_WIDTHS')")
    args = parser.parse_args(argv)
    if args.real_width:
        return build_real_width(args.real_width, args.out, args.layers)
    fixtures = HELD_OUT if args.held_out else FIXTURES
    if args.only:
        fixtures = tuple(f for f in fixtures if f.name in args.only)
    root = args.held_out or GENAI_DIR
    if args.outputs_only:
        refresh_outputs(fixtures, root)
        return 0
    root.mkdir(parents=True, exist_ok=True)
    build(fixtures, root, None if args.held_out else root / "EXPORT_NOTES.md")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
