"""MoE model configurations for ``bench``: expert shapes plus the non-expert work costed on the GPU.

Shapes come from each model's published ``config.json`` (summarised in ../shared/reference/hardware.md and
checked against the configs): layers, hidden size, routed/shared experts, top-k, expert FFN width, attention
heads and KV heads, vocabulary. Non-expert operations (attention, norms, router, dense FFN layers, shared
experts, LM head) always run on the GPU with their weights resident there; only routed experts are placed
by the policies.
"""

from __future__ import annotations

from dataclasses import dataclass

from hw_model.cost import expert_shard_time_s, kernel_time_s
from hw_model.errors import WorkloadError
from hw_model.hardware import DTYPE_BYTES, SystemSpec
from hw_model.workload import ExpertShape, MoELayerShape

ATTENTION_KERNELS_PER_LAYER = 8  # norm, QKV, rotary, attention, output projection, norm, router, top-k


@dataclass(frozen=True)
class ModelConfig:
    """One MoE transformer. ``attention_params`` counts the Q/K/V/O (or MLA) projection weights per layer."""

    name: str
    moe_layers: int
    hidden: int
    num_experts: int
    top_k: int
    expert_ffn: int
    attention_params: int
    kv_elements_per_token: int
    num_heads: int
    head_dim: int
    vocab: int
    num_shared_experts: int = 0
    shared_expert_ffn: int = 0
    dense_layers: int = 0
    dense_ffn: int = 0
    dtype: str = "bf16"
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("moe_layers", "hidden", "num_experts", "top_k", "expert_ffn", "attention_params", "vocab"):
            if getattr(self, name) <= 0:
                raise WorkloadError(f"{self.name}: {name} must be positive")
        if self.top_k > self.num_experts:
            raise WorkloadError(f"{self.name}: top_k exceeds num_experts")
        if self.dtype not in DTYPE_BYTES:
            raise WorkloadError(f"{self.name}: unknown dtype {self.dtype!r}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def expert(self) -> ExpertShape:
        return ExpertShape(hidden=self.hidden, ffn=self.expert_ffn, gated=True, dtype=self.dtype)

    def moe_layer_shapes(self) -> list[MoELayerShape]:
        return [
            MoELayerShape(f"{self.name}.layers.{i}.moe", self.num_experts, self.top_k, self.expert)
            for i in range(self.moe_layers)
        ]

    @property
    def total_layers(self) -> int:
        return self.moe_layers + self.dense_layers

    def routed_expert_bytes(self) -> float:
        return self.moe_layers * self.num_experts * self.expert.weight_bytes()

    def non_expert_weight_bytes(self) -> float:
        """Weights that stay on the GPU: attention, routers, shared experts, dense FFN layers, embeddings."""
        params = self.total_layers * self.attention_params + self.moe_layers * self.hidden * self.num_experts
        params += self.moe_layers * self.num_shared_experts * 3 * self.hidden * self.shared_expert_ffn
        params += self.dense_layers * 3 * self.hidden * self.dense_ffn
        params += 2 * self.vocab * self.hidden
        return float(params * self.dtype_bytes)

    def kv_cache_bytes(self, context_tokens: int) -> float:
        return float(self.total_layers * context_tokens * self.kv_elements_per_token * self.dtype_bytes)

    def attention_time_s(self, system: SystemSpec, tokens: int, context_tokens: int) -> float:
        """GPU time of one layer's non-expert ops for ``tokens`` new tokens attending to ``context_tokens``."""
        b = self.dtype_bytes
        flops = 2.0 * tokens * (self.attention_params + self.hidden * self.num_experts)
        flops += 4.0 * tokens * context_tokens * self.num_heads * self.head_dim
        bytes_moved = (self.attention_params + self.hidden * self.num_experts) * b
        bytes_moved += context_tokens * self.kv_elements_per_token * b + 6 * tokens * self.hidden * b
        return kernel_time_s(system.gpu, flops, bytes_moved, self.dtype, ATTENTION_KERNELS_PER_LAYER)

    def shared_expert_time_s(self, system: SystemSpec, tokens: int) -> float:
        if not self.num_shared_experts:
            return 0.0
        shape = ExpertShape(hidden=self.hidden, ffn=self.shared_expert_ffn, gated=True, dtype=self.dtype)
        return self.num_shared_experts * expert_shard_time_s(system.gpu, shape, tokens)

    def dense_ffn_time_s(self, system: SystemSpec, tokens: int) -> float:
        if not self.dense_layers:
            return 0.0
        shape = ExpertShape(hidden=self.hidden, ffn=self.dense_ffn, gated=True, dtype=self.dtype)
        return self.dense_layers * expert_shard_time_s(system.gpu, shape, tokens)

    def lm_head_time_s(self, system: SystemSpec, tokens: int) -> float:
        b = self.dtype_bytes
        flops = 2.0 * tokens * self.vocab * self.hidden
        return kernel_time_s(system.gpu, flops, self.vocab * self.hidden * b + tokens * self.vocab * 4, self.dtype, 2)


def gqa_model(row: tuple[str, int, int, int, int, int, int, int, int, int, str]) -> ModelConfig:
    """A grouped-query-attention model from its table row: name, MoE layers, hidden, routed experts, top-k,
    expert FFN, heads, KV heads, head dim, vocab and the hub repository whose ``config.json`` it summarises.
    Q and O projections are ``hidden x heads*head_dim``, K and V ``hidden x kv_heads*head_dim``; the KV cache
    holds a key and a value per KV head and token."""
    name, layers, hidden, experts, top_k, ffn, heads, kv_heads, head_dim, vocab, repo = row
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    kv = 2 * kv_heads * head_dim
    return ModelConfig(
        name, layers, hidden, experts, top_k, ffn, attention, kv, heads, head_dim, vocab, source=f"{repo} config.json"
    )


MODELS: dict[str, ModelConfig] = {
    m.name: m
    for m in (
        gqa_model(("mixtral-8x7b", 32, 4096, 8, 2, 14336, 32, 8, 128, 32000, "mistralai/Mixtral-8x7B-v0.1")),
        gqa_model(("qwen3-30b-a3b", 48, 2048, 128, 8, 768, 32, 4, 128, 151936, "Qwen/Qwen3-30B-A3B")),
        ModelConfig(
            name="deepseek-v2-lite",
            moe_layers=26,
            hidden=2048,
            num_experts=64,
            top_k=6,
            expert_ffn=1408,
            # MLA: q_proj 2048x(16*192), kv_a 2048x(512+64), kv_b 512x(16*256), o_proj (16*128)x2048
            attention_params=2048 * 3072 + 2048 * 576 + 512 * 4096 + 2048 * 2048,
            kv_elements_per_token=512 + 64,  # compressed KV latent + rotary key
            num_heads=16,
            head_dim=192,
            vocab=102400,
            num_shared_experts=2,
            shared_expert_ffn=1408,
            dense_layers=1,
            dense_ffn=10944,
            source="deepseek-ai/DeepSeek-V2-Lite config.json (first layer dense)",
        ),
        gqa_model(("olmoe-1b-7b", 16, 2048, 64, 8, 1024, 16, 16, 128, 50304, "allenai/OLMoE-1B-7B-0924")),
    )
}


def get_model(name: str) -> ModelConfig:
    if name not in MODELS:
        raise WorkloadError(f"unknown model {name!r} (known: {', '.join(MODELS)})")
    return MODELS[name]


def sweep_model(num_experts: int, hidden: int, top_k: int = 2, layers: int = 8) -> ModelConfig:
    """A synthetic Mixtral-like model for the shape sweep: FFN = 3.5 x hidden, heads of 128, 4:1 GQA."""
    heads = max(1, hidden // 128)
    kv_heads = max(1, heads // 4)
    return ModelConfig(
        name=f"sweep-e{num_experts}-h{hidden}",
        moe_layers=layers,
        hidden=hidden,
        num_experts=num_experts,
        top_k=min(top_k, num_experts),
        expert_ffn=int(3.5 * hidden),
        attention_params=2 * hidden * hidden + 2 * hidden * kv_heads * 128,
        kv_elements_per_token=2 * kv_heads * 128,
        num_heads=heads,
        head_dim=128,
        vocab=32000,
        source="synthetic sweep shape",
    )
