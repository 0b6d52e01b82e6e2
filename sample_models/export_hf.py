"""Export tiny random-weight Hugging Face MoE models to ONNX, as real users' exporters would.

Run with the ``export`` extra installed (torch, transformers>=5, onnxscript)::

    python sample_models/export_hf.py            # writes sample_models/hf/*.onnx, *.inputs.npz, *.outputs.npz

For every family (Mixtral, Qwen2-MoE, GPT-OSS, SwitchTransformers) and every exporter (``dynamo=True`` and the
TorchScript exporter ``dynamo=False``) it builds the model from its transformers config class (no hub download),
sets ``experts_implementation="batched_mm"`` (the only stacked-expert implementation that exports: the default
``grouped_mm`` does not), and exports

    <family>_block_<exporter>.onnx   one sparse MoE block module   ([B, S, H] -> [B, S, H])
    <family>_model_<exporter>.onnx   a whole causal LM with several MoE layers, use_cache=False  (ids -> logits)

next to ``.inputs.npz`` (the feeds, keyed by graph input name) and ``.outputs.npz`` (what PyTorch computed,
keyed by graph output name). It also writes negative fixtures (``*_eager_torchscript.onnx``: the TorchScript
exporter unrolls only the experts that were hit while tracing) and records every failed export with its error
in ``hf/EXPORT_NOTES.md``. Weights are re-drawn from a seeded normal distribution with a larger spread than
the default initialiser so that outputs are O(1) and routing decisions are far from ties.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
import transformers
from transformers.activations import ACT2FN
from transformers.integrations.moe import use_experts_implementation

HF_DIR = Path(__file__).resolve().parent / "hf"
SEED = 1234
BATCH = 1
SEQ = 6
EAGER_SEQ = 1
VOCAB = 96
MAX_FIXTURE_BYTES = 1_000_000


@dataclass(frozen=True)
class Family:
    name: str
    make_config: Callable[[], transformers.PretrainedConfig]
    model_class: Callable[[transformers.PretrainedConfig], torch.nn.Module]
    block_path: str  # attribute path from the causal LM to one sparse MoE block ("": the first one found)
    block_returns_tuple: bool = False
    stacked_experts: bool = True  # False: experts are a ModuleDict loop (no experts_implementation switch)
    extra: bool = False  # a generalisation fixture: block only, saved under hf/extra/


def decoder_config(config_class: type[transformers.PretrainedConfig], **own: Any) -> transformers.PretrainedConfig:
    """A tiny decoder-only config of ``config_class``: what the stacked-expert decoders share, then ``own``."""
    return config_class(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        attn_implementation="eager",
        experts_implementation="batched_mm",
        tie_word_embeddings=False,
        **own,
    )


def mixtral_config() -> transformers.PretrainedConfig:
    return decoder_config(transformers.MixtralConfig, intermediate_size=48, num_local_experts=4)


def qwen2_moe_config() -> transformers.PretrainedConfig:
    return decoder_config(
        transformers.Qwen2MoeConfig,
        intermediate_size=64,
        moe_intermediate_size=40,
        shared_expert_intermediate_size=56,
        num_experts=6,
        norm_topk_prob=False,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )


def gpt_oss_config() -> transformers.PretrainedConfig:
    return decoder_config(
        transformers.GptOssConfig,
        intermediate_size=32,
        head_dim=8,
        num_local_experts=4,
        sliding_window=8,
        # a small limit so that the random weights really exercise the clamp
        swiglu_limit=1.5,
    )


def switch_config() -> transformers.PretrainedConfig:
    return transformers.SwitchTransformersConfig(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=48,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        num_experts=4,
        encoder_sparse_step=1,
        decoder_sparse_step=1,
        expert_capacity=64,
        attn_implementation="eager",
        tie_word_embeddings=False,
    )


FAMILIES = (
    Family("mixtral", mixtral_config, transformers.MixtralForCausalLM, "model.layers.0.mlp"),
    Family("qwen2_moe", qwen2_moe_config, transformers.Qwen2MoeForCausalLM, "model.layers.0.mlp"),
    Family("gpt_oss", gpt_oss_config, transformers.GptOssForCausalLM, "model.layers.0.mlp", block_returns_tuple=True),
    Family(
        "switch",
        switch_config,
        transformers.SwitchTransformersForConditionalGeneration,
        "encoder.block.1.layer.1.mlp",
        stacked_experts=False,
    ),
)


# Generalisation fixtures: more families, other routers (grouped top-k with shared experts, sparse mixer) and
# module layouts, exported as single blocks only (hf/extra/). Tiny sizes set on whichever attributes exist.
EXTRA_FAMILY_TYPES = ("qwen3_moe", "olmoe", "deepseek_v3", "phimoe", "granitemoe")
TINY_ATTRIBUTES = {
    "hidden_size": 32,
    "intermediate_size": 48,
    "moe_intermediate_size": 40,
    "shared_expert_intermediate_size": 40,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": VOCAB,
    "max_position_embeddings": 64,
    "num_experts": 6,
    "num_local_experts": 6,
    "n_routed_experts": 6,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 2,
    "topk_group": 1,
    "first_k_dense_replace": 0,
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}


def tiny_config(model_type: str) -> transformers.PretrainedConfig:
    config = transformers.AutoConfig.for_model(model_type)
    for name, value in TINY_ATTRIBUTES.items():
        if hasattr(config, name):
            setattr(config, name, value)
    config._attn_implementation = "eager"
    config._experts_implementation = "batched_mm"
    return config


EXTRA_FAMILIES = tuple(
    Family(
        model_type,
        functools.partial(tiny_config, model_type),
        transformers.AutoModelForCausalLM.from_config,
        "",
        extra=True,
    )
    for model_type in EXTRA_FAMILY_TYPES
)


@use_experts_implementation(has_gate=False)
class PlainExperts(torch.nn.Module):
    """Non-gated stacked experts (``act(x @ up.T) @ down.T``), run by transformers' own ``batched_mm`` code path
    with ``has_gate=False`` (the layout NemotronH-style models use)."""

    def __init__(self, config: transformers.PretrainedConfig) -> None:
        super().__init__()
        self.num_experts, self.hidden_dim, self.intermediate_dim = 6, 32, 48
        generator = torch.Generator().manual_seed(SEED)
        self.up_proj = torch.nn.Parameter(torch.randn(6, 48, 32, generator=generator) * (1.5 / 32**0.5))
        self.down_proj = torch.nn.Parameter(torch.randn(6, 32, 48, generator=generator) * (1.5 / 48**0.5))
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states, top_k_index, top_k_weights):  # only batched_mm is exported
        raise NotImplementedError("PlainExperts runs through experts_implementation='batched_mm' only")


class PlainMoEBlock(torch.nn.Module):
    """Softmax/top-2 router over :class:`PlainExperts`."""

    def __init__(self, hidden_act: str) -> None:
        super().__init__()
        config = transformers.PretrainedConfig()
        config.hidden_act = hidden_act
        config._experts_implementation = "batched_mm"
        torch.manual_seed(SEED)
        self.gate = torch.nn.Linear(32, 6, bias=False)
        self.experts = PlainExperts(config)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = hidden_states.shape
        flat = hidden_states.view(-1, hidden)
        weights, ids = torch.topk(torch.softmax(self.gate(flat), dim=-1), 2, dim=-1)
        return self.experts(flat, ids, weights).view(batch, seq, hidden)


PLAIN_ACTIVATIONS = {"plain_relu": "relu", "plain_gelu": "gelu", "plain_gelu_tanh": "gelu_pytorch_tanh"}


def export_plain(name: str, exporter: str) -> tuple[str, str]:
    """A non-gated experts block (decomposed GELU forms included) into hf/extra/."""
    module = PlainMoEBlock(PLAIN_ACTIVATIONS[name]).eval()
    example = example_inputs("block", 32, SEQ)
    with torch.no_grad():
        reference = module(example).numpy()
    onnx_model = export(module, example, "hidden_states", dynamo=exporter == "dynamo", dynamic=True)
    stem = f"{name}_block_{exporter}"
    feeds = {onnx_model.graph.input[0].name: example.numpy()}
    size = save_fixture(HF_DIR / "extra", stem, onnx_model, feeds, {onnx_model.graph.output[0].name: reference})
    return stem, f"ok ({size} bytes, {len(onnx_model.graph.node)} nodes)"


def build_model(family: Family, experts_implementation: str) -> torch.nn.Module:
    torch.manual_seed(SEED)
    config = family.make_config()
    if hasattr(config, "_experts_implementation") and getattr(config, "_experts_implementation", None) is not None:
        config._experts_implementation = experts_implementation
    model = family.model_class(config).eval()
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or "layer_norm" in name or "layernorm" in name:
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
            else:
                fan_in = param.shape[-1] if param.dim() > 1 else 8
                param.copy_(torch.randn(param.shape, generator=generator) * (1.5 / fan_in**0.5))
    if hasattr(model, "set_experts_implementation") and model._can_set_experts_implementation():
        model.set_experts_implementation(experts_implementation)
    return model


class BlockWrapper(torch.nn.Module):
    """One MoE block with a single tensor output."""

    def __init__(self, block: torch.nn.Module, returns_tuple: bool) -> None:
        super().__init__()
        self.block = block
        self.returns_tuple = returns_tuple

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        out = self.block(hidden_states)
        return out[0] if self.returns_tuple and isinstance(out, tuple) else out


class CausalLMWrapper(torch.nn.Module):
    """A whole decoder without KV cache, returning logits only."""

    def __init__(self, model: torch.nn.Module, encoder_decoder: bool) -> None:
        super().__init__()
        self.model = model
        self.encoder_decoder = encoder_decoder

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # An explicit all-ones mask keeps transformers from probing for packed sequences (aten::diff, which the
        # TorchScript exporter cannot export).
        attention_mask = torch.ones_like(input_ids)
        if self.encoder_decoder:
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids, use_cache=False
            ).logits
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def export(
    module: torch.nn.Module, example: torch.Tensor, input_name: str, dynamo: bool, dynamic: bool
) -> onnx.ModelProto:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        kwargs: dict = {"input_names": [input_name], "output_names": ["output"], "opset_version": 18}
        if dynamo:
            kwargs.update(dynamo=True, external_data=False)
            if dynamic:
                kwargs["dynamic_shapes"] = {input_name: {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}}
        else:
            kwargs.update(dynamo=False, do_constant_folding=True)
            if dynamic:
                kwargs["dynamic_axes"] = {input_name: {0: "batch", 1: "seq"}, "output": {0: "batch", 1: "seq"}}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, (example,), path, **kwargs)
        model = onnx.load(path)
    onnx.checker.check_model(model)
    return model


def save_fixture(
    directory: Path, stem: str, model: onnx.ModelProto, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray]
) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    data = model.SerializeToString()
    if len(data) > MAX_FIXTURE_BYTES:
        raise RuntimeError(f"{stem}.onnx would be {len(data)} bytes (> {MAX_FIXTURE_BYTES})")
    (directory / f"{stem}.onnx").write_bytes(data)
    np.savez(directory / f"{stem}.inputs.npz", **feeds)
    np.savez(directory / f"{stem}.outputs.npz", **outputs)
    return len(data)


def find_block(model: torch.nn.Module, path: str) -> torch.nn.Module:
    """The module at ``path``, or the first module owning stacked experts (``experts.down_proj``)."""
    if path:
        return model.get_submodule(path)
    return next(m for _, m in model.named_modules() if hasattr(getattr(m, "experts", None), "down_proj"))


def example_inputs(kind: str, hidden: int, seq: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(SEED + 1)
    if kind == "block":
        return torch.randn(BATCH, seq, hidden, generator=generator)
    return torch.randint(0, VOCAB, (BATCH, seq), generator=generator)


def export_one(family: Family, kind: str, exporter: str, experts_implementation: str) -> tuple[str, str]:
    """Export one fixture; returns (stem, status line)."""
    suffix = exporter if experts_implementation == "batched_mm" else f"{experts_implementation}_{exporter}"
    stem = f"{family.name}_{kind}_{suffix}"
    model = build_model(family, experts_implementation)
    hidden = model.config.hidden_size if hasattr(model.config, "hidden_size") else model.config.d_model
    if kind == "block":
        block = find_block(model, family.block_path)
        module = BlockWrapper(block, family.block_returns_tuple or family.extra).eval()
        input_name = "hidden_states"
    else:
        module = CausalLMWrapper(model, encoder_decoder=family.name == "switch").eval()
        input_name = "input_ids"
    eager = experts_implementation == "eager"
    # An eager trace unrolls only the experts its example routes to: one token hits top_k of the experts.
    example = example_inputs(kind, hidden, seq=EAGER_SEQ if eager and family.stacked_experts else SEQ)
    with torch.no_grad():
        reference = module(example).detach().numpy()
    onnx_model = export(module, example, input_name, dynamo=exporter == "dynamo", dynamic=not eager)
    graph_input = onnx_model.graph.input[0].name
    graph_output = onnx_model.graph.output[0].name
    directory = HF_DIR / "extra" if family.extra else HF_DIR
    size = save_fixture(directory, stem, onnx_model, {graph_input: example.numpy()}, {graph_output: reference})
    ops = sorted({n.op_type for n in onnx_model.graph.node})
    return stem, f"ok ({size} bytes, {len(onnx_model.graph.node)} nodes; ops: {', '.join(ops)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated family names to export (default: all)")
    args = parser.parse_args()
    wanted = {n for n in args.only.split(",") if n}
    torch.set_num_threads(2)
    notes: list[str] = []
    jobs = []
    for family in FAMILIES + EXTRA_FAMILIES:
        if wanted and family.name not in wanted:
            continue
        if family.extra:
            jobs += [(family, "block", exporter, "batched_mm") for exporter in ("dynamo", "torchscript")]
        elif family.stacked_experts:
            for kind in ("block", "model"):
                for exporter in ("dynamo", "torchscript"):
                    jobs.append((family, kind, exporter, "batched_mm"))
            jobs.append((family, "block", "torchscript", "eager"))
            if family.name == "mixtral":  # the transformers default, recorded to document that it does not export
                jobs.append((family, "block", "dynamo", "grouped_mm"))
                jobs.append((family, "block", "torchscript", "grouped_mm"))
        else:  # no batched_mm: the eager expert loop is all there is
            for kind in ("block", "model"):
                for exporter in ("dynamo", "torchscript"):
                    jobs.append((family, kind, exporter, "eager"))
    for name in PLAIN_ACTIVATIONS:
        if not wanted or name in wanted:
            jobs += [(name, "block", exporter, "batched_mm") for exporter in ("dynamo", "torchscript")]
    for family, kind, exporter, impl in jobs:
        label = f"{getattr(family, 'name', family)} {kind} {exporter} experts_implementation={impl}"
        try:
            if isinstance(family, str):
                stem, status = export_plain(family, exporter)
            else:
                stem, status = export_one(family, kind, exporter, impl)
            line = f"- `{stem}`: {status}"
        except Exception as error:  # record, never hide: the notes file lists what did not export and why
            text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
            message = [m.strip() for m in text.strip().splitlines() if m.strip()]
            # torch.export wraps the real cause in a long banner: keep its first line and the innermost error
            causes = [m for m in message if m.startswith("<class")]
            summary = (message[0][:200] if message else "") + (f" ... {causes[-1][:200]}" if causes else "")
            line = f"- {label}: FAILED: `{type(error).__name__}: {summary}`"
        print(line, flush=True)
        notes.append(line)
    if not wanted:
        header = [
            "# Export notes (generated by sample_models/export_hf.py)",
            "",
            f"torch {torch.__version__}, transformers {transformers.__version__}, onnx {onnx.__version__}, "
            "opset 18, seed {SEED}.".replace("{SEED}", str(SEED)),
            "",
        ]
        (HF_DIR / "EXPORT_NOTES.md").write_text("\n".join(header + notes) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
