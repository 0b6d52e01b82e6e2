"""The bench's bound: :mod:`hw_model.bound` over a whole routing trace, with the GPU pool filled for free.

The trace is cut into phases: the prefill, then the decode tokens between phase starts (a synthetic trace's domain
shift starts a new phase). Two bounds of the expert latency:

- **causal**: each decode phase runs with the shared GPU pool holding, for free, the (layer, expert) pairs a token
  of that phase most likely selects (as many as fit, most likely first). On a trace that says what it was drawn
  from (a synthetic trace's :class:`~hw_model.traces.TraceDistribution`, with no temporal locality), those are the
  largest popularity weights: tokens are independent draws, so no policy that cannot see future routing can expect
  more hits than a pool holding them, known from the phase's first token on. Otherwise (a trace from a file or a
  capture, or temporal locality), the phase's own most-used pairs: the best estimate of the most likely ones, and
  optimistic by the phase's sampling noise (the realized counts favour the experts its tokens happened to pick:
  3-4 % lower on the bench's Qwen3 and DeepSeek traces than the weights' pool, docs/bench.md).
- **foresight**: the pool refilled for free every ``window`` decode tokens with the experts of that window
  (perfect knowledge of the routing ahead at the prefetcher's re-plan granularity, copies free).

The prefill is bounded by one joint program over all its layers (:func:`hw_model.bound.joint_bound_s`). A request
that starts cold (the bench's: a session's first request) finds no expert in the GPU pool, so the prefill's GPU
work runs from copies; a warm one (``cold_start=False``: a later request of a session) may find any fractions of its
experts resident as long as they fit the pool together. The non-expert work is the same for every policy: the bench
adds it to both (``docs/bench.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hw_model.bound import Invocation, bound_context, invocation_bound_s, joint_bound_s, whole_floor_s
from hw_model.models import ModelConfig
from hw_model.run_context import RunContext
from hw_model.settings import SimulationSettings
from hw_model.simulator import MoESimulator
from hw_model.traces import RoutingTrace

DEFAULT_FORESIGHT_WINDOW = 32  # decode tokens between the foresight bound's free refills (the prefetcher's interval)

__all__ = [
    "DEFAULT_FORESIGHT_WINDOW",
    "PoolFill",
    "TraceBound",
    "bound_fields",
    "likely_selections",
    "phase_residency",
    "trace_bound",
]


@dataclass(frozen=True)
class TraceBound:
    """Bounds of one trace's expert latency, seconds: the prefill's (shared by both), the decode's under the causal
    oracle and under perfect foresight; how many distinct programs were solved."""

    prefill_s: float
    decode_causal_s: float
    decode_foresight_s: float
    programs_solved: int

    @property
    def causal_s(self) -> float:
        return self.prefill_s + self.decode_causal_s

    @property
    def foresight_s(self) -> float:
        return self.prefill_s + self.decode_foresight_s


def phase_residency(counts: np.ndarray, expert_bytes: Sequence[float], pool_bytes: float) -> list[set[int]]:
    """Per layer, the experts the pool holds: the (layer, expert) pairs ranked highest by ``counts``
    (``[layers, experts]``: one phase's selections, or how likely a token selects each pair), in that order (ties:
    lower layer, then lower expert), while their bytes fit ``pool_bytes`` (one that does not fit is passed over);
    pairs ranked 0 (never selected) are left out."""
    layers, width = counts.shape
    flat = counts.ravel()
    chosen: list[set[int]] = [set() for _ in range(layers)]
    left = pool_bytes
    for cell in np.argsort(-flat, kind="stable").tolist():
        if flat[cell] <= 0:
            break
        size = expert_bytes[cell // width]
        if size <= left:
            left -= size
            chosen[cell // width].add(cell % width)
    return chosen


class _Memo:
    """Invocation bounds memoised by what they depend on: per family, the layer's class and the active experts'
    (tokens, resident[, home unit]) in a canonical order."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.tp: dict[tuple, float] = {}
        self.whole: dict[tuple, float] = {}
        self.solved = 0

    def bound_s(self, layer_index: int, active: list[int], tokens: list[int], resident: list[bool]) -> float:
        ctx = self.ctx
        layer_class = ctx.layer_classes[layer_index]
        tp_key = (layer_class, tuple(sorted(zip(tokens, resident, strict=True))))
        tp = self.tp.get(tp_key)
        if tp is None:
            inv = Invocation(layer_index, tuple(active), tuple(tokens))
            tp = self.tp[tp_key] = invocation_bound_s(ctx, inv, resident, ("tp",)).latency_s
            self.solved += 1
        units = ctx.system.num_ndp_units
        if units == 0:
            return tp
        homes = [e % units for e in active]
        whole_key = (layer_class, tuple(sorted(zip(tokens, resident, homes, strict=True))))
        value = self.whole.get(whole_key)  # the least of both families (tp's value is the same for the whole key)
        if value is None:
            inv = Invocation(layer_index, tuple(active), tuple(tokens))
            value = tp
            if whole_floor_s(ctx, inv, resident) < tp:
                value = min(tp, invocation_bound_s(ctx, inv, resident, ("whole",)).latency_s)
                self.solved += 1
            self.whole[whole_key] = value
        return value


def likely_selections(trace: RoutingTrace, start: int, stop: int, layers: int) -> np.ndarray | None:
    """``[layers, experts]``, ranking the (layer, expert) pairs by how likely a token of ``start..stop-1`` selects
    them, when the trace says so: its distribution's weights for those tokens (one phase, no temporal locality;
    within a layer a larger weight is a likelier pick, and every layer draws from a permutation of the same
    weights, so the ranking holds across layers too). None otherwise."""
    distribution = trace.distribution
    if distribution is None or distribution.locality > 0 or stop <= start:
        return None
    weights = distribution.phase_weights(start, stop)
    return None if weights is None else weights[:layers]


def _step_bound_s(memo: _Memo, step: np.ndarray, resident: list[set[int]]) -> float:
    """One decode step's bound (``step``: ``[layers, experts]`` tokens) with ``resident`` (per layer) in the pool."""
    total = 0.0
    for layer in range(step.shape[0]):
        row = step[layer]
        active = np.flatnonzero(row).tolist()
        if active:
            held = resident[layer]
            total += memo.bound_s(layer, active, row[active].tolist(), [e in held for e in active])
    return total


@dataclass(frozen=True)
class PoolFill:
    """How fast a cold pool can fill: no more bytes resident than ``bytes_per_s`` (the fastest a weight copy can read
    the DIMMs) times the time since the request started, ``elapsed_s`` at the decode's start (the prefill's bound)."""

    elapsed_s: float
    bytes_per_s: float


def _decode_bound_s(
    memo: _Memo,
    trace: RoutingTrace,
    layers: int,
    segments: list[tuple[int, int]],
    pool: float,
    *,
    foresight: bool,
    fill: PoolFill | None = None,
) -> float:
    """The decode's bound with the pool refilled at the start of each of ``segments`` (token ranges) with the
    experts its tokens most likely select (:func:`likely_selections`; where the trace cannot say, or with
    ``foresight``, the segment's most-used).

    With ``fill``, the pool holds, of those, only as many as the copies so far can have brought: at a step that
    starts ``c`` seconds into the request, a policy that ends it at ``x`` has held at most ``bytes_per_s * x``
    bytes during it, so the step lasts at least ``f(bytes_per_s * x)`` (``f``: the step's bound with that many
    bytes of the ranking resident, non-increasing). The least ``x`` with ``x >= c + f(bytes_per_s * x)`` is at
    least ``c + f(bytes_per_s * x0)`` for ``x0 = c + f(bytes_per_s * c)`` (``x0`` is such an ``x``), so each step
    is bounded by that, and by induction over the steps no policy reaches a step earlier than the bound does (the
    non-expert time left out of the elapsed time: smaller budgets, a looser but valid bound)."""
    ctx = memo.ctx
    expert_bytes = list(ctx.expert_bytes)
    total = 0.0
    elapsed = fill.elapsed_s if fill is not None else 0.0
    for start, stop in segments:
        likely = None if foresight else likely_selections(trace, start, stop, layers)
        if likely is None:
            likely = np.stack([trace.counts(layer, start, stop) for layer in range(layers)])
        resident = phase_residency(likely, expert_bytes, pool)
        needed = sum(len(experts) * expert_bytes[layer] for layer, experts in enumerate(resident))
        for step in trace.tokens_counts(start, stop, layers):  # [tokens, layers, experts]
            if fill is None or fill.bytes_per_s * elapsed >= needed:
                seconds = _step_bound_s(memo, step, resident)
            else:
                early = _step_bound_s(memo, step, phase_residency(likely, expert_bytes, fill.bytes_per_s * elapsed))
                budget = fill.bytes_per_s * (elapsed + early)
                seconds = _step_bound_s(memo, step, phase_residency(likely, expert_bytes, min(budget, pool)))
            total += seconds
            elapsed += seconds
    return total


def trace_bound(
    sim: MoESimulator,
    trace: RoutingTrace,
    phase_starts: Sequence[int] = (),
    foresight_window: int = DEFAULT_FORESIGHT_WINDOW,
    *,
    cold_start: bool = True,
) -> TraceBound:
    """The causal and foresight bounds of ``trace``'s expert latency on ``sim``'s system, layers and GPU pool (the
    whole pool, residency and staging together). ``phase_starts``: token indices (inside the decode) where a new
    routing phase starts. ``cold_start``: the pool holds no expert when the request starts (False: the prefill may
    find any of its experts resident, as a warm session's later request can)."""
    ctx = bound_context(sim.context)
    layers = len(sim.layers)
    pool = sim.gpu_pool_bytes
    prompt, end = trace.prompt_tokens, trace.num_tokens
    prefill_counts = trace.prefill_step_counts(layers)
    invocations = []
    for layer in range(layers):
        row = prefill_counts[layer]
        active = np.flatnonzero(row).tolist()
        if active:
            invocations.append(Invocation(layer, tuple(active), tuple(row[active].tolist())))
    prefill_s = joint_bound_s(ctx, invocations, 0.0 if cold_start else pool).latency_s if invocations else 0.0
    memo = _Memo(ctx)
    cuts = sorted({prompt, end, *[s for s in phase_starts if prompt < s < end]})
    phases = list(zip(cuts[:-1], cuts[1:], strict=True))
    fill = None
    if cold_start:
        units = ctx.system.num_ndp_units
        fill = PoolFill(prefill_s, ctx.costs.copy_bandwidth(units))  # 0 units: PCIe alone
    causal_s = _decode_bound_s(memo, trace, layers, phases, pool, foresight=False, fill=fill)
    windows = []
    for start, stop in phases:
        windows += [(s, min(s + foresight_window, stop)) for s in range(start, stop, foresight_window)]
    foresight_s = _decode_bound_s(memo, trace, layers, windows, pool, foresight=True)
    return TraceBound(prefill_s, causal_s, foresight_s, memo.solved + 2)


def bound_fields(
    model: ModelConfig,
    settings: SimulationSettings,
    trace: RoutingTrace,
    phase_starts: Sequence[int] = (),
    *,
    cold_start: bool = True,
) -> TraceBound:
    """:func:`trace_bound` of ``model``'s experts on ``settings``' system over ``trace``, the GPU pool what the bench
    leaves for experts (the non-expert weights and the KV cache of the whole trace reserved, as ``run_job`` does)."""
    reserved = model.non_expert_weight_bytes() + model.kv_cache_bytes(trace.num_tokens)
    sim = MoESimulator.from_settings(settings, model.moe_layer_shapes(), gpu_reserved_bytes=reserved)
    return trace_bound(sim, trace, phase_starts, cold_start=cold_start)
