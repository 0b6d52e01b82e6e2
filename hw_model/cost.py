"""Cost of the work MoE experts do on one device, in one form shared by every device and preset.

A kernel costs a fixed part plus a roofline part::

    kernel  = kernel_overhead_s [+ reduction_latency_s * log2(K) for a matrix product]
              + max(flops / achievable FLOP/s, bytes / achievable bandwidth)

    achievable FLOP/s of a product with reduction length K
            = peak[dtype] * achievable_flops_fraction * K / (K + gemm_fixed_k_elements)
    FLOPs of an M x K x N product = 2 * M_padded * K * N, M_padded = M rounded up to gemm_tile_m (M > 1);
    a single row (M = 1) runs as a matrix-vector kernel: no padding.

An expert shard is a sequence of such kernels (gate, up, fused SiLU*mul, down), summed, because each
kernel waits for the previous one. Work launched eagerly from Python additionally pays host time per
operator (``launch_overhead_eager_s``); host and device overlap, so a run costs whichever is longer.

The constants are global per device (peaks from the vendor, fractions from measured ceilings, small-kernel
costs stated as assumptions in the preset); nothing is fitted per shape. ``docs/validation.md`` reports
how this form predicts kernels measured on an H200.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hw_model.errors import WorkloadError
from hw_model.hardware import ComputeSpec
from hw_model.workload import ExpertShape, MoELayerShape

GATED_EXPERT_KERNELS = 4  # gate GEMM, up GEMM, fused SiLU*mul, down GEMM
PLAIN_EXPERT_KERNELS = 3  # fc1 GEMM, activation, fc2 GEMM
GATED_EXPERT_EAGER_OPS = 5  # gate mm, silu, up mm, mul, down mm: eager PyTorch does not fuse SiLU*mul
PLAIN_EXPERT_EAGER_OPS = 3

# A naive eager MoE layer (router matmul, softmax, top-k, then a Python loop over experts):
MOE_ROUTER_OPS = 4  # router mm, softmax, topk, zeros for the output
MOE_EXPERT_SELECT_OPS = 2  # per expert: (ids == e), torch.where -> nonzero, which syncs with the host
MOE_EXPERT_GATHER_SCATTER_OPS = 4  # per active expert: x[tokens], weight gather, weight mul, index_add_


@dataclass(frozen=True)
class KernelCost:
    """One kernel of a breakdown: what it is and how long it takes."""

    name: str
    time_s: float


def kernel_time_s(device: ComputeSpec, flops: float, bytes_moved: float, dtype: str, kernels: int = 1) -> float:
    """Roofline time of ``kernels`` kernels that together do ``flops`` and move ``bytes_moved``.

    For element-wise and other non-product operations; matrix products use :func:`gemm_time_s`.
    """
    compute_s = flops / device.achievable_flops_per_s(dtype)
    memory_s = bytes_moved / device.achievable_bandwidth_bytes_per_s
    return kernels * device.kernel_overhead_s + max(compute_s, memory_s)


def gemm_efficiency(device: ComputeSpec, k: int) -> float:
    """Fraction of the achievable FLOP/s that a product with reduction length ``k`` reaches."""
    return k / (k + device.gemm_fixed_k_elements)


def gemm_time_s(
    device: ComputeSpec, m: int, n: int, k: int, dtype: str, dtype_bytes: float, weight_bytes: float | None = None
) -> float:
    """Time of one ``[m, k] @ [k, n]`` product reading both operands and writing the result once.

    ``weight_bytes`` is the stored size of one element of the ``[k, n]`` operand (default ``dtype_bytes``;
    less for quantized weights, which are dequantised on the fly)."""
    return Product(device, n, k, dtype, dtype_bytes, weight_bytes).time_s(m)


class Product:
    """:func:`gemm_time_s` of a ``[m, k] @ [k, n]`` product for any ``m``, its ``m``-independent terms computed
    once (an expert shard's products are costed for many token counts)."""

    __slots__ = ("n", "k", "_tile", "_flops_per_s", "_weight_bytes", "_dtype_bytes", "_bandwidth", "_fixed_s")

    def __init__(
        self, device: ComputeSpec, n: int, k: int, dtype: str, dtype_bytes: float, weight_bytes: float | None = None
    ) -> None:
        self.n, self.k = n, k
        self._tile = device.gemm_tile_m
        self._dtype_bytes = dtype_bytes
        self._bandwidth = device.achievable_bandwidth_bytes_per_s
        if n > 0 and k > 0:
            self._flops_per_s = device.achievable_flops_per_s(dtype) * gemm_efficiency(device, k)
            self._weight_bytes = k * n * (dtype_bytes if weight_bytes is None else weight_bytes)
            self._fixed_s = device.kernel_overhead_s + device.reduction_latency_s * math.log2(k)

    def time_s(self, m: int) -> float:
        n, k = self.n, self.k
        if m <= 0 or n <= 0 or k <= 0:
            return 0.0
        tile = self._tile
        padded_m = m if m == 1 else math.ceil(m / tile) * tile
        compute_s = 2.0 * padded_m * n * k / self._flops_per_s
        memory_s = (self._weight_bytes + (m * k + m * n) * self._dtype_bytes) / self._bandwidth
        return self._fixed_s + max(compute_s, memory_s)


def elementwise_time_s(device: ComputeSpec, elements_read: float, elements_written: float, dtype_bytes: int) -> float:
    """One memory-bound element-wise kernel."""
    bytes_moved = (elements_read + elements_written) * dtype_bytes
    return device.kernel_overhead_s + bytes_moved / device.achievable_bandwidth_bytes_per_s


def expert_shard_kernels(
    device: ComputeSpec, expert: ExpertShape, tokens: int, shards: int = 1, *, fused_activation: bool = True
) -> tuple[KernelCost, ...]:
    """The kernels of one tensor-parallel shard (1/``shards`` of the FFN width) of ``expert``.

    ``fused_activation`` fuses the gated activation and the product into one kernel (a captured graph,
    a compiled kernel); eager PyTorch runs them as two.
    """
    _check_tokens_shards(tokens, shards)
    return ExpertShard(device, expert, shards, fused_activation=fused_activation).kernels(tokens)


class ExpertShard:
    """One tensor-parallel shard (1/``shards`` of the FFN width) of ``expert`` on ``device``: its kernels and
    their summed time for any token count (:func:`expert_shard_kernels`, :func:`expert_shard_time_s`), the
    products' token-independent terms computed once."""

    __slots__ = ("device", "_width", "_names", "_steps", "_dtype_bytes")

    def __init__(
        self, device: ComputeSpec, expert: ExpertShape, shards: float = 1, *, fused_activation: bool = True
    ) -> None:
        _check_tokens_shards(0, shards)
        width = self._width = max(1, math.ceil(expert.ffn / shards))
        hidden, b, dtype = expert.hidden, expert.dtype_bytes, expert.dtype
        per_weight = expert.weight_bytes_per_element
        self.device = device
        self._dtype_bytes = b
        # per kernel: a product, or an elementwise op reading that many [tokens, width] operands (writing one)
        steps: list[tuple[str, Product | int]]
        if expert.gated:
            gate = Product(device, width, hidden, dtype, b, per_weight)  # up has the same shape
            activation = [("silu_mul", 2)] if fused_activation else [("silu", 1), ("mul", 2)]
            steps = [("gate", gate), ("up", gate), *activation]
        else:
            steps = [("fc1", Product(device, width, hidden, dtype, b, per_weight)), ("activation", 1)]
        steps.append(("down", Product(device, hidden, width, dtype, b, per_weight)))
        self._names = tuple(name for name, _ in steps)
        self._steps = tuple(step for _, step in steps)

    def kernel_times_s(self, tokens: int) -> list[float]:
        """Each kernel's time over ``tokens`` tokens (none for 0 tokens), in launch order."""
        if tokens == 0:
            return []
        device, b, elements = self.device, self._dtype_bytes, tokens * self._width
        return [
            step.time_s(tokens)
            if isinstance(step, Product)
            else elementwise_time_s(device, step * elements, elements, b)
            for step in self._steps
        ]

    def kernels(self, tokens: int) -> tuple[KernelCost, ...]:
        return tuple(map(KernelCost, self._names, self.kernel_times_s(tokens)))

    def time_s(self, tokens: int, *, eager: bool = False) -> float:
        """The kernels' summed time (:func:`expert_shard_time_s`)."""
        if tokens <= 0:
            return 0.0
        times = self.kernel_times_s(tokens)
        device_s = sum(times)
        return eager_time_s(self.device, device_s, len(times)) if eager else device_s


def expert_shard_time_s(
    device: ComputeSpec,
    expert: ExpertShape,
    tokens: int,
    shards: int = 1,
    *,
    eager: bool = False,
) -> float:
    """Time for one tensor-parallel shard (1/``shards`` of the FFN width) of ``expert`` over ``tokens``.

    By default the shard's kernels run back to back from a captured graph (no host cost). ``eager=True``
    launches them one operator at a time from Python: see :func:`eager_time_s`.
    """
    if tokens <= 0:
        return 0.0
    return ExpertShard(device, expert, shards, fused_activation=not eager).time_s(tokens, eager=eager)


def eager_time_s(device: ComputeSpec, device_time_s: float, operators: int) -> float:
    """Wall time of ``operators`` eager launches whose kernels take ``device_time_s`` on the device.

    The host launches operators one after another while the device runs them: the run ends when the slower
    of the two is done, and the device cannot start before the first launch.
    """
    if operators <= 0:
        return device_time_s
    launch_s = device.launch_overhead_eager_s
    return max(operators * launch_s, launch_s + device_time_s)


def expected_active_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Expected number of distinct experts ``tokens`` tokens select under uniform top-k routing."""
    if tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def moe_layer_eager_time_s(device: ComputeSpec, layer: MoELayerShape, tokens: int) -> float:
    """Wall time of a naive eager MoE layer: router, then a Python loop over every expert.

    Each expert's ``torch.where`` synchronises with the host (one round trip, ``sync_overhead_s``), so host
    launch costs dominate at low batch, and an expert's launches and kernels add up rather than overlap.
    Routing is taken as uniform: the expected number of active experts share ``tokens * top_k`` assignments
    equally. Shared experts, if any, run on every token.
    """
    _check_tokens_shards(tokens, 1)
    if tokens == 0:
        return 0.0
    expert = layer.expert
    b = expert.dtype_bytes
    launch_s, sync_s = device.launch_overhead_eager_s, device.sync_overhead_s
    router_device_s = gemm_time_s(device, tokens, layer.num_experts, expert.hidden, expert.dtype, b)
    router_s = eager_time_s(device, router_device_s, MOE_ROUTER_OPS)
    select_s = layer.num_experts * (MOE_EXPERT_SELECT_OPS * launch_s + sync_s)
    active = expected_active_experts(layer.num_experts, layer.top_k, tokens)
    tokens_per_expert = max(1, round(tokens * layer.top_k / active))
    ffn_kernels = expert_shard_kernels(device, expert, tokens_per_expert, fused_activation=False)
    gather_scatter_s = 3 * elementwise_time_s(device, tokens_per_expert * expert.hidden, 0, b)
    per_expert_device_s = sum(k.time_s for k in ffn_kernels) + gather_scatter_s
    # The next expert's torch.where waits for this expert's kernels, so host launches and device work of one
    # expert alternate rather than overlap: charge them in series.
    per_expert_s = (len(ffn_kernels) + MOE_EXPERT_GATHER_SCATTER_OPS) * launch_s + per_expert_device_s
    shared_s = layer.num_shared_experts * expert_shard_time_s(device, expert, tokens, eager=True)
    return router_s + select_s + active * per_expert_s + shared_s


def _check_tokens_shards(tokens: int, shards: float) -> None:
    if tokens < 0:
        raise WorkloadError(f"tokens must be >= 0, got {tokens}")
    if shards < 1:
        raise WorkloadError(f"shards must be >= 1, got {shards}")
