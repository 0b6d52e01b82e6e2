"""Shapes of the work an MoE model asks for: experts, MoE layers and whole models.

Counts (tokens, experts) and sizes (bytes, FLOPs) are kept apart and every size says its unit.
"""

from __future__ import annotations

from dataclasses import dataclass

from hw_model.errors import WorkloadError
from hw_model.hardware import DTYPE_BYTES


@dataclass(frozen=True)
class ExpertShape:
    """One expert FFN: ``hidden -> ffn -> hidden``; ``gated`` means a GLU (gate and up projections)."""

    hidden: int
    ffn: int
    gated: bool = True
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        for name in ("hidden", "ffn"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise WorkloadError(f"ExpertShape.{name} must be a positive integer, got {value!r}")
        if self.dtype not in DTYPE_BYTES:
            raise WorkloadError(f"ExpertShape.dtype: unknown dtype {self.dtype!r}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def num_matrices(self) -> int:
        return 3 if self.gated else 2

    def weight_bytes(self, shards: int = 1) -> float:
        """Bytes of one tensor-parallel shard's weights (the whole expert when ``shards == 1``)."""
        return self.num_matrices * self.hidden * self.ffn * self.dtype_bytes / shards

    def flops(self, tokens: int, shards: int = 1) -> float:
        """FLOPs (2 per multiply-add) of one shard over ``tokens`` tokens."""
        return 2.0 * tokens * self.num_matrices * self.hidden * self.ffn / shards

    def activation_bytes(self, tokens: int, shards: int = 1) -> float:
        """Activation bytes a shard reads and writes: input, intermediate, partial output."""
        return tokens * self.dtype_bytes * (2 * self.hidden + self.num_matrices * self.ffn / shards)

    def partial_sum_bytes(self, tokens: int) -> float:
        """Bytes of one shard's partial output (what a tensor-parallel reduction moves per shard)."""
        return tokens * self.hidden * self.dtype_bytes


@dataclass(frozen=True)
class MoELayerShape:
    """One MoE layer: ``num_experts`` routed experts of one shape, ``top_k`` per token, plus shared ones."""

    name: str
    num_experts: int
    top_k: int
    expert: ExpertShape
    num_shared_experts: int = 0

    def __post_init__(self) -> None:
        if self.num_experts <= 0:
            raise WorkloadError(f"{self.name}: num_experts must be positive, got {self.num_experts}")
        if not 0 < self.top_k <= self.num_experts:
            raise WorkloadError(f"{self.name}: top_k must be in 1..{self.num_experts}, got {self.top_k}")
        if self.num_shared_experts < 0:
            raise WorkloadError(f"{self.name}: num_shared_experts must be >= 0")
