"""The cost model's form: roofline + fixed costs, tile padding, reduction length, eager and MoE-layer host costs."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from hw_model.cost import (
    GATED_EXPERT_EAGER_OPS,
    GATED_EXPERT_KERNELS,
    eager_time_s,
    expected_active_experts,
    expert_shard_kernels,
    expert_shard_time_s,
    gemm_efficiency,
    gemm_time_s,
    kernel_time_s,
    moe_layer_eager_time_s,
)
from hw_model.errors import WorkloadError
from hw_model.hardware import load_system
from hw_model.workload import ExpertShape, MoELayerShape


@pytest.fixture(scope="module")
def h200_gpu():
    return load_system("h200").gpu


def test_kernel_time_is_fixed_cost_plus_the_slower_roof(h200_gpu):
    # h200 preset by hand: 1.5 us per kernel, 4.8 TB/s x 0.8805, 989.4 TFLOP/s x 0.8281 (bf16)
    memory_bound = kernel_time_s(h200_gpu, flops=1e6, bytes_moved=1e9, dtype="bf16", kernels=2)
    assert memory_bound == pytest.approx(2 * 1.5e-6 + 1e9 / (4.8e12 * 0.8805))
    compute_bound = kernel_time_s(h200_gpu, flops=1e15, bytes_moved=1e3, dtype="bf16")
    assert compute_bound == pytest.approx(1.5e-6 + 1e15 / (989.4e12 * 0.8281))


def test_single_row_product_by_hand(h200_gpu):
    # [1, 4096] @ [4096, 4096] bf16 streams the weight: (4096*4096 + 2*4096) * 2 bytes at 4.8 TB/s x 0.8805,
    # plus 1.5 us and 0.3 us per doubling of K = 4096 (12 doublings)
    expected = 1.5e-6 + 0.3e-6 * 12 + (4096 * 4096 + 2 * 4096) * 2 / (4.8e12 * 0.8805)
    assert gemm_time_s(h200_gpu, 1, 4096, 4096, "bf16", 2) == pytest.approx(expected)
    # int4 weights with fp16 scales every 32: the weight term shrinks to 0.5625 byte per element
    quantized = 1.5e-6 + 0.3e-6 * 12 + (4096 * 4096 * 0.5625 + 2 * 4096 * 2) / (4.8e12 * 0.8805)
    assert gemm_time_s(h200_gpu, 1, 4096, 4096, "bf16", 2, weight_bytes=0.5625) == pytest.approx(quantized)


def test_achievable_rates_scale_the_vendor_peaks(h200_gpu):
    gpu = h200_gpu
    assert gpu.achievable_bandwidth_bytes_per_s == pytest.approx(4.8e12 * 0.8805)
    # the derived fraction reproduces the measured 8192^3 ceiling (782.6 TFLOPS) once K-efficiency is applied
    ceiling = gpu.achievable_flops_per_s("bf16") * gemm_efficiency(gpu, 8192)
    assert ceiling == pytest.approx(782.6e12, rel=2e-3)


def test_single_row_product_is_not_padded_but_small_batches_are(h200_gpu):
    # a compute-bound device (huge bandwidth) isolates the FLOP term
    gpu = replace(h200_gpu, memory_bandwidth_bytes_per_s=1e18, reduction_latency_s=0.0, kernel_overhead_s=0.0)
    one = gemm_time_s(gpu, 1, 4096, 4096, "fp32", 4)
    two = gemm_time_s(gpu, 2, 4096, 4096, "fp32", 4)
    sixty_four = gemm_time_s(gpu, 64, 4096, 4096, "fp32", 4)
    sixty_five = gemm_time_s(gpu, 65, 4096, 4096, "fp32", 4)
    assert two == pytest.approx(64 * one)  # M=2 is padded to a 64-row tile, M=1 runs as a vector product
    assert sixty_four == pytest.approx(two)
    assert sixty_five == pytest.approx(2 * sixty_four)


def test_fixed_cost_of_a_product_grows_with_log_of_reduction_length(h200_gpu):
    gpu = h200_gpu
    tiny_short = gemm_time_s(gpu, 1, 8, 1024, "bf16", 2)
    tiny_long = gemm_time_s(gpu, 1, 8, 4096, "bf16", 2)
    assert tiny_long - tiny_short == pytest.approx(2 * gpu.reduction_latency_s, rel=0.05)


def test_zero_sized_product_costs_nothing(h200_gpu):
    assert gemm_time_s(h200_gpu, 0, 10, 10, "bf16", 2) == 0.0


def test_gated_shard_is_four_graph_kernels_and_five_eager_ops(h200_gpu):
    expert = ExpertShape(hidden=1024, ffn=512)
    graph = expert_shard_kernels(h200_gpu, expert, tokens=1)
    eager = expert_shard_kernels(h200_gpu, expert, tokens=1, fused_activation=False)
    assert [k.name for k in graph] == ["gate", "up", "silu_mul", "down"]
    assert len(graph) == GATED_EXPERT_KERNELS and len(eager) == GATED_EXPERT_EAGER_OPS
    assert expert_shard_time_s(h200_gpu, expert, 1) == pytest.approx(sum(k.time_s for k in graph))


def test_plain_expert_has_three_kernels(h200_gpu):
    kernels = expert_shard_kernels(h200_gpu, ExpertShape(hidden=512, ffn=1024, gated=False), tokens=4)
    assert [k.name for k in kernels] == ["fc1", "activation", "down"]


def test_shard_time_grows_with_tokens_and_shrinks_with_shards(h200_gpu):
    expert = ExpertShape(hidden=4096, ffn=14336)
    by_tokens = [expert_shard_time_s(h200_gpu, expert, t) for t in (1, 8, 64, 512, 4096)]
    assert by_tokens == sorted(by_tokens)
    by_shards = [expert_shard_time_s(h200_gpu, expert, 1, s) for s in (1, 2, 4, 8)]
    assert by_shards == sorted(by_shards, reverse=True)
    # the fixed cost does not shrink with sharding: 4 shards cost more than a quarter of the whole expert
    assert by_shards[2] > by_shards[0] / 4 * 1.3


def test_large_single_token_expert_is_memory_bound_near_the_copy_ceiling(h200_gpu):
    expert = ExpertShape(hidden=4096, ffn=14336)
    time_s = expert_shard_time_s(h200_gpu, expert, 1)
    streaming_s = expert.weight_bytes() / h200_gpu.achievable_bandwidth_bytes_per_s
    assert streaming_s < time_s < 1.25 * streaming_s


def test_eager_costs_at_least_the_host_launches_and_the_device_time(h200_gpu):
    gpu = h200_gpu
    assert eager_time_s(gpu, 1e-6, 5) == pytest.approx(5 * gpu.launch_overhead_eager_s)
    assert eager_time_s(gpu, 1e-3, 5) == pytest.approx(gpu.launch_overhead_eager_s + 1e-3)
    expert = ExpertShape(hidden=2048, ffn=1024)
    assert expert_shard_time_s(gpu, expert, 8, eager=True) > expert_shard_time_s(gpu, expert, 8)


def test_zero_tokens_cost_nothing_and_bad_counts_raise(h200_gpu):
    expert = ExpertShape(hidden=64, ffn=128)
    assert expert_shard_time_s(h200_gpu, expert, 0) == 0.0
    with pytest.raises(WorkloadError, match="shards"):
        expert_shard_kernels(h200_gpu, expert, 1, shards=0)
    with pytest.raises(WorkloadError, match="tokens"):
        expert_shard_kernels(h200_gpu, expert, -1)


def test_expected_active_experts_bounds():
    assert expected_active_experts(8, 2, 1) == pytest.approx(2.0)
    assert expected_active_experts(64, 8, 0) == 0.0
    many = expected_active_experts(64, 8, 1000)
    assert 63.99 < many <= 64


def test_moe_layer_pays_one_sync_per_expert_even_when_idle(h200_gpu):
    expert = ExpertShape(hidden=1024, ffn=1024)
    small = MoELayerShape("a", num_experts=8, top_k=2, expert=expert)
    wide = MoELayerShape("b", num_experts=64, top_k=2, expert=expert)
    extra_s = moe_layer_eager_time_s(h200_gpu, wide, 1) - moe_layer_eager_time_s(h200_gpu, small, 1)
    assert extra_s == pytest.approx(56 * (2 * h200_gpu.launch_overhead_eager_s + h200_gpu.sync_overhead_s))
    assert moe_layer_eager_time_s(h200_gpu, small, 0) == 0.0


def test_every_preset_gives_finite_positive_times():
    expert = ExpertShape(hidden=2048, ffn=768)
    for name in ("paper", "edge", "h200"):
        system = load_system(name)
        for device in (system.gpu, system.ndp_unit):
            for tokens in (1, 7, 128):
                value = expert_shard_time_s(device, expert, tokens, shards=2)
                assert math.isfinite(value) and value > 0


def test_ndp_unit_keeps_the_plain_roofline_form():
    unit = load_system("paper").ndp_unit
    expert = ExpertShape(hidden=2048, ffn=768)
    time_s = expert_shard_time_s(unit, expert, tokens=1, shards=4)
    bytes_moved = sum((2048 * 192 + 2048 + 192) * 2 for _ in range(3)) + 3 * 192 * 2
    # DDR4-3200 by hand: 2 ranks x 25.6 GB/s, refresh + precharge (550 + 13.75 ns) every 7.8 us lost;
    # per kernel 1 us control + tRCD + CL + tBL (13.75 + 13.75 + 2.5 ns)
    bandwidth = 2 * 25.6e9 * (1 - 563.75 / 7800)
    expected = 4 * (1e-6 + 30e-9) + bytes_moved / bandwidth
    assert time_s == pytest.approx(expected, rel=0.02)
