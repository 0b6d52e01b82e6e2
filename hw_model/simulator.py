"""Per-layer simulation of MoE expert work on a GPU + NDP system, driven by the routing actually taken.

A :class:`MoESimulator` is created once per session (or per trace) and fed MoE layer invocations: which
experts were selected and for how many tokens, one layer at a time (:meth:`MoESimulator.simulate_layer`) or a
forward step's layers at once (:meth:`MoESimulator.simulate_step`, which does the per-layer bookkeeping for all
of them in array operations and finds every layer's active experts with one ``nonzero``; the results are
identical). Each invocation is handed to the policy as an :class:`~hw_model.layout.InvocationLayout` (its active
experts and their token counts, as plain lists) and gives a :class:`~hw_model.step_results.LayerResult` with the
layer's latency and an event timeline (built on first read, see :mod:`hw_model.layout`) over the resources
``gpu``, ``pcie`` (host to GPU: expert weights and NDP outputs), ``pcie_d2h`` (GPU to host: hidden states for
the NDP units), ``ndp0..ndpN-1`` and ``ndp_link``. The ORT session and the trace-driven ``bench`` both use
this class, so their figures never disagree. The policies are described in :mod:`hw_model.policies`; the
default is the complete framework, ``tp+lb+prefetch``.

State carried across calls lives in the policy's :class:`~hw_model.policies.PolicyState`: the prefetcher's
counts and resident experts (or an LRU cache), cached placements (recomputed when the smoothed activation
histogram drifts), and counters read by :meth:`MoESimulator.summary`. Prefetch copies use PCIe time the
layers leave idle after their NDP work; callers that know how long the non-expert ops between MoE layers
take can hand that time over with :meth:`advance_time_s`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from hw_model.cost import kernel_time_s
from hw_model.energy import COPY_DRAM_BYTES, GPU_BYTES, NDP_FLOPS, EnergyReport, run_energy
from hw_model.errors import WorkloadError
from hw_model.hardware import SystemSpec
from hw_model.layout import InvocationLayout, LayoutSummary
from hw_model.pins import pinned_pool
from hw_model.policies import POLICIES, get_policy, row_selector
from hw_model.run_context import ExpertCosts, RunContext
from hw_model.settings import DEFAULT_POLICY, SimulationSettings
from hw_model.step_results import CapacityCheck, LayerResult, StepResult, SummarySnapshot
from hw_model.timeline import TimelineEvent
from hw_model.units import human_bytes
from hw_model.workload import MoELayerShape, WeightFormat

PHASES = ("prefill", "decode")
_SCAN_IN_PYTHON = 64  # a step with at most this many counts lists its active experts in plain Python
USABLE_GPU_MEMORY_FRACTION = 0.9  # assumption: allocator slack, CUDA context, activations

__all__ = [
    "DEFAULT_POLICY",
    "PHASES",
    "POLICIES",
    "MoESimulator",
    "TimelineEvent",
    "gpu_op_time_s",
]


class MoESimulator:
    """Simulates MoE layers one invocation at a time under a scheduling policy (see :mod:`hw_model.policies`).

    GPU memory is one pool: ``USABLE_GPU_MEMORY_FRACTION`` of the GPU's memory less ``gpu_reserved_bytes``
    (non-expert weights and the KV cache). ``settings`` (a :class:`~hw_model.settings.SimulationSettings`, or a
    policy's name for the default settings with that policy) gives the policy and its tuning knobs: policies that
    keep experts resident use its ``residency_fraction`` of the pool for them and stage on-demand copies in the rest
    (at least one expert); the others stage in all of it. ``system`` is the system simulated
    (:meth:`from_settings` takes the settings' own). ``weight_format`` (a :class:`~hw_model.workload.WeightFormat`
    or a dtype name such as ``"int4"``, with ``quant_block_size``) sets how many bytes each stored expert weight
    takes. :attr:`capacity` says whether the experts fit the DIMMs (a configuration that does not fit still
    simulates, flagged).
    """

    def __init__(
        self,
        system: SystemSpec,
        layers: Sequence[MoELayerShape],
        settings: SimulationSettings | str = DEFAULT_POLICY,
        *,
        gpu_reserved_bytes: float = 0.0,
        weight_format: WeightFormat | str | None = None,
        quant_block_size: int = 32,
    ) -> None:
        if isinstance(settings, str):
            settings = SimulationSettings(hw=system, policy=settings)
        self.settings = settings
        policy = settings.policy
        self.policy_impl = get_policy(policy)
        if self.policy_impl.needs_ndp and system.num_ndp_units < 1:
            raise WorkloadError(f"policy {policy!r} needs at least one NDP unit")
        if not layers:
            raise WorkloadError("the simulator needs at least one MoE layer")
        if gpu_reserved_bytes < 0:
            raise WorkloadError("gpu_reserved_bytes must be non-negative")
        if isinstance(weight_format, str):
            weight_format = WeightFormat(weight_format, block_size=quant_block_size)
        if weight_format is not None:
            layers = [replace(layer, expert=replace(layer.expert, weight_format=weight_format)) for layer in layers]
        self.weight_format = weight_format
        self.system = system
        self.layers = tuple(layers)
        self.policy = policy
        largest_expert_bytes = max(layer.expert.weight_bytes() for layer in self.layers)
        pool = USABLE_GPU_MEMORY_FRACTION * system.gpu.memory_capacity_bytes - gpu_reserved_bytes
        # what-if pins (hw_model/pins.py): per layer, the experts pinned to the GPU and to the NDP units
        self._pin_sets, pool = pinned_pool(settings.pins, self.layers, pool)
        self._pin_cost_s = 0.0
        self.gpu_pool_bytes = max(0.0, pool)
        if self.policy_impl.keeps_residents:
            self.residency_cap_bytes = self.gpu_pool_bytes * settings.residency_fraction
            self.staging_cap_bytes = max(self.gpu_pool_bytes - self.residency_cap_bytes, largest_expert_bytes)
            self.residency_cap_bytes = max(
                0.0, min(self.residency_cap_bytes, self.gpu_pool_bytes - largest_expert_bytes)
            )
        else:
            self.residency_cap_bytes = 0.0
            self.staging_cap_bytes = max(self.gpu_pool_bytes, largest_expert_bytes)
        self.capacity = self._check_capacity()
        self._costs = ExpertCosts(system)
        self.context = RunContext(
            system=system,
            layers=self.layers,
            costs=self._costs,
            residency_cap_bytes=self.residency_cap_bytes,
            staging_cap_bytes=self.staging_cap_bytes,
            copy_sources=self.policy_impl.copy_sources(system.num_ndp_units),
            tensor_parallel=self.policy_impl.tensor_parallel,
            tuning=settings,
        )
        self._state = self.policy_impl.new_state(self.context)
        self._invocations = {phase: 0 for phase in PHASES}
        self._latency_s = {phase: 0.0 for phase in PHASES}
        self._busy_s: dict[str, float] = {}
        self._width = max(layer.num_experts for layer in self.layers)
        self._narrow_layers = {i for i, layer in enumerate(self.layers) if layer.num_experts < self._width}
        self._busy_counts: dict[int, list] = {}  # id(summary) -> [summary, invocations]: see _count_first_busy
        self._host_to_gpu_bytes = 0.0
        self._copy_bandwidth = self._costs.copy_bandwidth(self.context.copy_sources)
        self._ahead_queue: list[tuple[int, int, float]] = []  # (layer, expert, bytes left) predicted for next
        self._last_idle_pcie_s: dict[int, float] = {}  # per layer, the host-to-GPU idle time after its NDP work
        self._last_gap_s = 0.0  # the latest non-expert time handed over with advance_time_s
        self._median_of = -1  # summary(): len(decision_times_s) the cached median was computed over
        self._median_s = 0.0
        # what the energy model prices (hw_model.energy): the work folded with the busy time, prefetch and
        # look-ahead copies, and the non-expert time handed over
        self._work = [0.0] * 6
        self._pcie_bytes = 0.0
        self._copied_bytes = 0.0
        self._gap_total_s = 0.0

    @classmethod
    def from_settings(
        cls,
        settings: SimulationSettings,
        layers: Sequence[MoELayerShape],
        *,
        gpu_reserved_bytes: float = 0.0,
        weight_format: WeightFormat | str | None = None,
        quant_block_size: int = 32,
    ) -> MoESimulator:
        """A simulator of ``settings.system`` under ``settings`` (the way every entry builds one)."""
        return cls(
            settings.system,
            layers,
            settings,
            gpu_reserved_bytes=gpu_reserved_bytes,
            weight_format=weight_format,
            quant_block_size=quant_block_size,
        )

    def _check_capacity(self) -> CapacityCheck:
        """Expert bytes per DIMM (whole experts: the fullest home unit) against the DIMM capacity."""
        units = self.system.num_ndp_units
        capacity = self.system.ndp_unit.memory_capacity_bytes
        if units == 0:
            needed, capacity = 0.0, float("inf")
        elif self.policy_impl.layout == "whole":
            per_unit = np.zeros(units)
            for layer in self.layers:
                homes = np.bincount(np.arange(layer.num_experts) % units, minlength=units)
                per_unit += homes * layer.expert.weight_bytes()
            needed = float(per_unit.max())
        else:
            needed = sum(layer.num_experts * layer.expert.weight_bytes() for layer in self.layers) / units
            if self.policy_impl.layout == "dual":  # a whole copy on the home unit as well
                per_unit = np.zeros(units)
                for layer in self.layers:
                    homes = np.bincount(np.arange(layer.num_experts) % units, minlength=units)
                    per_unit += homes * layer.expert.weight_bytes()
                needed += float(per_unit.max())
        reasons = []
        if needed > capacity:
            reasons.append(
                f"experts need {human_bytes(needed)} per DIMM, a DIMM holds {human_bytes(capacity)} ({units} DIMMs)"
            )
        if self.gpu_pool_bytes <= 0:
            usable = USABLE_GPU_MEMORY_FRACTION * self.system.gpu.memory_capacity_bytes
            reasons.append(
                f"non-expert weights and the KV cache leave no GPU memory for experts "
                f"(of the {human_bytes(usable)} usable)"
            )
        return CapacityCheck(not reasons, "; ".join(reasons), needed, capacity, self.gpu_pool_bytes)

    def simulate_layer(self, layer_index: int, expert_token_counts: Sequence[int], phase: str) -> LayerResult:
        """One MoE layer invocation: ``expert_token_counts[e]`` tokens were routed to expert ``e``."""
        if not 0 <= layer_index < len(self.layers):
            raise WorkloadError(f"layer_index {layer_index} out of range (model has {len(self.layers)})")
        layer = self.layers[layer_index]
        counts = np.asarray(expert_token_counts, dtype=np.int64)
        if counts.shape != (layer.num_experts,):
            raise WorkloadError(
                f"{layer.name}: expected {layer.num_experts} non-negative expert token counts, got {counts.tolist()}"
            )
        return self.simulate_step(phase, counts[None, :], layers=[layer_index])[0]

    def simulate_step(
        self,
        phase: str,
        expert_token_counts: np.ndarray,
        *,
        layers: Sequence[int] | None = None,
        gap_before_layer_s: float = 0.0,
        predictions: Sequence[np.ndarray | None] | None = None,
    ) -> StepResult:
        """The MoE layer invocations of one forward step, in order: row ``i`` of ``expert_token_counts`` holds
        the tokens routed to each expert of layer ``layers[i]`` (default: every layer, in order; rows are as
        wide as the widest layer, zero beyond a layer's experts). Before each invocation the non-expert ops
        take ``gap_before_layer_s`` (see :meth:`advance_time_s`) and, for look-ahead policies,
        ``predictions[i]`` (when given and not None) is the predicted routing of layer ``layers[i] + 1``
        (see :meth:`predict_next`). The same as calling those methods and :meth:`simulate_layer` layer by
        layer, with the per-layer bookkeeping done for all of them at once."""
        if phase not in PHASES:
            raise WorkloadError(f"phase must be one of {PHASES}, got {phase!r}")
        indices: Sequence[int] = range(len(self.layers)) if layers is None else [int(i) for i in layers]
        counts = np.array(expert_token_counts, dtype=np.int64)  # a copy: results read it when first built
        active_rows = self._check_step(indices, counts)
        if not isinstance(indices, range) and indices == list(range(indices[0], indices[0] + len(indices))):
            indices = range(indices[0], indices[0] + len(indices))  # consecutive: rows of per-layer arrays by slice
        if predictions is not None and len(predictions) != len(indices):
            raise WorkloadError(f"expected {len(indices)} predictions (one per layer), got {len(predictions)}")
        state = self._state
        context = self.context
        policy = self.policy_impl
        prefetcher = state.prefetcher
        pin_sets = self._pin_sets
        policy.begin_step(context, state, indices, counts, phase)
        decode = phase == "decode"
        between = gap_before_layer_s > 0 or predictions is not None  # work before each invocation
        hit_counter = prefetcher if decode else None  # decode invocations count hits against the residency
        last_idle = self._last_idle_pcie_s if decode and policy.lookahead else None  # what predict_next reads
        records: list[tuple] = []  # per invocation: (plan, recomputed, hits, misses, bytes copied, added events)
        latencies: list[float] = []
        # totals summed in locals, one invocation after another (the same sums as layer-by-layer calls give)
        latency_total = self._latency_s[phase]
        host_to_gpu_total = self._host_to_gpu_bytes
        busy_counts = self._busy_counts
        scored = 0  # rows whose counts are already in the prefetcher's scores
        # index loops rather than zip(..., strict=True) in the hot paths: mypyc compiles those to C loops (a zip with
        # a keyword argument stays a Python call); the lengths are equal by construction (checked in _check_step)
        for i in range(len(active_rows)):
            layer_index = indices[i]
            active, active_tokens = active_rows[i]
            if between:
                if gap_before_layer_s > 0:
                    self.advance_time_s(gap_before_layer_s)
                prediction = predictions[i] if predictions is not None else None
                if prediction is not None:
                    self.predict_next(layer_index + 1, prediction)
            if layer_index == 0 and prefetcher is not None:  # it re-plans before layer 0 of a decode step
                if i > scored:  # its re-plan reads the scores of the layers run before it
                    prefetcher.add_scores(row_selector(indices[scored:i]), counts[scored:i])
                    scored = i
                prefetcher.before_invocation(layer_index, phase)
            # hits against the residency the invocation is scheduled with
            hits, misses = hit_counter.count_hits(layer_index, active) if hit_counter is not None else (0, 0)
            recomputed_before = state.recomputations
            out = InvocationLayout(context, state, layer_index, active, active_tokens)
            policy.place(context, state, out, phase)
            if pin_sets is not None:
                gpu_pins, ndp_pins = pin_sets[layer_index]
                if gpu_pins or ndp_pins:
                    self._pin_cost_s += out.repin(gpu_pins, ndp_pins)
            summary = out.summary
            copied = 0.0
            added: Sequence[tuple[str, float, float, str]] = ()
            latency = summary.latency_s
            if decode and prefetcher is not None and prefetcher.queued_bytes > 0 and context.tuning.eager_prefetch:
                latency += self._drain_during_ndp(summary)
            if self._ahead_queue or (prefetcher is not None and prefetcher.queued_bytes > 0):
                copied, added = self._drain_in_gaps(summary)
            latencies.append(latency)
            latency_total += latency
            if last_idle is not None:
                idle_s = 0.0
                for start_s, end_s in summary.idle_pcie:
                    idle_s += end_s - start_s
                last_idle[layer_index] = idle_s
            busy_count = busy_counts.get(id(summary))  # busy time is counted per summary: see _count_first_busy
            if busy_count is None:
                self._count_first_busy(summary)
            else:
                busy_count[1] += 1
            for resource, start_s, end_s, _ in added:
                self._busy_s[resource] = self._busy_s.get(resource, 0.0) + (end_s - start_s)
            self._copied_bytes += copied
            host_to_gpu_total += summary.host_to_gpu_bytes
            records.append((out, state.recomputations - recomputed_before, hits, misses, copied, added))
        if prefetcher is not None and scored < len(indices):
            prefetcher.add_scores(row_selector(indices[scored:]), counts[scored:])
        self._latency_s[phase] = latency_total
        self._host_to_gpu_bytes = host_to_gpu_total
        self._invocations[phase] += len(indices)
        return StepResult(
            phase, latencies, counts, records, self.layers, self.policy, self.has_prefetcher, policy.needs_ndp
        )

    @property
    def has_prefetcher(self) -> bool:
        return self._state.prefetcher is not None

    def _check_step(self, indices: Sequence[int], counts: np.ndarray) -> list[tuple[list[int], list[int]]]:
        """Reject a step's bad layer indices (every layer in order, a ``range``, is fine) and bad counts; returns
        each row's active experts and their token counts (:func:`_active_experts`, which the count checks read)."""
        width = self._width
        if not isinstance(indices, range):
            if not indices:
                raise WorkloadError("a step needs at least one layer")
            if min(indices) < 0 or max(indices) >= len(self.layers):
                raise WorkloadError(f"layer index out of range (model has {len(self.layers)} MoE layers): {indices}")
            if len(set(indices)) != len(indices):
                raise WorkloadError(f"a step simulates each layer at most once, got {indices}")
        if counts.ndim != 2 or counts.shape[0] != len(indices) or counts.shape[1] > width:
            raise WorkloadError(
                f"expected expert token counts of shape ({len(indices)}, {width}), got {list(counts.shape)}"
            )
        rows = _active_experts(counts)
        if self._narrow_layers:  # some layer is narrower than the rows
            for layer_index, (active, _) in zip(indices, rows, strict=True):
                if active and layer_index in self._narrow_layers and active[-1] >= self.layers[layer_index].num_experts:
                    experts = self.layers[layer_index].num_experts
                    raise WorkloadError(f"{self.layers[layer_index].name}: tokens routed beyond its {experts} experts")
        return rows

    def _count_first_busy(self, summary: LayoutSummary) -> None:
        """Busy time is added up lazily: invocations sharing a memoised summary are counted, not summed (the
        step's loop counts the later ones); this starts the count of a summary not counted yet."""
        if len(self._busy_counts) >= 4096:
            self._fold_busy()
        self._busy_counts[id(summary)] = [summary, 1]  # keeps the summary alive, so its id stays unique

    def _fold_busy(self) -> None:
        busy = self._busy_s
        work = self._work
        pcie = 0.0
        for summary, count in self._busy_counts.values():
            for resource, seconds in summary.busy.items():
                busy[resource] = busy.get(resource, 0.0) + count * seconds
            done = summary.work
            for j in range(len(done)):
                work[j] += count * done[j]
            pcie += count * (summary.host_to_gpu_bytes + summary.gpu_to_host_bytes)
        self._pcie_bytes += pcie
        self._busy_counts.clear()

    def predict_next(self, layer_index: int, predicted_counts: Sequence[int] | np.ndarray) -> None:
        """Look-ahead hint (policies with ``lookahead``): the experts the next router is predicted to pick for
        ``layer_index``. Their non-resident weights are copied into the staging area in idle PCIe time before
        that layer runs (hottest first, within the staging cap); a copy that completes in time costs that
        layer nothing. Other policies ignore it."""
        if not self.policy_impl.lookahead:
            return
        if not 0 <= layer_index < len(self.layers):
            raise WorkloadError(f"layer_index {layer_index} out of range (model has {len(self.layers)})")
        layer = self.layers[layer_index]
        counts = np.asarray(predicted_counts, dtype=np.int64)
        if counts.shape != (layer.num_experts,) or (counts < 0).any():
            raise WorkloadError(f"{layer.name}: expected {layer.num_experts} non-negative predicted counts")
        prefetcher = self._state.prefetcher
        resident = prefetcher.resident_sets[layer_index] if prefetcher is not None else set()
        size = layer.expert.weight_bytes()
        budget = self.staging_cap_bytes
        self._ahead_queue = []
        self._state.staged_ahead.pop(layer_index, None)
        # only as many copies as can finish before the layer runs: the PCIe time the current layer left idle after
        # its NDP work last time plus the non-expert time before the next layer, less what the prefetcher's own queue
        # takes of it first (a copy admitted beyond that is abandoned half done when the next prediction comes, its
        # bytes moved for nothing)
        window_s = self._last_idle_pcie_s.get(layer_index - 1, 0.0) + self._last_gap_s
        queued_bytes = prefetcher.queued_bytes if prefetcher is not None else 0.0
        budget = min(budget, window_s * self._copy_bandwidth - queued_bytes)
        for e in np.argsort(-counts, kind="stable").tolist():
            if counts[e] <= 0 or budget < size:
                break
            if e not in resident:
                self._ahead_queue.append((layer_index, e, size))
                budget -= size

    def _drain_ahead(self, seconds: float) -> float:
        """Copy predicted next-layer experts for ``seconds`` of idle PCIe time; returns bytes copied."""
        budget = seconds * self._copy_bandwidth
        copied = 0.0
        while budget > 0 and self._ahead_queue:
            layer, expert, left = self._ahead_queue[0]
            step = min(left, budget)
            budget -= step
            copied += step
            if step >= left:
                self._ahead_queue.pop(0)
                prefetcher = self._state.prefetcher
                if prefetcher is None or not prefetcher.adopt_staged(layer, expert):  # kept if the plan wants it
                    self._state.staged_ahead.setdefault(layer, set()).add(expert)
            else:
                self._ahead_queue[0] = (layer, expert, left - step)
        return copied

    def _drain_during_ndp(self, summary: LayoutSummary) -> float:
        """``eager_prefetch``: run queued prefetch copies while the NDP units work (the PCIe link is idle then, until
        the first idle window after them), their DRAM reads taking that time from the units they read: returns the
        seconds the invocation ends later (the copies' reads per DIMM at its streaming bandwidth)."""
        prefetcher = self._state.prefetcher
        assert prefetcher is not None
        window = summary.idle_pcie[0][0] if summary.idle_pcie else summary.latency_s
        window -= summary.busy.get("pcie", 0.0) + summary.busy.get("pcie_d2h", 0.0)
        if window <= 0:
            return 0.0
        copied = prefetcher.drain(window, self._copy_bandwidth)
        units = self.system.num_ndp_units
        if copied <= 0 or units == 0:
            return 0.0
        sources = max(1, self.context.copy_sources)
        return copied / sources / self.system.ndp_unit.achievable_bandwidth_bytes_per_s

    def _drain_in_gaps(self, summary: LayoutSummary) -> tuple[float, list[tuple[str, float, float, str]]]:
        """Run queued prefetch copies, then look-ahead copies, in this layer's idle PCIe (host to GPU) time once
        the NDP units are done (``summary.idle_pcie``); returns the bytes copied and the copies as plain
        ``(resource, start_s, end_s, label)`` tuples (made :class:`TimelineEvent` when read)."""
        prefetcher = self._state.prefetcher
        bandwidth = self._copy_bandwidth
        copied_total = 0.0
        events: list[tuple[str, float, float, str]] = []
        for start, end in summary.idle_pcie:  # the prefetcher's queue first (a resident expert helps every later token)
            if prefetcher is not None and prefetcher.queued_bytes:
                copied = prefetcher.drain(end - start, bandwidth)
                if copied:
                    copy_end = start + copied / bandwidth
                    events.append(("pcie", start, copy_end, "prefetch"))
                    copied_total += copied
                    start = copy_end
            if self._ahead_queue:
                ahead = self._drain_ahead(end - start)
                if ahead:
                    events.append(("pcie", start, start + ahead / bandwidth, "look-ahead copy"))
                    copied_total += ahead
            if not self._ahead_queue and (prefetcher is None or prefetcher.queued_bytes <= 0):  # nothing left
                break
        return copied_total, events

    def advance_time_s(self, seconds: float) -> float:
        """Time spent outside MoE layers (attention etc.) during which PCIe and the DIMMs are idle; prefetch
        copies use it. Returns the bytes copied. Optional: without it prefetches only use the MoE layers' idle
        PCIe time."""
        prefetcher = self._state.prefetcher
        if seconds <= 0:
            return 0.0
        self._last_gap_s = seconds
        self._gap_total_s += seconds
        budget = self._state.power_budget
        if budget is not None:  # a power-capped run counts this time at static power, as energy() does
            budget.charge_idle(self.context, seconds)
        copied = 0.0
        if prefetcher is not None:  # the prefetcher's queue first, look-ahead copies in what is left
            copied = prefetcher.drain(seconds, self._copy_bandwidth)
        if self._ahead_queue:
            copied += self._drain_ahead(seconds - copied / self._copy_bandwidth)
        self._copied_bytes += copied
        return copied

    @property
    def uses_ndp(self) -> bool:
        """Whether the run's NDP cores do work (the policy needs them, or some invocation ran on them); otherwise
        the DIMMs are priced as plain ones."""
        return self.policy_impl.needs_ndp or self._work[NDP_FLOPS] > 0

    def energy(self, elapsed_s: float | None = None, *, extra_gpu_busy_s: float = 0.0) -> EnergyReport | None:
        """The run's energy so far (:func:`hw_model.energy.run_energy`): the work of every invocation, the prefetch
        and look-ahead copies, over ``elapsed_s`` (default: the expert latency plus the non-expert time handed over
        with :meth:`advance_time_s`); ``extra_gpu_busy_s`` is non-expert GPU time to price (the GPU does it during
        ``elapsed_s``). ``None`` when the hardware has no energy tables."""
        self._fold_busy()
        if elapsed_s is None:
            elapsed_s = sum(self._latency_s.values()) + self._gap_total_s
        work = list(self._work)
        copied = self._copied_bytes
        work[GPU_BYTES] += copied
        work[COPY_DRAM_BYTES] += copied
        return run_energy(
            self.system,
            work,
            pcie_bytes=self._pcie_bytes + copied,
            elapsed_s=elapsed_s,
            busy_s=self._busy_s,
            dtype=self.layers[0].expert.dtype,
            uses_ndp=self.uses_ndp,
            extra_gpu_busy_s=extra_gpu_busy_s,
        )

    def summary(self) -> dict[str, Any]:
        """Run counters: invocations, expert latency per phase, placement recomputations and reuses,
        packer decision time (measured wall time, so not deterministic), bytes moved, prefetch or cache stats,
        busy seconds per resource, memory budgets and the capacity check."""
        return self.summary_snapshot().as_dict()

    def summary_snapshot(self) -> SummarySnapshot:
        """The values :meth:`summary` reports as of now, without building its dictionary (a session's reports take
        one per run and build the summary only if it is read)."""
        state = self._state
        times = state.decision_times_s
        if self._median_of != len(times):  # the median only changes when a decision was added
            self._median_of = len(times)
            self._median_s = median(times) if times else 0.0
        self._fold_busy()
        values: dict[str, Any] = {
            "policy": self.policy,
            "ndp_units": self.system.num_ndp_units,
            "invocations_prefill": self._invocations["prefill"],
            "invocations_decode": self._invocations["decode"],
            "expert_latency_prefill_s": self._latency_s["prefill"],
            "expert_latency_decode_s": self._latency_s["decode"],
            "placement_recomputations": state.recomputations,
            "placement_reuses": state.reuses,
            "decode_placement_recomputations": state.decode_recomputations,
            "decision_time_median_s": self._median_s,
            "on_demand_weight_bytes": state.on_demand_bytes,
            "host_to_gpu_bytes": self._host_to_gpu_bytes,
            "gpu_pool_bytes": self.gpu_pool_bytes,
            "residency_cap_bytes": self.residency_cap_bytes,
            "staging_cap_bytes": self.staging_cap_bytes,
            "feasible": self.capacity.feasible,
            "infeasible_reason": self.capacity.reason,
        }
        if self._pin_sets is not None:  # what the placement pins cost against the policy's own placement
            values["pin_cost_s"] = self._pin_cost_s
        budget = state.power_budget
        if budget is not None:  # a power-capped run (hw_model/power_cap.py)
            values["power_capped_invocations"] = budget.capped
            values["over_power_cap_invocations"] = budget.over_cap
        prefetch = state.prefetcher.stats_values() if state.prefetcher is not None else None
        cache = state.lru.stats_values() if state.lru is not None else None
        return SummarySnapshot(values, dict(self._busy_s), prefetch, cache)


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (not empty), computed as :func:`statistics.median` does: importing that module
    loads ``decimal`` and ``fractions`` (~3 ms of an ``ndp-ep run``, whose first report needs a median) and
    ``np.median`` loads ``numpy.ma`` (~10 ms)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def gpu_op_time_s(system: SystemSpec, flops: float, bytes_moved: float, dtype: str) -> float:
    """Time of one non-expert operation (attention, norm, router...) on the GPU."""
    return kernel_time_s(system.gpu, flops, bytes_moved, dtype, kernels=1)


def _active_experts(counts: np.ndarray) -> list[tuple[list[int], list[int]]]:
    """Per row of ``counts`` (one row per invocation): its active (non-zero) experts, ascending, and their token
    counts, as lists (policies look at a handful of experts each, where numpy's per-call cost would dominate);
    :class:`WorkloadError` if a count is negative. Found with one ``nonzero`` for the whole step, or, for a step
    of at most :data:`_SCAN_IN_PYTHON` counts (a small model's, as a session's report simulates), by scanning
    them as a list: fewer calls."""
    if counts.size <= _SCAN_IN_PYTHON:
        per_row = []
        for row in counts.tolist():
            experts = [e for e, c in enumerate(row) if c]
            per_row.append((experts, _non_negative([row[e] for e in experts])))
        return per_row
    if counts.shape[0] == 1:  # one invocation (simulate_layer): fewer array calls
        nonzero = counts[0].nonzero()[0]
        return [(nonzero.tolist(), _non_negative(counts[0, nonzero].tolist()))]
    width = counts.shape[1]
    flat = (counts != 0).ravel().nonzero()[0]  # row-major: by row, then by expert (a boolean array's is quicker)
    tokens = _non_negative(counts.ravel()[flat].tolist())  # a negative count is non-zero: listed
    expert_list = (flat % width).tolist()
    per_row = []
    start = 0
    for end in np.searchsorted(flat, np.arange(width, counts.size + 1, width)).tolist():
        per_row.append((expert_list[start:end], tokens[start:end]))
        start = end
    return per_row


def _non_negative(tokens: list[int]) -> list[int]:
    """``tokens`` (a step's non-zero expert token counts), or :class:`WorkloadError` if one is negative."""
    if tokens and min(tokens) < 0:
        raise WorkloadError("expert token counts must be non-negative")
    return tokens
