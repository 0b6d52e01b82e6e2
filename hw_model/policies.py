"""Placement policies as objects behind one small protocol, found in one registry.

A policy is a :class:`Policy` subclass registered with :func:`register`; the simulator and ``bench`` find
policies only through :func:`get_policy` / :func:`policy_names`, so adding one touches this file only. Each
declares its ``name``, ``role`` (``baseline``, ``ours``, ``ablation`` or ``bound``), whether it needs NDP
units, whether its NDP work is tensor-parallel, where expert weights live (``layout``), whether it keeps
experts resident in GPU memory, its source, and implements :meth:`Policy.place` over a per-run
:class:`PolicyState`.

=====================  ==============================================================================
``gpu-offload``        baseline (offloading systems, e.g. MoE-Infinity/ProMoE): every expert on the GPU;
                       the same dataset-free prefetcher as ours keeps experts resident, misses are copied
                       on demand into an LRU staging area (plain DIMMs, no NDP compute)
``ndp-expert-per-unit`` baseline: whole experts on NDP units, expert ``e`` on unit ``e mod N``; no GPU
``monde``              baseline, MoNDE (DAC 2024): whole experts on their home unit; each invocation moves
                       hot experts to the GPU, load-aware (the hottest expert of the busiest DIMM first),
                       as many as balance GPU and NDP time; no copy kept across invocations
``monde+cache``        ``monde`` keeping the experts it moves in an LRU GPU cache as large as our
                       residency budget; cached experts cost no copy and are considered first
``duplex``             baseline, Duplex-style (MICRO 2024): tensor parallelism inside the NDP device
                       (every expert sliced over all units); experts whose Op/B exceeds the NDP ridge point
                       run on the GPU (weights copied); no residency, no load-balancing scheduler
``tp``                 ablation: ``monde``'s GPU/NDP balancing rule with every NDP expert sliced over all
                       units (so ``tp`` vs ``monde`` isolates tensor parallelism; prefill uses the GPU)
``tp+lb``              ablation: tensor parallelism + the load-balancing packer (:mod:`hw_model.scheduler`)
``tp+lb+prefetch``     ours, complete: ``tp+lb`` + dataset-free prefetch (:mod:`hw_model.prefetch`)
``lower-bound``        bound: expert compute spread fractionally over the GPU and all NDP units with no
                       copies; the GPU side only for as many experts per layer as GPU memory holds
=====================  ==============================================================================

Weight layouts: ``sliced`` stores every expert as N column/row slices, slice ``u`` on unit ``u``, so a copy
to the GPU reads all N DIMMs in parallel; ``whole`` stores expert ``e`` on unit ``e mod N``, so its copy reads
one DIMM at that DIMM's channel bandwidth; ``host`` (plain DIMMs) interleaves weights over all DIMMs. Every
copy also takes DRAM time from the NDP cores of the DIMMs it reads (see :class:`ExpertCosts`).

Placements of ``tp+lb`` and ``tp+lb+prefetch`` are reused while the layer's exponentially smoothed
activation histogram stays within ``drift_threshold`` (L1) of the one the plan was made on; a reused plan
respects residency (resident active experts run on the GPU at no copy cost, others where the plan said).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import add, sub
from typing import Any, ClassVar

import numpy as np
from mypy_extensions import mypyc_attr

from hw_model.cost import expert_shard_time_s
from hw_model.errors import SettingsError
from hw_model.layout import InvocationLayout, LayoutState
from hw_model.prefetch import LIST_KEPT_CELLS, ExpertLRUCache, ExpertPrefetcher, PrefetchConfig
from hw_model.run_context import ExpertCosts, RunContext
from hw_model.scheduler import ItemMode, PlacementProblem, best_prefix_lists, makespan_s, pack, span_terms_s
from hw_model.timeline import LayerTimeline, TimelineEvent
from hw_model.workload import MoELayerShape

ROLES = ("baseline", "ours", "extension", "ablation", "bound")
LAYOUTS = ("sliced", "whole", "host", "dual")


def row_selector(layers: Sequence[int]) -> slice | Sequence[int]:
    """Index rows ``layers`` of a per-layer array: a slice (a view) when they are consecutive and ascending."""
    if isinstance(layers, range) and layers.step == 1:
        return slice(layers.start, layers.stop)
    first = layers[0]
    if layers == list(range(first, first + len(layers))):
        return slice(first, first + len(layers))
    return layers


class DriftTracker:
    """Per layer: the exponentially smoothed activation histogram, the one the current plan was made on, and
    the plan (the GPU set). :meth:`update` smooths several layers' histograms and records their L1 drift from the
    plans' (infinite where no plan was made yet).

    The histograms are arrays, updated for all the step's layers in one operation each; a small model's (at most
    :data:`~hw_model.prefetch.LIST_KEPT_CELLS` layers x experts, as a session's report simulates) are Python lists,
    updated by loops that compiled run faster than numpy's calls (``as_lists`` overrides the choice). Both compute
    the same values to the last bit: the same element operations, the drift summed in numpy's order
    (:func:`numpy_row_sum`)."""

    def __init__(self, num_layers: int, width: int, smoothing: float, *, as_lists: bool | None = None) -> None:
        self.smoothing = smoothing
        self._lists = num_layers * width <= LIST_KEPT_CELLS if as_lists is None else as_lists
        array_shape = (0, width) if self._lists else (num_layers, width)
        self.smoothed = np.zeros(array_shape)
        self.planned_on = np.zeros(array_shape)
        self._smoothed_rows: list[list[float]] = [[0.0] * width for _ in range(num_layers)] if self._lists else []
        self._planned_rows: list[list[float]] = [[0.0] * width for _ in range(num_layers)] if self._lists else []
        self.seen = np.zeros(num_layers, dtype=bool)
        self.has_plan = np.zeros(num_layers, dtype=bool)
        self.plans: list[frozenset[int]] = [frozenset()] * num_layers
        self._all_seen = False
        self._all_planned = False
        self._replanned: list[int] = []  # layers planned since the last update (see replan)
        self.drift: dict[int, float] = {}  # layer -> drift of its pending invocation (set by update)

    def update(self, layers: Sequence[int], counts: np.ndarray) -> None:
        """Smooth ``counts[i]`` (layer ``layers[i]``'s token counts) into the histograms; record each drift."""
        if self._lists:
            self._update_lists(layers, counts)
            return
        if self._replanned:  # their plans were made on the histograms as they are until now
            replanned = row_selector(self._replanned)
            self.planned_on[replanned] = self.smoothed[replanned]
            self._replanned.clear()
        alpha = self.smoothing
        totals = counts.sum(axis=1)
        np.maximum(totals, 1, out=totals)
        rows = row_selector(layers)
        smoothed = self.smoothed[rows]  # a view for a slice; fancy indexing copies (written back below)
        width = counts.shape[1]
        fresh = None if self._all_seen else ~self.seen[rows]
        # in place: (1 - alpha) * smoothed + alpha * histogram, the histogram being counts / total
        smoothed *= 1 - alpha
        smoothed[:, :width] += counts * (alpha / totals)[:, None]
        if fresh is not None and fresh.any():  # a layer's first invocation: its histogram as it is
            smoothed[fresh] = 0.0
            smoothed[fresh, :width] = counts[fresh] / totals[fresh, None]
        if not isinstance(rows, slice):
            self.smoothed[rows] = smoothed
        if not self._all_seen:
            self.seen[rows] = True
            self._all_seen = bool(self.seen.all())
        difference = smoothed - self.planned_on[rows]
        drift = np.abs(difference, out=difference).sum(axis=1)
        if not self._all_planned:
            drift[~self.has_plan[rows]] = np.inf
        self.drift.update(zip(layers, drift.tolist(), strict=True))

    def _update_lists(self, layers: Sequence[int], counts: np.ndarray) -> None:
        """:meth:`update` on the histograms kept as lists: the same operations, element by element."""
        smoothed_rows, planned_rows = self._smoothed_rows, self._planned_rows
        for layer in self._replanned:
            planned_rows[layer] = smoothed_rows[layer].copy()
        self._replanned.clear()
        alpha = self.smoothing
        keep = 1 - alpha
        rows: list[list[int]] = counts.tolist()
        drifts = self.drift
        for i in range(len(rows)):
            layer = layers[i]
            row = rows[i]
            width = len(row)
            total = 0
            for count in row:
                total += count
            if total < 1:
                total = 1
            smoothed = smoothed_rows[layer]
            if self._all_seen or self.seen[layer]:
                scale = alpha / total
                for j in range(width):
                    smoothed[j] = smoothed[j] * keep + row[j] * scale
                for j in range(width, len(smoothed)):
                    smoothed[j] = smoothed[j] * keep
            else:  # a layer's first invocation: its histogram as it is
                for j in range(width):
                    smoothed[j] = row[j] / total
                for j in range(width, len(smoothed)):
                    smoothed[j] = 0.0
                self.seen[layer] = True
            planned = planned_rows[layer]
            difference = [abs(smoothed[j] - planned[j]) for j in range(len(smoothed))]
            planned_yet = self._all_planned or bool(self.has_plan[layer])
            drifts[layer] = numpy_row_sum(difference, 0, len(difference)) if planned_yet else np.inf
        if not self._all_seen:
            self._all_seen = bool(self.seen.all())

    def replan(self, layer: int, gpu_set: frozenset[int]) -> None:
        """A plan was made for ``layer`` on its current smoothed histogram (noted now, copied at the next
        :meth:`update`, before the histograms change: one array operation for all the layers planned)."""
        self._replanned.append(layer)
        self.plans[layer] = gpu_set
        if not self._all_planned:
            self.has_plan[layer] = True
            self._all_planned = bool(self.has_plan.all())


def numpy_row_sum(values: list[float], start: int, count: int) -> float:
    """The sum of ``values[start : start + count]`` as numpy sums a row of float64 (``array.sum(axis=-1)``):
    pairwise, blocks of up to 128 summed by eight interleaved accumulators."""
    if count < 8:
        total = 0.0
        for i in range(start, start + count):
            total += values[i]
        return total
    if count <= 128:
        r0, r1, r2, r3 = values[start], values[start + 1], values[start + 2], values[start + 3]
        r4, r5, r6, r7 = values[start + 4], values[start + 5], values[start + 6], values[start + 7]
        i = start + 8
        end = start + count - count % 8
        while i < end:
            r0 += values[i]
            r1 += values[i + 1]
            r2 += values[i + 2]
            r3 += values[i + 3]
            r4 += values[i + 4]
            r5 += values[i + 5]
            r6 += values[i + 6]
            r7 += values[i + 7]
            i += 8
        total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < start + count:
            total += values[i]
            i += 1
        return total
    half = count // 2
    half -= half % 8
    return numpy_row_sum(values, start, half) + numpy_row_sum(values, start + half, count - half)


@dataclass
class PolicyState(LayoutState):
    """Mutable per-run state of a policy: residency (prefetcher / LRU), cached plans, counters (and the layouts'
    memos, :class:`~hw_model.layout.LayoutState`)."""

    prefetcher: ExpertPrefetcher | None = None
    lru: ExpertLRUCache | None = None
    histograms: dict[str, DriftTracker] = field(default_factory=dict)  # per phase
    pack_memo: dict[tuple, Any] = field(default_factory=dict)  # packer and balancing-rule decisions
    recomputations: int = 0
    reuses: int = 0
    decode_recomputations: int = 0
    decision_times_s: list[float] = field(default_factory=list)
    staged_ahead: dict[int, set[int]] = field(default_factory=dict)


@mypyc_attr(allow_interpreted_subclasses=True)  # a policy defined outside this module works compiled too
class Policy(ABC):
    """The protocol every policy implements (see the module docstring)."""

    name: ClassVar[str]
    role: ClassVar[str]
    description: ClassVar[str]
    source: ClassVar[str] = ""
    needs_ndp: ClassVar[bool] = True
    tensor_parallel: ClassVar[bool] = False
    layout: ClassVar[str] = "whole"
    keeps_residents: ClassVar[bool] = False
    lookahead: ClassVar[bool] = False

    def new_state(self, ctx: RunContext) -> PolicyState:
        """Fresh per-run state (called once per simulator)."""
        return PolicyState()

    def begin_step(
        self, ctx: RunContext, state: PolicyState, layers: Sequence[int], counts: np.ndarray, phase: str
    ) -> None:
        """Called before the invocations of ``layers`` (in that order, ``counts[i]`` for ``layers[i]``): work
        a policy can do for all of them at once. Default: nothing."""
        return None

    @abstractmethod
    def place(self, ctx: RunContext, state: PolicyState, out: InvocationLayout, phase: str) -> None:
        """Place one invocation's active experts (``out.active``, with ``out.active_tokens`` tokens each): record
        a decision for each on ``out`` and finish it (:meth:`InvocationLayout.finish`)."""

    def copy_sources(self, units: int) -> int:
        """How many DIMMs one expert's copy reads in parallel under this policy's weight layout."""
        if units == 0:
            return 0
        return 1 if self.layout == "whole" else units


_REGISTRY: dict[str, Policy] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Validate a policy's declaration and add an instance to the registry (usable as a class decorator)."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__name__} must declare a non-empty name")
    if name in _REGISTRY:
        raise TypeError(f"policy {name!r} registered twice")
    if getattr(cls, "role", None) not in ROLES:
        raise TypeError(f"policy {name!r}: role must be one of {ROLES}")
    if cls.layout not in LAYOUTS:
        raise TypeError(f"policy {name!r}: layout must be one of {LAYOUTS}")
    _REGISTRY[name] = cls()
    return cls


def get_policy(name: str) -> Policy:
    """The registered policy ``name``; unknown names raise :class:`SettingsError` listing the known ones (the one
    check of a policy's name, which :class:`hw_model.settings.SimulationSettings` makes)."""
    policy = _REGISTRY.get(name)
    if policy is None:
        raise SettingsError(f"unknown policy {name!r} (known: {', '.join(_REGISTRY)})", "policy")
    return policy


def policy_names(role: str | None = None) -> tuple[str, ...]:
    """Registered policy names in registration order, optionally only those of one ``role``."""
    return tuple(name for name, p in _REGISTRY.items() if role is None or p.role == role)


def load_aware_order(ndp: np.ndarray, tokens: np.ndarray, resident: np.ndarray) -> np.ndarray:
    """MoNDE's order of moving experts to the GPU: resident ones first (no copy), hottest first; then,
    repeatedly, the hottest remaining expert of the currently busiest unit (ties: lower index). ``ndp`` is
    experts x units NDP time; the order is of row indices."""
    order = _load_aware_order(ndp.tolist(), tokens.tolist(), resident.tolist(), ndp.shape[1])
    return np.asarray(order, dtype=np.int64)


def _load_aware_order(loads: list[list[float]], heat: list[int], res: list[bool], units: int) -> list[int]:
    """:func:`load_aware_order` over plain lists (what the balancing rule calls: a decode invocation has a
    handful of experts, where numpy's per-call cost would dominate)."""
    n = len(heat)
    order = sorted((i for i in range(n) if res[i]), key=lambda i: -heat[i])
    left = [i for i in range(n) if not res[i]]  # ascending, so the first of equal heat is the lower index
    load = [0.0] * units
    for i in left:
        load = list(map(add, load, loads[i]))
    while left:
        pool = left
        if units:
            busiest = load.index(max(load))
            pool = [i for i in left if loads[i][busiest] > 0] or left
        pick = max(pool, key=heat.__getitem__)  # the first of the hottest: the lowest index
        order.append(pick)
        left.remove(pick)
        load = list(map(sub, load, loads[pick]))
    return order


# -- the policies ---------------------------------------------------------------------------------------


class GpuOffload(Policy):
    name = "gpu-offload"
    role = "baseline"
    description = (
        "every expert on the GPU; the same dataset-free prefetcher as ours keeps experts resident, misses are "
        "copied on demand into an LRU staging area (plain DIMMs, no NDP compute)"
    )
    source = "expert-offloading systems (MoE-Infinity, ProMoE, HOBBIT); ../shared/reference/hardware.md"
    needs_ndp = False
    layout = "host"
    keeps_residents = True

    def new_state(self, ctx: RunContext) -> PolicyState:
        return PolicyState(prefetcher=_prefetcher(ctx), lru=ExpertLRUCache(ctx.staging_cap_bytes))

    def place(self, ctx: RunContext, state: PolicyState, out: InvocationLayout, phase: str) -> None:
        prefetcher, lru = state.prefetcher, state.lru
        assert prefetcher is not None and lru is not None
        layer_index = out.layer_index
        prefetched, cached = prefetcher.resident_sets[layer_index], lru.experts_of(layer_index)
        on_the_gpu = [(e, e in prefetched or e in cached) for e in out.active]
        for (e, resident), tokens in zip(on_the_gpu, out.active_tokens, strict=True):
            out.to_gpu(e, tokens, resident)
        _keep_copies(state, layer_index, on_the_gpu, ctx.expert_bytes[layer_index])
        out.finish()


class NdpExpertPerUnit(Policy):
    name = "ndp-expert-per-unit"
    role = "baseline"
    description = "whole experts on NDP units, expert e on unit e mod N; no GPU, no tensor parallelism"
    source = "the NDP-only design point of NDP-DIMM papers (Hermes, HPCA 2025)"

    def place(self, ctx: RunContext, state: PolicyState, out: InvocationLayout, phase: str) -> None:
        out.whole_on_units(out.active, out.active_tokens)
        out.finish()


class _Balanced(Policy):
    """MoNDE's rule: move experts to the GPU in load-aware order, as many as balance GPU and NDP time."""

    def place(self, ctx: RunContext, state: PolicyState, out: InvocationLayout, phase: str) -> None:
        layer_index = out.layer_index
        resident = self._resident(state, layer_index, out.active)
        chosen = self._moved(ctx, state, out, resident)
        weight_bytes = ctx.expert_bytes[layer_index]
        on_ndp: list[int] = []
        ndp_tokens: list[int] = []
        for e, tokens, res in zip(out.active, out.active_tokens, resident, strict=True):
            if e in chosen:
                out.to_gpu(e, tokens, res)
                self._keep(state, layer_index, e, weight_bytes)
            else:
                on_ndp.append(e)
                ndp_tokens.append(tokens)
        out.on_ndp(on_ndp, ndp_tokens)
        out.extra["resident_selected"] = float(sum(resident))
        out.finish()

    def _moved(self, ctx: RunContext, state: PolicyState, out: InvocationLayout, resident: list[bool]) -> set[int]:
        """The active experts this rule moves to the GPU, memoised (a pure speed-up: the choice is identical).

        The rule sees each expert only through its tokens, its home unit (whole layouts) and its residency, and
        among equal ones takes the lowest id first; resident experts go first, hottest first, equal heat in id
        order. So the choice is a function of the resident experts' (tokens, home) in that order and of how many
        non-resident experts share each (tokens, home): memoised by that signature as, per resident expert,
        whether it moves and, per group, how many of its lowest ids move. A choice that does not take a group's
        lowest ids is not memoised."""
        ids = out.active
        tokens = out.active_tokens
        units = out.units
        homes = [0] * len(ids) if self.tensor_parallel or not units else [e % units for e in ids]
        groups: dict[tuple[int, int], list[int]] = {}  # (tokens, home) of non-resident experts -> ids, ascending
        first: list[tuple[int, int, int]] = []  # resident (tokens, home, id), hottest first, then by id
        for e, t, h, r in zip(ids, tokens, homes, resident, strict=True):
            if r:
                first.append((t, h, e))
            else:
                members = groups.get((t, h))
                if members is None:
                    groups[t, h] = [e]
                else:
                    members.append(e)
        if first:
            first.sort(key=lambda item: -item[0])
        key = (
            ctx.layer_classes[out.layer_index],
            tuple([item[:2] for item in first]),
            tuple(sorted([(group, len(members)) for group, members in groups.items()])),
        )
        memo = state.pack_memo.get(key)
        if memo is None:
            items = out.item_lists(ids, tokens, resident)
            started = time.perf_counter()
            order = _load_aware_order(items["ndp"], tokens, resident, units)
            result_s, result_pcie_s = out.result_s()
            # best_prefix of _placement_problem's problem, on the lists (same answer, no numpy per-call cost)
            base = [out.activation_s()] * units
            k = best_prefix_lists(items, order, base, ctx.staging_cap_bytes, result_s, result_pcie_s, True, True)
            state.decision_times_s.append(time.perf_counter() - started)
            chosen = {ids[i] for i in order[:k]}
            moved = {group: sum(e in chosen for e in members) for group, members in groups.items()}
            if all(set(members[: moved[group]]) == chosen.intersection(members) for group, members in groups.items()):
                if len(state.pack_memo) > 200_000:
                    state.pack_memo.clear()
                state.pack_memo[key] = (tuple(item[2] in chosen for item in first), moved)
            return chosen
        first_moves, moved = memo
        chosen = {item[2] for item, moves in zip(first, first_moves, strict=True) if moves}
        for group, members in groups.items():
            chosen.update(members[: moved[group]])
        return chosen

    def _resident(self, state: PolicyState, layer_index: int, active: list[int]) -> list[bool]:
        """Per active expert, whether its weights are on the GPU already."""
        return [False] * len(active)

    def _keep(self, state: PolicyState, layer_index: int, e: int, weight_bytes: float) -> None:
        return None


class Monde(_Balanced):
    name = "monde"
    role = "baseline"
    description = (
        "MoNDE: whole experts on their home unit; each invocation moves hot experts to the GPU, the hottest "
        "expert of the busiest DIMM first, as many as balance GPU and NDP time; no copy kept"
    )
    source = "MoNDE (DAC 2024, arXiv 2405.18832)"


class MondeCache(_Balanced):
    name = "monde+cache"
    role = "baseline"
    description = "monde + an LRU GPU cache of the experts it moved, as large as our residency budget"
    source = "MoNDE (DAC 2024) with the GPU cache of offloading systems (e.g. Fiddler, MoE-Infinity)"
    keeps_residents = True

    def new_state(self, ctx: RunContext) -> PolicyState:
        return PolicyState(lru=ExpertLRUCache(ctx.residency_cap_bytes))

    def _resident(self, state: PolicyState, layer_index: int, active: list[int]) -> list[bool]:
        assert state.lru is not None
        cached = state.lru.experts_of(layer_index)
        return [e in cached for e in active]

    def _keep(self, state: PolicyState, layer_index: int, e: int, weight_bytes: float) -> None:
        assert state.lru is not None
        state.lru.use((layer_index, e), weight_bytes)


class Duplex(Policy):
    name = "duplex"
    role = "baseline"
    description = (
        "Duplex-style: every expert sliced over all NDP units (tensor parallelism inside the NDP device); "
        "experts whose Op/B exceeds the NDP ridge point run on the GPU (weights copied), hottest first"
    )
    source = "Duplex (MICRO 2024, arXiv 2409.01141): Op/B-based split between xPU and Logic-PIM"
    tensor_parallel = True
    layout = "sliced"

    def place(self, ctx: RunContext, state: PolicyState, out: InvocationLayout, phase: str) -> None:
        costs = ctx.costs
        expert = out.layer.expert
        weight_bytes = ctx.expert_bytes[out.layer_index]
        staged = 0.0
        on_ndp: list[int] = []
        ndp_tokens: list[int] = []
        hottest_first = sorted(zip(out.active, out.active_tokens, strict=True), key=lambda item: -item[1])  # stable
        for e, tokens in hottest_first:
            if costs.beyond_ndp_ridge(expert, tokens) and staged + weight_bytes <= ctx.staging_cap_bytes:
                out.to_gpu(e, tokens, resident=False)
                staged += weight_bytes
            else:
                on_ndp.append(e)
                ndp_tokens.append(tokens)
        out.sliced(on_ndp, ndp_tokens)
        out.finish()


class TensorParallel(_Balanced):
    name = "tp"
    role = "ablation"
    description = (
        "ours, tensor parallelism only: monde's GPU/NDP balancing rule, every NDP expert sliced over all units "
        "(gate/up by columns, down by rows), partial sums reduced"
    )
    source = "arXiv 2601.03992 (tensor parallelism across NDP-DIMMs)"
    tensor_parallel = True
    layout = "sliced"


class TensorParallelLoadBalanced(Policy):
    name = "tp+lb"
    role = "ablation"
    description = "tp + the load-balancing packer moving whole experts to the GPU where the layer ends sooner"
    source = "arXiv 2601.03992 (load-balancing-aware scheduler)"
    tensor_parallel = True
    layout = "sliced"

    def _resident(self, state: PolicyState, layer_index: int, active: list[int]) -> list[bool]:
        """Per active expert, whether its weights are on the GPU already."""
        return [False] * len(active)

    def begin_step(
        self, ctx: RunContext, state: PolicyState, layers: Sequence[int], counts: np.ndarray, phase: str
    ) -> None:
        tracker = state.histograms.get(phase)
        if tracker is None:
            width = max(layer.num_experts for layer in ctx.layers)
            tracker = state.histograms[phase] = DriftTracker(len(ctx.layers), width, ctx.tuning.drift_smoothing)
        tracker.update(layers, counts)

    def place(self, ctx: RunContext, state: PolicyState, out: InvocationLayout, phase: str) -> None:
        layer_index = out.layer_index
        resident = self._resident(state, layer_index, out.active)
        on_gpu, _ = _scheduled_gpu_set(ctx, state, out, resident, phase)
        out.extra["resident_selected"] = float(sum(resident))
        on_the_gpu = out.gpu_or_sliced(on_gpu, resident)
        if on_the_gpu:
            _keep_copies(state, layer_index, on_the_gpu, ctx.expert_bytes[layer_index])


class Ours(TensorParallelLoadBalanced):
    name = "tp+lb+prefetch"
    role = "ours"
    description = (
        "tp+lb + dataset-free prefetch of frequently selected experts into GPU memory (the complete framework)"
    )
    source = "arXiv 2601.03992 (dataset-free prefetching)"
    keeps_residents = True

    def new_state(self, ctx: RunContext) -> PolicyState:
        # the staging area keeps its copies, least recently used out first, as gpu-offload's does
        return PolicyState(prefetcher=_prefetcher(ctx), lru=ExpertLRUCache(ctx.staging_cap_bytes))

    def _resident(self, state: PolicyState, layer_index: int, active: list[int]) -> list[bool]:
        assert state.prefetcher is not None and state.lru is not None
        prefetched = state.prefetcher.resident_sets[layer_index]
        cached = state.lru.experts_of(layer_index)
        if not cached:
            return [e in prefetched for e in active]
        return [e in prefetched or e in cached for e in active]


class OursLookahead(Ours):
    name = "tp+lb+prefetch+lookahead"
    role = "extension"
    description = (
        "ours + look-ahead prefetch: while layer l runs, the experts predicted for layer l+1 are copied into "
        "the staging area in idle PCIe time and run there at no copy cost if the prediction was right"
    )
    source = "pre-gating systems (Pre-gated MoE, ISCA 2024; AdapMoE); predictor accuracy is a stated knob"
    lookahead = True

    def _resident(self, state: PolicyState, layer_index: int, active: list[int]) -> list[bool]:
        resident = super()._resident(state, layer_index, active)
        staged = state.staged_ahead.pop(layer_index, None)
        if staged:
            resident = [r or e in staged for e, r in zip(active, resident, strict=True)]
        return resident


class OursSplit(Ours):
    name = "tp+lb+prefetch+split"
    role = "extension"
    description = (
        "ours + splitting one expert between GPU and NDP: after the packer, the NDP expert with the most tokens "
        "runs 1/k of its FFN columns on the GPU (that part of its weights copied) and the rest sliced over the "
        "units, with k in 2..8 chosen to end the layer soonest (only when it does)"
    )
    source = "issue 13 (beyond arXiv 2601.03992): GPU/NDP split of one expert"

    def place(self, ctx: RunContext, state: PolicyState, out: InvocationLayout, phase: str) -> None:
        layer_index = out.layer_index
        resident = self._resident(state, layer_index, out.active)
        gpu_flags, planned = _scheduled_gpu_set(ctx, state, out, resident, phase)
        on_gpu = set(planned) if planned is not None else {e for e, g in zip(out.active, gpu_flags, strict=True) if g}
        split = _best_split(ctx, out, resident, [e in on_gpu for e in out.active])
        for e, tokens, res in zip(out.active, out.active_tokens, resident, strict=True):
            if e in on_gpu:
                out.to_gpu(e, tokens, res)
                _keep_copies(state, layer_index, [(e, res)], ctx.expert_bytes[layer_index])
            elif split is not None and e == out.active[split[0]]:
                out.split(e, tokens, split[1])
            else:
                out.sliced([e], [tokens])
        out.extra["resident_selected"] = float(sum(resident))
        out.extra["split_parts"] = float(split[1]) if split is not None else 0.0
        out.finish()


def _keep_copies(state: PolicyState, layer_index: int, experts: list[tuple[int, bool]], weight_bytes: float) -> None:
    """``experts`` (``(expert, resident)`` pairs, ``weight_bytes`` each) ran on the GPU: a copy made for one (not
    resident) is adopted by the prefetcher when its plan wants the expert, or else kept in the LRU staging area
    until its space is needed. A resident expert the prefetcher holds stays out of the staging area (it was not
    copied); one resident in the staging area is touched there."""
    prefetcher, lru = state.prefetcher, state.lru
    if prefetcher is None:
        if lru is not None:
            lru.use_all([(layer_index, e) for e, _ in experts], weight_bytes)
        return
    held = prefetcher.resident_sets[layer_index]  # grows as copies are adopted, so tested before adopting
    staged = [
        (layer_index, e)
        for e, resident in experts
        if e not in held and (resident or not prefetcher.adopt_staged(layer_index, e))
    ]
    if lru is not None and staged:
        lru.use_all(staged, weight_bytes)


SPLIT_PARTS = range(2, 9)  # k: 1/k of an expert's FFN columns on the GPU


def _split_part_costs(out: InvocationLayout, tokens: int, k: int) -> tuple[float, float, float, float]:
    """Running 1/``k`` of an expert's FFN columns (``tokens`` tokens) on the GPU and the rest sliced over the
    units: (each unit's kernel seconds for the rest, each unit's DRAM seconds for the rest and for reading the
    part's copy, PCIe seconds of that copy, GPU seconds), as :meth:`InvocationLayout.lay_out` lays it out."""
    costs, expert, sources = out.costs, out.expert, out.sources
    key = (id(expert), tokens, k, out.units, sources)
    memo = costs.split_parts.get(key)
    if memo is not None:
        return memo
    costs._shapes[id(expert)] = expert
    rest = out.units * k / (k - 1)  # the remaining (k-1)/k of the width, sliced over the units
    kernels, dram = costs.ndp_pair(expert, tokens, rest)
    transfer_part = out.ctx.system.host_link.latency_s + expert.weight_bytes() / k / costs.copy_bandwidth(sources)
    gpu_part = expert_shard_time_s(out.ctx.system.gpu, expert, tokens, k)
    value = (max(kernels, dram), dram + costs.copy_read_s(expert, sources) / k, transfer_part, gpu_part)
    costs.split_parts[key] = value
    return value


def _split_mode(out: InvocationLayout, tokens: list[int], k: int) -> ItemMode:
    """Every active expert (``tokens[i]`` tokens each) split with 1/``k`` on the GPU, as a mode of the packer's
    problem."""
    parts = [_split_part_costs(out, t, k) for t in tokens]
    kernels = np.repeat([[p[0]] for p in parts], out.units, axis=1)
    dram = np.repeat([[p[1]] for p in parts], out.units, axis=1)
    weight_bytes = out.expert.weight_bytes()
    staged = np.full(len(tokens), weight_bytes / k)
    return ItemMode(kernels, [p[2] for p in parts], [p[3] for p in parts], staged, dram)


def _best_split(
    ctx: RunContext, out: InvocationLayout, resident: list[bool], on_gpu: Sequence[bool]
) -> tuple[int, int] | None:
    """(position in ``out.active`` of the expert split, k) when running 1/k of the hottest NDP expert on the GPU
    (k in :data:`SPLIT_PARTS`) lowers the packer's objective, else None."""
    active, tokens = out.active, out.active_tokens
    on_ndp = [i for i in range(len(active)) if not on_gpu[i]]
    if not on_ndp:
        return None
    hot = max(on_ndp, key=lambda i: (tokens[i], -active[i]))
    # The packer's objective (makespan_modes_s over the placement problem, every other expert as placed) of the
    # placement itself (row 0) and with the hot expert split 1/k (row m for the m-th k), as one batch: each row's
    # loads are summed as makespan_modes_s sums them, so the spans are the same to the last bit.
    items = out.as_arrays(out.item_lists(active, tokens, resident))
    gpu_mask = np.asarray(on_gpu, dtype=bool)
    rows = len(SPLIT_PARTS) + 1
    pcie = np.repeat(np.where(gpu_mask, items["transfer"], 0.0)[None, :], rows, axis=0)
    gpu = np.repeat(np.where(gpu_mask, items["gpu"], 0.0)[None, :], rows, axis=0)
    kernels = np.repeat(np.where(gpu_mask[:, None], 0.0, items["ndp"])[None], rows, axis=0)
    dram = np.repeat(np.where(gpu_mask[:, None], items["copy"], items["dram"])[None], rows, axis=0)
    for m in range(1, rows):
        part = _split_part_costs(out, tokens[hot], SPLIT_PARTS[m - 1])
        kernels[m, hot] = part[0]
        dram[m, hot] = part[1]
        pcie[m, hot] = part[2]
        gpu[m, hot] = part[3]
    result_s, result_pcie_s = out.result_s()
    spans = span_terms_s(
        0.0,
        0.0,
        np.full(out.units, out.activation_s()),
        result_s,
        result_pcie_s,
        True,
        True,
        pcie.sum(axis=1),
        gpu.sum(axis=1),
        kernels.sum(axis=1),
        dram.sum(axis=1),
        np.where(pcie > 0, gpu, np.inf).min(axis=1),
        np.ones(rows, dtype=bool),  # the hot expert stays on the units in every row
    ).tolist()
    current = spans[0]
    best: tuple[float, int] | None = None
    for m in range(1, rows):
        span = spans[m]
        if span < current * (1 - 1e-9) and (best is None or span < best[0]):
            best = (span, SPLIT_PARTS[m - 1])
    return None if best is None else (hot, best[1])


def split_choice(
    ctx: RunContext, out: InvocationLayout, resident: list[bool], on_gpu: Sequence[bool] | np.ndarray
) -> tuple[int, int] | None:
    """``tp+lb+prefetch+split``'s choice after the packer put active expert ``i`` on the GPU where ``on_gpu[i]``:
    (position in ``out.active`` of the expert split, k), or None."""
    return _best_split(ctx, out, resident, [bool(g) for g in on_gpu])


class OursVariableDegree(Ours):
    name = "tp+lb+prefetch+vtp"
    role = "extension"
    description = (
        "ours with a tensor-parallel degree per expert and per-unit bins: every expert is stored both sliced over "
        "all units and whole on its home unit (twice the DIMM capacity); each invocation runs an expert whole on "
        "its home unit where that lowers the busiest unit's load (fewer, larger kernels), sliced otherwise, and "
        "keeps that only if it packs shorter than every expert sliced"
    )
    source = "issue 13 (beyond arXiv 2601.03992): variable TP degree per expert, each NDP unit its own bin"
    layout = "dual"

    def begin_step(
        self, ctx: RunContext, state: PolicyState, layers: Sequence[int], counts: np.ndarray, phase: str
    ) -> None:
        return None  # it packs every invocation: no plan to reuse, so no drift to track

    def place(self, ctx: RunContext, state: PolicyState, out: InvocationLayout, phase: str) -> None:
        layer_index = out.layer_index
        active, active_tokens = out.active, out.active_tokens
        res = self._resident(state, layer_index, active)
        started = time.perf_counter()
        on_gpu, whole = variable_degree_choice(ctx, out, res)
        state.decision_times_s.append(time.perf_counter() - started)
        state.recomputations += 1
        if phase == "decode":
            state.decode_recomputations += 1
        for i, (e, tokens) in enumerate(zip(active, active_tokens, strict=True)):
            if on_gpu[i]:
                out.to_gpu(e, tokens, res[i])
                _keep_copies(state, layer_index, [(e, res[i])], ctx.expert_bytes[layer_index])
            elif whole[i]:
                out.whole_on_units([e], [tokens])
            else:
                out.sliced([e], [tokens])
        out.extra["resident_selected"] = float(sum(res))
        out.extra["whole_on_unit"] = float(whole.sum())
        out.finish()


def variable_degree_choice(
    ctx: RunContext, out: InvocationLayout, resident: list[bool]
) -> tuple[np.ndarray, np.ndarray]:
    """``tp+lb+prefetch+vtp``'s decision for the invocation ``out`` (``resident[i]``: whether active expert ``i`` is
    on the GPU already): per active expert, on the GPU, and run whole on its home unit. The packer runs over the
    NDP times :func:`choose_whole` picks and, when it picked any expert whole, over every expert sliced as well;
    the placement with the shorter makespan is kept (whole experts alone can leave the units unbalanced where
    slicing them would not: up to 2x the richer problem's optimum, ``benchmarks/bench_scheduler.py --richer``)."""
    active, tokens = out.active, out.active_tokens
    whole = choose_whole(out)
    mixed = _placement_problem(ctx, out, out.item_arrays(active, tokens, resident, whole))
    on_gpu = pack(mixed)
    if whole.any():
        sliced = _placement_problem(ctx, out, out.item_arrays(active, tokens, resident))
        sliced_gpu = pack(sliced)
        if makespan_s(sliced, sliced_gpu) < makespan_s(mixed, on_gpu):
            return sliced_gpu, np.zeros_like(whole)
    return on_gpu, whole


def richer_problem(
    ctx: RunContext, out: InvocationLayout, resident: list[bool]
) -> tuple[PlacementProblem, list[ItemMode]]:
    """The richer placement problem of the invocation ``out`` (``resident[i]``: active expert ``i`` on the GPU
    already), for :func:`hw_model.scheduler.solve_exact_modes`: every active expert on the GPU, sliced over all
    units (the problem), whole on its home unit (the first mode, :func:`variable_degree_choice`'s alternative) or
    with 1/k of its FFN columns on the GPU and the rest sliced (one mode per k in :data:`SPLIT_PARTS`, as
    :func:`split_choice` splits one expert)."""
    active, tokens = out.active, out.active_tokens
    problem = _placement_problem(ctx, out, out.item_arrays(active, tokens, resident))
    whole = out.item_arrays(active, tokens, resident, [True] * len(active))
    modes = [ItemMode(whole["ndp"], dram_s=whole["dram"])]
    modes += [_split_mode(out, tokens, k) for k in SPLIT_PARTS]
    return problem, modes


def richer_choices(
    ctx: RunContext, out: InvocationLayout, resident: list[bool], problem: PlacementProblem
) -> dict[str, np.ndarray]:
    """The decisions of ours and of the variable-degree and split extensions for the invocation ``out``, as choices
    of its :func:`richer_problem` ``problem`` (per active expert: ``-1`` the GPU, ``0`` sliced, ``1`` whole on its
    home unit, ``k`` >= 2 split with 1/k on the GPU), by policy name."""
    packed = pack(problem)
    ours = np.where(packed, -1, 0)
    on_gpu, whole = variable_degree_choice(ctx, out, resident)
    split = ours.copy()
    chosen = split_choice(ctx, out, resident, packed)
    if chosen is not None:
        split[chosen[0]] = chosen[1]  # richer_problem's modes: whole first, then k = 2, 3, ...: mode k is 1/k
    return {
        Ours.name: ours,
        OursVariableDegree.name: np.where(on_gpu, -1, np.where(whole, 1, 0)),
        OursSplit.name: split,
    }


def choose_whole(out: InvocationLayout) -> np.ndarray:
    """Per active expert, whether to run it whole on its home unit (per-unit bins): every unit takes the same
    number ``m`` of its own coldest experts whole (``m`` = the fewest active experts any unit is home to), which
    keeps the units balanced while each whole expert saves the fixed costs of N - 1 shards; kept only if the
    busiest unit's load drops. Everything else stays sliced."""
    costs, expert, units = out.costs, out.expert, out.units
    tokens = out.active_tokens
    homes = [out.home(e) for e in out.active]
    by_unit: list[list[int]] = [[] for _ in range(units)]
    for i in sorted(range(len(tokens)), key=lambda i: tokens[i]):
        by_unit[homes[i]].append(i)
    m = min(len(members) for members in by_unit) if units > 1 else 0
    whole = np.zeros(len(tokens), dtype=bool)
    if m == 0:
        return whole
    for members in by_unit:
        whole[members[:m]] = True
    sliced_s = [max(costs.ndp_s(expert, c, units), costs.ndp_dram_s(expert, c, units)) for c in tokens]
    whole_s = [max(costs.ndp_s(expert, c, 1), costs.ndp_dram_s(expert, c, 1)) for c in tokens]
    before = sum(sliced_s)
    after = [sum(s for i, s in enumerate(sliced_s) if not whole[i])] * units
    for i in np.flatnonzero(whole).tolist():
        after[homes[i]] += whole_s[i]
    return whole if max(after) < before * (1 - 1e-12) else np.zeros(len(tokens), dtype=bool)


class LowerBound(Policy):
    name = "lower-bound"
    role = "bound"
    description = (
        "expert compute spread fractionally over the GPU and all NDP units with no copies; the GPU takes at "
        "most as many experts per layer as the GPU memory pool holds"
    )
    source = "ours (a bound, not a system)"
    needs_ndp = False
    layout = "sliced"

    def place(self, ctx: RunContext, state: PolicyState, out: InvocationLayout, phase: str) -> None:
        _lower_bound(ctx, out)


# Registered here rather than with a class decorator: a decorated class would not compile to a native class with
# mypyc (see native/compile_hw_model.py). Registration order is the order ``policy_names`` lists them in.
for _policy_class in (
    GpuOffload,
    NdpExpertPerUnit,
    Monde,
    MondeCache,
    Duplex,
    TensorParallel,
    TensorParallelLoadBalanced,
    Ours,
    OursLookahead,
    OursSplit,
    OursVariableDegree,
    LowerBound,
):
    register(_policy_class)

POLICIES: tuple[str, ...] = policy_names()


def _prefetcher(ctx: RunContext) -> ExpertPrefetcher:
    config = PrefetchConfig(
        residency_cap_bytes=ctx.residency_cap_bytes,
        update_interval_tokens=ctx.tuning.prefetch_interval_tokens,
        decay=ctx.tuning.prefetch_decay,
    )
    return ExpertPrefetcher(
        [layer.num_experts for layer in ctx.layers], [layer.expert.weight_bytes() for layer in ctx.layers], config
    )


def _scheduled_gpu_set(
    ctx: RunContext, state: PolicyState, out: InvocationLayout, resident: list[bool], phase: str
) -> tuple[list[bool], frozenset[int] | None]:
    """Per active expert of the invocation ``out``, whether the packer puts it on the GPU (``resident[i]``: whether
    active expert ``i`` is there already); and the new plan (its GPU set), or None when the plan was reused (while
    the smoothed activation histogram stays close to the plan's)."""
    tracker = state.histograms[phase]
    layer_index, active = out.layer_index, out.active
    if tracker.drift.pop(layer_index) <= ctx.tuning.drift_threshold:
        state.reuses += 1
        # respect residency: resident active experts run on the GPU (no copy); others as planned
        planned_gpu = tracker.plans[layer_index]
        return [resident[i] or active[i] in planned_gpu for i in range(len(active))], None  # index loop: see simulator
    # Items differ only by token count and residency, so the packer's decision is a function of the items'
    # (tokens, resident) sequence: memoised per sequence (a pure speed-up, the decision is identical). A new
    # sequence is put in one canonical order (by tokens, then residency, then position), so the packer runs
    # once per distinct set of items, whatever their order.
    active_tokens = out.active_tokens
    signature = (ctx.layer_classes[layer_index], tuple(active_tokens), tuple(resident))
    on_gpu = state.pack_memo.get(signature)
    if on_gpu is None:
        canonical = sorted(range(len(active)), key=list(zip(active_tokens, resident, strict=True)).__getitem__)
        tokens = [active_tokens[i] for i in canonical]
        res = [resident[i] for i in canonical]
        canonical_signature = (signature[0], tuple(tokens), tuple(res))
        decision = state.pack_memo.get(canonical_signature)
        if decision is None:
            decision = _pack_decision(ctx, state, out, [active[i] for i in canonical], tokens, res)
            state.pack_memo[canonical_signature] = decision
        on_gpu = [False] * len(active)
        for i, chosen in zip(canonical, decision, strict=True):
            on_gpu[i] = chosen
        state.pack_memo[signature] = on_gpu
    state.recomputations += 1
    if phase == "decode":
        state.decode_recomputations += 1
    planned = frozenset([e for e, chosen in zip(active, on_gpu, strict=True) if chosen])
    tracker.replan(layer_index, planned)
    return on_gpu, planned


def _placement_problem(ctx: RunContext, out: InvocationLayout, items: dict[str, np.ndarray]) -> PlacementProblem:
    """The packer's problem for the invocation ``out`` over the per-item arrays ``items`` (see
    :meth:`InvocationLayout.item_arrays`): every unit starts busy with the activation copy, its NDP work and
    copy reads are costed as the timeline does (kernels and DRAM, the outputs' way back, copy before compute)."""
    result_s, result_pcie_s = out.result_s()
    return PlacementProblem(
        ndp_time_s=items["ndp"],
        gpu_compute_s=items["gpu"],
        transfer_s=items["transfer"],
        transfer_bytes=items["staged"],
        staging_cap_bytes=ctx.staging_cap_bytes,
        unit_base_s=np.full(out.units, out.activation_s()),
        copy_unit_s=items["copy"],
        ndp_dram_s=items["dram"],
        result_s=result_s,
        result_pcie_s=result_pcie_s,
        ndp_optional=True,
        copy_tail=True,
    )


def _pack_decision(
    ctx: RunContext, state: PolicyState, out: InvocationLayout, ids: list[int], tokens: list[int], resident: list[bool]
) -> list[bool]:
    """The load-balancing packer's choice (per item: on the GPU?) for experts ``ids`` of the invocation ``out``
    with ``tokens`` tokens each, ``resident`` or not; its wall time is recorded as a decision time."""
    problem = _placement_problem(ctx, out, out.item_arrays(ids, tokens, resident))
    started = time.perf_counter()
    decision = pack(problem).tolist()
    state.decision_times_s.append(time.perf_counter() - started)
    if len(state.pack_memo) > 200_000:
        state.pack_memo.clear()
    return decision


def gpu_expert_slots(ctx: RunContext, layer: MoELayerShape) -> float:
    """How many of ``layer``'s experts the whole GPU memory pool (residency + staging) holds at once."""
    return (ctx.residency_cap_bytes + ctx.staging_cap_bytes) / layer.expert.weight_bytes()


def _lower_bound(ctx: RunContext, out: InvocationLayout) -> None:
    """A per-invocation lower bound on every policy; the larger of two relaxations of one problem:

    - compute: the expert work spread fractionally over the GPU and all NDP units, no copies (GPU vs NDP);
    - memory: the GPU holds at most :func:`gpu_expert_slots` experts for free; every further expert it takes
      costs a PCIe copy at full link bandwidth (NDP vs PCIe; the experts with most NDP time go first).
    """
    system, costs = ctx.system, ctx.costs
    units = system.num_ndp_units
    layer = out.layer
    expert = layer.expert
    gpu_s = np.array([costs.gpu_s(expert, tokens) for tokens in out.active_tokens])
    if units:
        # per-unit time if the expert's work is spread evenly, whichever of whole/sharded kernels is cheaper
        ndp_s = np.array(
            [
                min(costs.ndp_s(expert, tokens, 1) / units, costs.ndp_s(expert, tokens, units))
                for tokens in out.active_tokens
            ]
        )
        gpu_load, ndp_load = 0.0, float(ndp_s.sum())
        for i in np.argsort(gpu_s / np.maximum(ndp_s, 1e-30), kind="stable").tolist():
            share = min(1.0, max(0.0, (ndp_load - gpu_load) / (gpu_s[i] + ndp_s[i])))
            gpu_load += share * gpu_s[i]
            ndp_load -= share * ndp_s[i]
            if share < 1.0:
                break
        copy_s = expert.weight_bytes() / system.host_link.bandwidth_bytes_per_s
        free = gpu_expert_slots(ctx, layer)
        left, pcie = float(ndp_s.sum()), 0.0
        for d in np.sort(ndp_s)[::-1].tolist():
            take_free = min(1.0, free)
            free -= take_free
            left -= take_free * d
            if take_free < 1.0:
                rest = 1.0 - take_free
                share = min(rest, max(0.0, (left - pcie) / (d + copy_s)))
                left -= share * d
                pcie += share * copy_s
                if share < rest:
                    break
        memory_bound = max(left, pcie)
    else:
        gpu_load, ndp_load = float(gpu_s.sum()), 0.0
        extra = max(0.0, len(out.active) - gpu_expert_slots(ctx, layer))
        memory_bound = extra * expert.weight_bytes() / system.host_link.bandwidth_bytes_per_s
    gpu_load, ndp_load, memory_bound = float(gpu_load), float(ndp_load), float(memory_bound)
    latency = max(gpu_load, ndp_load, memory_bound)
    events = [TimelineEvent("gpu", 0.0, gpu_load, "expert work (fractional)")] if gpu_load > 0 else []
    events += [
        TimelineEvent(f"ndp{u}", 0.0, ndp_load, "expert work (fractional)") for u in range(units) if ndp_load > 0
    ]
    timeline = LayerTimeline(tuple(events), latency, 0.0, 0.0, "none")
    out.extra["memory_bound_s"] = memory_bound
    out.finish_with_timeline(timeline, dict.fromkeys(out.active, "split"))


__all__ = [
    "POLICIES",
    "ExpertCosts",
    "Policy",
    "PolicyState",
    "RunContext",
    "get_policy",
    "gpu_expert_slots",
    "load_aware_order",
    "policy_names",
    "register",
]
