"""Shapes of the work an MoE model asks for: experts, MoE layers and whole models.

Counts (tokens, experts) and sizes (bytes, FLOPs) are kept apart and every size says its unit.
"""

from __future__ import annotations

from dataclasses import dataclass

from hw_model.errors import WorkloadError
from hw_model.hardware import DTYPE_BYTES

WEIGHT_DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "int8": 1.0, "int4": 0.5}
QUANTIZED_DTYPES = ("int8", "int4")
SCALE_DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}
_WEIGHT_DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class WeightFormat:
    """How expert weights are stored, so copies and NDP streams move the bytes the model really has.

    ``dtype``: ``float32``, ``float16``, ``bfloat16``, ``int8`` or ``int4`` (``fp32``/``fp16``/``bf16`` are
    accepted). Integer formats carry one scale of ``scale_dtype`` per ``block_size`` weights, so
    ``bytes_per_weight = dtype bytes + scale bytes / block_size`` (int4: 0.5 + 2/32 = 0.5625 by default).
    Compute still runs in the expert's activation dtype (weights are dequantised on the fly).
    """

    dtype: str = "bfloat16"
    block_size: int = 32
    scale_dtype: str = "float16"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _WEIGHT_DTYPE_ALIASES.get(self.dtype, self.dtype))
        if self.dtype not in WEIGHT_DTYPE_BYTES:
            raise WorkloadError(
                f"WeightFormat.dtype: unknown weight dtype {self.dtype!r} (known: {', '.join(WEIGHT_DTYPE_BYTES)})"
            )
        if not isinstance(self.block_size, int) or isinstance(self.block_size, bool) or self.block_size < 1:
            raise WorkloadError(f"WeightFormat.block_size must be a positive integer, got {self.block_size!r}")
        if self.scale_dtype not in SCALE_DTYPE_BYTES:
            raise WorkloadError(
                f"WeightFormat.scale_dtype: unknown {self.scale_dtype!r} (known: {', '.join(SCALE_DTYPE_BYTES)})"
            )

    @property
    def bytes_per_weight(self) -> float:
        base = WEIGHT_DTYPE_BYTES[self.dtype]
        if self.dtype in QUANTIZED_DTYPES:
            return base + SCALE_DTYPE_BYTES[self.scale_dtype] / self.block_size
        return base


@dataclass(frozen=True)
class ExpertShape:
    """One expert FFN: ``hidden -> ffn -> hidden``; ``gated`` means a GLU (gate and up projections).

    ``dtype`` is the compute/activation dtype; ``weight_format`` (default: weights stored in ``dtype``) sets
    the bytes per stored weight.
    """

    hidden: int
    ffn: int
    gated: bool = True
    dtype: str = "bf16"
    weight_format: WeightFormat | None = None

    def __post_init__(self) -> None:
        for name in ("hidden", "ffn"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise WorkloadError(f"ExpertShape.{name} must be a positive integer, got {value!r}")
        if self.dtype not in DTYPE_BYTES:
            raise WorkloadError(f"ExpertShape.dtype: unknown dtype {self.dtype!r}")
        if self.weight_format is not None and not isinstance(self.weight_format, WeightFormat):
            raise WorkloadError(f"ExpertShape.weight_format must be a WeightFormat, got {self.weight_format!r}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def weight_bytes_per_element(self) -> float:
        """Stored bytes per weight (scales included)."""
        if self.weight_format is None:
            return float(self.dtype_bytes)
        return self.weight_format.bytes_per_weight

    @property
    def num_matrices(self) -> int:
        return 3 if self.gated else 2

    def weight_bytes(self, shards: float = 1) -> float:
        """Bytes of one tensor-parallel shard's weights (the whole expert when ``shards == 1``)."""
        return self.num_matrices * self.hidden * self.ffn * self.weight_bytes_per_element / shards

    def flops(self, tokens: int, shards: float = 1) -> float:
        """FLOPs (2 per multiply-add) of one shard over ``tokens`` tokens."""
        return 2.0 * tokens * self.num_matrices * self.hidden * self.ffn / shards

    def activation_bytes(self, tokens: int, shards: float = 1) -> float:
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
