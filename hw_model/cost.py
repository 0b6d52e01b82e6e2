"""Cost of one operation on one device: a roofline plus a fixed per-kernel cost.

    time = kernels * kernel_overhead_s + max(flops / peak_flops_per_s, bytes / memory_bandwidth_bytes_per_s)

The same form serves every device (GPU, NDP unit) and every preset.
"""

from __future__ import annotations

from hw_model.hardware import ComputeSpec
from hw_model.workload import ExpertShape

GATED_EXPERT_KERNELS = 4  # gate GEMM, up GEMM, fused SiLU*mul, down GEMM
PLAIN_EXPERT_KERNELS = 3  # fc1 GEMM, activation, fc2 GEMM


def kernel_time_s(device: ComputeSpec, flops: float, bytes_moved: float, dtype: str, kernels: int = 1) -> float:
    """Roofline time of ``kernels`` kernels that together do ``flops`` and move ``bytes_moved``."""
    compute_s = flops / device.flops_per_s(dtype)
    memory_s = bytes_moved / device.memory_bandwidth_bytes_per_s
    return kernels * device.kernel_overhead_s + max(compute_s, memory_s)


def expert_shard_time_s(device: ComputeSpec, expert: ExpertShape, tokens: int, shards: int = 1) -> float:
    """Time for one tensor-parallel shard (1/``shards`` of the FFN width) of ``expert`` over ``tokens``."""
    if tokens <= 0:
        return 0.0
    kernels = GATED_EXPERT_KERNELS if expert.gated else PLAIN_EXPERT_KERNELS
    flops = expert.flops(tokens, shards)
    bytes_moved = expert.weight_bytes(shards) + expert.activation_bytes(tokens, shards)
    return kernel_time_s(device, flops, bytes_moved, expert.dtype, kernels)
