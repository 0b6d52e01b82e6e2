"""One MoE layer invocation's placement decisions turned into its timeline, memoised.

The simulator describes each invocation (its layer, its active experts and their token counts) as an
:class:`InvocationLayout`, and the policy records on it, per active expert, one decision: on the GPU (resident,
or with its weights copied over PCIe first), sliced over all NDP units (tensor parallel), whole on its home
unit, or split between the GPU and the units. :meth:`InvocationLayout.finish` turns the decisions into the
invocation's plan:

- its :class:`LayoutSummary` (latency, busy seconds per resource, bytes over the host link, the idle PCIe
  windows after the NDP work), memoised per run by the decisions *without expert ids*: experts of one layer
  shape with the same token count and the same decision cost the same, so in decode (one token, top-k of
  many experts) nearly every invocation is a memo hit although the same experts rarely recur;
- its :class:`~hw_model.timeline.LayerTimeline` (every busy interval, labelled with this invocation's expert
  ids), laid out only when read.

A placement where every expert runs on the GPU or sliced (:meth:`InvocationLayout.gpu_or_sliced`, the packer
policies') is also memoised by its items as they are (per active expert: tokens, on the GPU, resident), a
cheaper key than the sorted decisions; on such a hit the decisions are recorded only when read.

Decisions are laid out in one canonical order, sorted by (kind, tokens, detail, expert id); decisions equal
but for the expert cost exactly the same, so a memoised summary is exactly what laying out any invocation
with the same id-free decisions gives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeAlias

import numpy as np
from mypy_extensions import mypyc_attr

from hw_model.cost import expert_shard_time_s
from hw_model.run_context import ExpertCosts, RunContext
from hw_model.timeline import GpuJob, LayerTimeline, build_layer_timeline
from hw_model.workload import ExpertShape, MoELayerShape

GPU, SLICED, WHOLE, SPLIT = 0, 1, 2, 3  # decision kinds, in their canonical order
_NO_WORK = (0.0,) * 6  # hw_model.energy.WORK_FIELDS, all zero
MEMO_SIZE = 20_000  # memoised layout summaries per run (cleared when full)
_SHARD_LABELS = tuple(f"e{e} shard" for e in range(1024))  # the labels of sliced experts' NDP jobs

# (kind, tokens, detail_a, detail_b): GPU (resident 0/1, home unit the copy reads or 0); SLICED (0, 0);
# WHOLE (home unit, 0); SPLIT (k: 1/k on the GPU, or -k: all but 1/k; resident 0/1). The expert it is about is kept
# beside it.
Decision = tuple[int, int, int, int]
Flags: TypeAlias = Sequence[bool] | np.ndarray  # one flag per active expert: a list, or a boolean array


class LayoutSummary(NamedTuple):
    """What the simulator needs of one invocation's timeline, without its events. ``busy`` is shared between
    invocations: read it, do not change it. ``idle_pcie`` are the host-to-GPU link's idle windows after the
    NDP units are done (a copy reads the DIMMs, so it never overlaps NDP work on them)."""

    latency_s: float
    busy: Mapping[str, float]
    host_to_gpu_bytes: float
    gpu_to_host_bytes: float
    reduction: str
    idle_pcie: tuple[tuple[float, float], ...]
    work: tuple[float, ...]  # per hw_model.energy.WORK_FIELDS (what the energy model prices)


def summarize(timeline: LayerTimeline) -> LayoutSummary:
    """The summary of a laid-out timeline."""
    latency_s = timeline.latency_s
    ndp_done = timeline.ndp_done_s  # then any later NDP-side base event (the DIMM-link reduction)
    busy = []
    for resource, start_s, end_s, _ in timeline.base_events:
        if resource == "pcie":
            busy.append((start_s, end_s))
        elif resource.startswith("ndp"):
            ndp_done = max(ndp_done, end_s)
    busy.sort()
    gaps, clock = [], ndp_done
    for start, end in busy:
        if start > clock:
            gaps.append((clock, start))
        clock = max(clock, end)
    if latency_s > clock:
        gaps.append((clock, latency_s))
    return LayoutSummary(
        latency_s,
        timeline.busy_map(),
        timeline.host_to_gpu_bytes,
        timeline.gpu_to_host_bytes,
        timeline.reduction,
        tuple(gaps),
        timeline.work or _NO_WORK,  # a timeline a policy built itself (the lower bound) records no work
    )


# acyclic: compiled, an instance is not tracked by the cyclic garbage collector (nothing it holds refers back to it);
# one is made per simulated invocation, and tracking them made the collector run every few decode steps
@dataclass
class LayoutState:
    """What laying invocations out keeps across a run (the part of a policy's
    :class:`~hw_model.policies.PolicyState` this module writes): layouts and per-item plans memoised by their
    decisions, and the bytes copied to the GPU on demand."""

    layout_memo: dict[tuple, LayoutSummary] = field(default_factory=dict)
    item_memo: dict[tuple, LayoutSummary] = field(default_factory=dict)  # see InvocationLayout.gpu_or_sliced
    on_demand_bytes: float = 0.0


@mypyc_attr(acyclic=True)
class InvocationLayout:
    """One MoE layer invocation: its active experts, the decisions a policy records for them (see the module
    docstring), and the resulting plan: :attr:`summary` (set by :meth:`finish`), policy-specific numbers
    (:attr:`extra`), and the timeline and placement, built on first read.

    The simulator makes one per invocation and hands it to the policy's ``place``; it also gives the policies
    the per-item view of the active experts their balancing rules and the packer use.
    """

    __slots__ = (
        "ctx",
        "state",
        "layer_index",
        "active",
        "active_tokens",
        "decisions",
        "ids",
        "extra",
        "summary",
        "_timeline",
        "_placement",
        "_unrecorded",
    )
    summary: LayoutSummary  # set by finish (or gpu_or_sliced); reading it before is an AttributeError

    def __init__(
        self,
        ctx: RunContext,
        state: LayoutState,
        layer_index: int,
        active: list[int],
        active_tokens: list[int],
    ) -> None:
        self.ctx = ctx
        self.state = state
        self.layer_index = layer_index
        self.active = active  # the experts with tokens, ascending
        self.active_tokens = active_tokens  # their token counts
        self.decisions: list[Decision] = []  # id-free, in the order recorded
        self.ids: list[int] = []  # the expert of each decision
        self.extra: dict[str, float] = {}
        self._timeline: LayerTimeline | None = None
        self._placement: Mapping[int, str] | None = None
        self._unrecorded: tuple[list[bool], list[bool]] | None = None  # see gpu_or_sliced

    # -- what the policies read ------------------------------------------------------------------------
    @property
    def layer(self) -> MoELayerShape:
        return self.ctx.layers[self.layer_index]

    @property
    def costs(self) -> ExpertCosts:
        return self.ctx.costs

    @property
    def expert(self) -> ExpertShape:
        return self.layer.expert

    @property
    def units(self) -> int:
        return self.ctx.system.num_ndp_units

    @property
    def sources(self) -> int:
        """How many DIMMs an expert's copy reads in parallel (the policy's weight layout)."""
        return self.ctx.copy_sources

    @property
    def tensor_parallel(self) -> bool:
        return self.ctx.tensor_parallel

    @property
    def tokens(self) -> int:
        """Token rows in the invocation."""
        return max(1, -(-sum(self.active_tokens) // self.layer.top_k))

    def home(self, e: int) -> int:
        return e % self.units

    # -- recording decisions ---------------------------------------------------------------------------
    def to_gpu(self, e: int, tokens: int, resident: bool) -> None:
        """Expert ``e`` (``tokens`` tokens) on the GPU; unless ``resident``, its weights are copied first (counted
        as on-demand)."""
        self.ids.append(e)
        if not resident:
            self.state.on_demand_bytes += self.ctx.expert_bytes[self.layer_index]
        self.decisions.append(self._gpu_decision(e, tokens, resident))

    def _gpu_decision(self, e: int, tokens: int, resident: bool) -> Decision:
        """The decision of expert ``e`` (``tokens`` tokens) on the GPU, its weights copied first unless ``resident``:
        a copy from one DIMM (whole layout) reads the expert's home unit."""
        if resident:
            return (GPU, tokens, 1, 0)
        ctx = self.ctx
        return (GPU, tokens, 0, e % ctx.system.num_ndp_units if ctx.copy_sources == 1 else 0)

    def gpu_or_sliced(self, on_gpu: list[bool], resident: list[bool]) -> list[tuple[int, bool]]:
        """Active expert ``i`` on the GPU where ``on_gpu[i]`` (as :meth:`to_gpu` with ``resident[i]``), sliced over
        all units otherwise (as :meth:`sliced`), and :meth:`finish`; returns ``(expert, resident)`` of those on the
        GPU, in order.

        The summary is memoised per run by the invocation's items as they are (per active expert, in order: its
        tokens, on the GPU or not, resident or not), which is cheaper than sorting decisions; on a hit the
        decisions are recorded only when the timeline or the placement is read. Where a copy reads the expert's
        home unit (whole layouts) the decisions name the unit, so they are recorded and finished as usual."""
        ctx, state, active = self.ctx, self.state, self.active
        on_the_gpu = [(active[i], resident[i]) for i in range(len(active)) if on_gpu[i]]  # index loops: see simulator
        weight_bytes = ctx.expert_bytes[self.layer_index]
        for _, res in on_the_gpu:
            if not res:
                state.on_demand_bytes += weight_bytes
        if ctx.copy_sources == 1:
            self._record_gpu_or_sliced(on_gpu, resident)
            self.finish()
            return on_the_gpu
        key = (ctx.layer_classes[self.layer_index], tuple(self.active_tokens), tuple(on_gpu), tuple(resident))
        memo = state.item_memo
        summary = memo.get(key)
        if summary is None:
            self._record_gpu_or_sliced(on_gpu, resident)
            summary = self.finish()
            if len(memo) >= MEMO_SIZE:
                memo.clear()
            memo[key] = summary
        else:
            self.summary = summary
            self._unrecorded = (on_gpu, resident)
        return on_the_gpu

    def _record_gpu_or_sliced(self, on_gpu: list[bool], resident: list[bool]) -> None:
        """The decisions of :meth:`gpu_or_sliced` (its copies' bytes already counted)."""
        gpu_decision = self._gpu_decision
        self.decisions += [
            gpu_decision(e, tokens, res) if gpu else (SLICED, tokens, 0, 0)
            for e, tokens, gpu, res in zip(self.active, self.active_tokens, on_gpu, resident, strict=True)
        ]
        self.ids += self.active

    def _recorded(self) -> None:
        """Record the decisions a memoised :meth:`gpu_or_sliced` left unrecorded."""
        if self._unrecorded is not None:
            on_gpu, resident = self._unrecorded
            self._unrecorded = None
            self._record_gpu_or_sliced(on_gpu, resident)

    def whole_on_units(self, experts: list[int], tokens: list[int]) -> None:
        """Each of ``experts`` (``tokens[i]`` tokens) whole on its home unit."""
        units = self.units
        self.ids += experts
        self.decisions += [(WHOLE, t, e % units, 0) for e, t in zip(experts, tokens, strict=True)]

    def sliced(self, experts: list[int], tokens: list[int]) -> None:
        """Each of ``experts`` (``tokens[i]`` tokens) sliced over all units."""
        self.ids += experts
        self.decisions += [(SLICED, t, 0, 0) for t in tokens]

    def on_ndp(self, experts: list[int], tokens: list[int]) -> None:
        """Each of ``experts`` on the NDP units as the policy's layout has it: sliced or whole on its home unit."""
        if self.ctx.tensor_parallel:
            self.sliced(experts, tokens)
        else:
            self.whole_on_units(experts, tokens)

    def split(self, e: int, tokens: int, k: int, resident: bool = False) -> None:
        """1/``k`` of expert ``e``'s FFN columns on the GPU (``k`` >= 2; all but 1/``-k`` of them for ``k`` <= -2),
        that part of its weights copied unless ``resident`` (the GPU holds the whole expert and computes those
        columns from its copy), the rest sliced."""
        self.ids.append(e)
        if not resident:
            weight_bytes = self.layer.expert.weight_bytes()
            self.state.on_demand_bytes += weight_bytes / k if k > 0 else weight_bytes * (-k - 1) / -k
        self.decisions.append((SPLIT, tokens, k, 1 if resident else 0))

    def repin(self, gpu: frozenset[int], ndp: frozenset[int]) -> float:
        """Move the pinned experts among the recorded decisions where the pins say (``gpu``: on the GPU, resident;
        ``ndp``: on the NDP units as the policy's layout has them) and finish again; returns the pinned latency
        less the policy's own (0.0 when no active expert is pinned, or the policy laid out its own timeline)."""
        if self._placement is not None and not self.decisions and self._unrecorded is None:
            return 0.0  # finished with a timeline of its own (finish_with_timeline): no decisions to move
        self._recorded()
        units = self.units
        before = self.summary.latency_s
        moved = False
        for i in range(len(self.ids)):
            e = self.ids[i]
            kind, tokens, a, _ = self.decisions[i]
            if e in gpu and not (kind == GPU and a == 1):
                if kind == GPU:  # its copy was counted as on-demand: resident now
                    self.state.on_demand_bytes -= self.ctx.expert_bytes[self.layer_index]
                self.decisions[i] = (GPU, tokens, 1, 0)
                moved = True
            elif e in ndp and units > 0 and kind in (GPU, SPLIT):
                self.decisions[i] = (
                    (SLICED, tokens, 0, 0) if self.ctx.tensor_parallel else (WHOLE, tokens, e % units, 0)
                )
                moved = True
        if not moved:
            return 0.0
        self._timeline = None
        self._placement = None
        return self.finish().latency_s - before

    def finish(self) -> LayoutSummary:
        """Set :attr:`summary` from the recorded decisions (from the run's memo, laid out on a miss); returns it."""
        key = (self.ctx.layer_classes[self.layer_index], tuple(sorted(self.decisions)))
        memo = self.state.layout_memo
        summary = memo.get(key)
        if summary is None:
            self._timeline = self.lay_out()
            summary = summarize(self._timeline)
            if len(memo) >= MEMO_SIZE:
                memo.clear()
            memo[key] = summary
        self.summary = summary
        return summary

    def finish_with_timeline(self, timeline: LayerTimeline, placement: Mapping[int, str]) -> None:
        """Finish with a timeline the policy laid out itself (not from recorded decisions)."""
        self._timeline = timeline
        self._placement = placement
        self.summary = summarize(timeline)

    # -- the plan, built on first read -----------------------------------------------------------------
    @property
    def timeline(self) -> LayerTimeline:
        if self._timeline is None:
            self._timeline = self.lay_out()
        return self._timeline

    @property
    def timeline_built(self) -> bool:
        return self._timeline is not None

    @property
    def placement(self) -> Mapping[int, str]:
        """Expert id to ``"gpu"``, ``"ndp"`` (sliced), ``"ndpU"`` (whole on unit U) or ``"split"``."""
        if self._placement is None:
            self._recorded()
            names = {GPU: "gpu", SLICED: "ndp", SPLIT: "split"}
            decisions = sorted(zip(self.ids, self.decisions, strict=True))
            self._placement = {e: f"ndp{d[2]}" if d[0] == WHOLE else names[d[0]] for e, d in decisions}
        return self._placement

    def lay_out(self) -> LayerTimeline:
        """The timeline of the recorded decisions, laid out in the canonical order (see the module docstring)."""
        self._recorded()
        ctx, costs, expert, units = self.ctx, self.costs, self.expert, self.units
        sources, tokens_all = self.sources, self.tokens
        weight_bytes = ctx.expert_bytes[self.layer_index]
        unit_jobs: list[list[tuple[str, float]]] = [[] for _ in range(units)]
        unit_dram_s = [0.0] * units
        unit_tokens = [0] * units
        gpu_jobs: list[GpuJob] = []
        # sliced experts put the same shard on every unit: kept once, spread over the units at the end
        shared_jobs: list[tuple[str, float]] = []
        shared_dram_s = 0.0
        shared_tokens = 0
        # the work (hw_model.energy.WORK_FIELDS): GPU FLOPs, GPU memory bytes, NDP FLOPs, NDP DRAM bytes, DIMM bytes
        # copies read, DIMM-link bytes (the timeline adds the combine and the reduction)
        work = [0.0] * 6
        for (kind, tokens, a, b), e in sorted(zip(self.decisions, self.ids, strict=True)):
            if kind == GPU:
                work[0] += expert.flops(tokens)
                work[1] += weight_bytes + expert.activation_bytes(tokens)
                if a:  # resident
                    gpu_jobs.append(GpuJob(f"e{e}", 0.0, costs.gpu_s(expert, tokens), 0.0))
                    continue
                work[1] += weight_bytes  # the copy writes the weights into GPU memory
                work[4] += weight_bytes
                transfer = costs.transfer_s(expert, sources)
                gpu_jobs.append(GpuJob(f"e{e}", transfer, costs.gpu_s(expert, tokens), weight_bytes))
                read_s = costs.copy_read_s(expert, sources)
                if sources == 1 and units:
                    unit_dram_s[b] += read_s
                elif sources > 1:
                    for u in range(units):
                        unit_dram_s[u] += read_s
            elif kind == SLICED:
                work[2] += expert.flops(tokens)
                work[3] += weight_bytes + units * expert.activation_bytes(tokens, units)
                ndp_s, dram_s = costs.ndp_pair(expert, tokens, units)
                shared_jobs.append((_SHARD_LABELS[e] if e < len(_SHARD_LABELS) else f"e{e} shard", ndp_s))
                shared_dram_s += dram_s
                shared_tokens += tokens
            elif kind == WHOLE:
                work[2] += expert.flops(tokens)
                work[3] += weight_bytes + expert.activation_bytes(tokens)
                unit_jobs[a].append((f"e{e}", costs.ndp_s(expert, tokens, 1)))
                unit_dram_s[a] += costs.ndp_dram_s(expert, tokens, 1)
                unit_tokens[a] = min(tokens_all, unit_tokens[a] + tokens)
            else:  # SPLIT: a share of the FFN columns on the GPU (that part of the weights copied unless b), the rest
                # sliced: 1/k of them for a = k >= 2, all but 1/k of them for a = -k
                k = a
                flops = expert.flops(tokens)
                if k > 0:
                    gpu_shards: float = float(k)
                    rest = units * k / (k - 1)
                    part_bytes = expert.weight_bytes() / k
                    gpu_flops = flops / k
                    read_s = costs.copy_read_s(expert, sources) / k
                    label = f"e{e} 1/{k}"
                else:
                    gpu_shards = -k / (-k - 1)
                    rest = float(units * -k)
                    share = (-k - 1) / -k
                    part_bytes = expert.weight_bytes() * share
                    gpu_flops = flops * share
                    read_s = costs.copy_read_s(expert, sources) * share
                    label = f"e{e} {-k - 1}/{-k}"
                gpu_s = expert_shard_time_s(ctx.system.gpu, expert, tokens, gpu_shards)
                work[0] += gpu_flops
                work[2] += flops - gpu_flops
                work[3] += units * (expert.weight_bytes(rest) + expert.activation_bytes(tokens, rest))
                shared_jobs.append((f"e{e} shard", costs.ndp_s(expert, tokens, rest)))
                shared_tokens += tokens
                if b:  # resident: the GPU computes its columns from the copy it holds
                    work[1] += part_bytes + expert.activation_bytes(tokens, gpu_shards)
                    gpu_jobs.append(GpuJob(label, 0.0, gpu_s, 0.0))
                    shared_dram_s += costs.ndp_dram_s(expert, tokens, rest)
                    continue
                work[1] += 2 * part_bytes + expert.activation_bytes(tokens, gpu_shards)
                work[4] += part_bytes
                transfer = ctx.system.host_link.latency_s + part_bytes / costs.copy_bandwidth(sources)
                gpu_jobs.append(GpuJob(label, transfer, gpu_s, part_bytes))
                shared_dram_s += costs.ndp_dram_s(expert, tokens, rest) + read_s
        if shared_jobs:
            for unit in range(units):
                own = unit_jobs[unit]
                unit_jobs[unit] = shared_jobs + own if own else shared_jobs  # one list for units without own jobs
                unit_dram_s[unit] += shared_dram_s
                unit_tokens[unit] = min(tokens_all, unit_tokens[unit] + shared_tokens)
        return build_layer_timeline(
            ctx.system,
            self.layer,
            tokens_all,
            unit_jobs,
            unit_tokens,
            gpu_jobs,
            self.tensor_parallel,
            unit_dram_s,
            work,
        )

    # -- the per-item view the balancing rules and the packer use ----------------------------------------
    def item_lists(
        self, ids: list[int], tokens: list[int], resident: Flags, whole: Flags | None = None
    ) -> dict[str, list]:
        """Per active expert ``ids[i]`` (``tokens[i]`` tokens): NDP time per unit (``ndp``, one list of
        ``units`` floats per expert), the DRAM time of that NDP work per unit (``dram``, likewise), DRAM time a copy
        takes per unit (``copy``, likewise), copy time
        (``transfer``), GPU time (``gpu``), bytes (``staged``), as plain lists (the balancing rule runs on a
        handful of experts, where numpy's per-call cost dominates). ``whole[i]`` (dual layout) runs expert
        ``i`` whole on its home unit instead of sliced."""
        units, expert, costs, sources = self.units, self.expert, self.costs, self.sources
        sliced = self.tensor_parallel
        read_s = costs.copy_read_s(expert, sources)
        transfer_s = costs.transfer_s(expert, sources)
        weight_bytes = expert.weight_bytes()
        ndp: list[list[float]] = []
        copy: list[list[float]] = []
        dram: list[list[float]] = []
        transfer: list[float] = []
        gpu: list[float] = []
        staged: list[float] = []
        # (tokens, sliced) -> (NDP s, GPU s, NDP DRAM s)
        per_tokens: dict[tuple[int, bool], tuple[float, float, float]] = {}
        for i, (e, c) in enumerate(zip(ids, tokens, strict=True)):
            spread = sliced and not (whole is not None and whole[i])
            times = per_tokens.get((c, spread))
            if times is None:
                shards = units if spread else 1
                pair = costs.ndp_pair(expert, c, shards)
                times = per_tokens[c, spread] = (max(pair), costs.gpu_s(expert, c), pair[1])
            if spread:
                ndp.append([times[0]] * units)
                dram.append([times[2]] * units)
            else:
                row = [0.0] * units
                row[e % units] = times[0]
                ndp.append(row)
                row = [0.0] * units
                row[e % units] = times[2]
                dram.append(row)
            gpu.append(times[1])
            row = [0.0] * units
            if resident[i]:
                transfer.append(0.0)
                staged.append(0.0)
            else:
                if sources == 1:
                    row[e % units] = read_s
                elif sources > 1:
                    row = [read_s] * units
                transfer.append(transfer_s)
                staged.append(weight_bytes)
            copy.append(row)
        return {"ndp": ndp, "copy": copy, "transfer": transfer, "gpu": gpu, "staged": staged, "dram": dram}

    def item_arrays(
        self, ids: list[int], tokens: list[int], resident: Flags, whole: Flags | None = None
    ) -> dict[str, np.ndarray]:
        """:meth:`item_lists` as arrays (``ndp``, ``dram`` and ``copy``: experts x units), for the packer."""
        return self.as_arrays(self.item_lists(ids, tokens, resident, whole))

    def as_arrays(self, items: dict[str, list]) -> dict[str, np.ndarray]:
        """:meth:`item_lists`' result as :meth:`item_arrays` has it."""
        shape = (len(items["gpu"]), self.units)
        arrays = {key: np.array(values, dtype=np.float64) for key, values in items.items()}
        for key in ("ndp", "dram", "copy"):
            arrays[key] = arrays[key].reshape(shape)
        return arrays

    def result_s(self) -> tuple[float, float]:
        """The NDP units' outputs' way to the GPU after the last unit ends, as the timeline takes it with every unit
        busy: one PCIe copy per unit, or (partial sums of sliced experts) a reduction over the DIMM-link and one
        copy where that is sooner. Returns (its time, its PCIe part)."""
        system = self.ctx.system
        row_bytes = self.tokens * self.expert.hidden * self.expert.dtype_bytes
        one = system.host_link.transfer_time_s(row_bytes)
        each = max(self.units, 1) * one
        if self.tensor_parallel and self.units > 1:
            reduce_s = (self.units - 1) * system.ndp_link.transfer_time_s(row_bytes)
            if reduce_s + one < each:
                return reduce_s + one, one
        return each, each

    def activation_s(self) -> float:
        return self.ctx.system.host_link.transfer_time_s(self.tokens * self.expert.hidden * self.expert.dtype_bytes)
