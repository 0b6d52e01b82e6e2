"""What a :class:`~hw_model.simulator.MoESimulator` hands back: one invocation's :class:`LayerResult`, a forward
step's :class:`StepResult` (its invocations' latencies, each invocation's result built on request), the
:class:`SummarySnapshot` behind :meth:`~hw_model.simulator.MoESimulator.summary` and the :class:`CapacityCheck`
of whether the experts fit.

Compiled with mypyc, as the simulator is (``native/compile_hw_model.py``): its step loop builds a result per step.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from mypy_extensions import mypyc_attr

from hw_model.energy import COPY_DRAM_BYTES, GPU_BYTES, NDP_FLOPS, EnergyReport, run_energy
from hw_model.hardware import SystemSpec
from hw_model.layout import InvocationLayout
from hw_model.prefetch import ExpertLRUCache, ExpertPrefetcher
from hw_model.timeline import LayerTimeline, TimelineEvent
from hw_model.workload import MoELayerShape

__all__ = ["CapacityCheck", "LayerResult", "StepResult", "SummarySnapshot"]


@dataclass(frozen=True)
class CapacityCheck:
    """Whether the experts fit the DIMMs and the GPU pool is positive; ``reason`` says what does not fit."""

    feasible: bool
    reason: str
    dimm_bytes_needed: float
    dimm_capacity_bytes: float
    gpu_pool_bytes: float


@mypyc_attr(acyclic=True)  # see InvocationLayout: what it holds never refers back to it
class LayerResult:
    """What one MoE layer invocation cost and where its experts ran.

    ``placement`` maps expert id to ``"gpu"``, ``"ndp"`` (tensor-parallel over all units), ``"ndpU"`` (whole on
    unit U) or ``"split"`` (lower bound). ``extra`` holds ``recomputed`` (1 if the placement was recomputed),
    ``prefetch_hits``/``prefetch_misses`` of this call, ``prefetch_bytes`` copied in its idle PCIe time.
    The timeline and the placement are built on first read (simulating needs neither).
    """

    __slots__ = (
        "layer_index",
        "phase",
        "tokens",
        "latency_s",
        "bytes_over_host_link",
        "extra",
        "policy",
        "reduction",
        "added_events",
        "needs_ndp",
        "_plan",
    )

    def __init__(
        self,
        layer_index: int,
        phase: str,
        tokens: int,
        plan: InvocationLayout,
        extra: Mapping[str, float],
        policy: str,
        added_events: tuple[TimelineEvent, ...] = (),
        needs_ndp: bool = True,
    ) -> None:
        summary = plan.summary
        self.layer_index = layer_index
        self.phase = phase
        self.tokens = tokens
        self.latency_s = summary.latency_s
        self.bytes_over_host_link = summary.host_to_gpu_bytes + summary.gpu_to_host_bytes
        self.extra = MappingProxyType(extra)
        self.policy = policy
        self.reduction = summary.reduction
        self.added_events = added_events
        self.needs_ndp = needs_ndp  # the policy keeps the NDP cores powered (hw_model.energy)
        self._plan = plan

    def __repr__(self) -> str:
        return (
            f"LayerResult(layer_index={self.layer_index}, phase={self.phase!r}, tokens={self.tokens}, "
            f"latency_s={self.latency_s!r}, policy={self.policy!r})"
        )

    @property
    def timeline(self) -> LayerTimeline:
        return self._plan.timeline

    @property
    def timeline_built(self) -> bool:
        """Whether :attr:`timeline` is already laid out (memoised invocations lay it out when first read)."""
        return self._plan.timeline_built

    @property
    def placement(self) -> Mapping[int, str]:
        return MappingProxyType(self._plan.placement)

    @property
    def events(self) -> tuple[TimelineEvent, ...]:
        """Every busy interval of the invocation (built on first access): the timeline's, then the prefetch
        and look-ahead copies run in its idle PCIe time."""
        return self.timeline.events + self.added_events

    def busy_s(self, resource: str) -> float:
        return self.busy_by_resource().get(resource, 0.0)

    @property
    def system(self) -> SystemSpec:
        """The system the invocation was simulated on."""
        return self._plan.ctx.system

    @property
    def dtype(self) -> str:
        """The dtype its experts compute in."""
        return self._plan.expert.dtype

    @property
    def work(self) -> tuple[float, ...]:
        """The invocation's work (:data:`hw_model.energy.WORK_FIELDS`), its prefetch copies included."""
        work = list(self._plan.summary.work)
        copied = self.extra.get("prefetch_bytes", 0.0)
        work[GPU_BYTES] += copied
        work[COPY_DRAM_BYTES] += copied
        return tuple(work)

    def energy(self, elapsed_s: float | None = None) -> EnergyReport | None:
        """The invocation's energy (:func:`hw_model.energy.run_energy`) over its latency (or ``elapsed_s``); ``None``
        when the hardware has no energy tables."""
        summary = self._plan.summary
        work = self.work
        copied = self.extra.get("prefetch_bytes", 0.0)
        return run_energy(
            self._plan.ctx.system,
            work,
            pcie_bytes=summary.host_to_gpu_bytes + summary.gpu_to_host_bytes + copied,
            elapsed_s=self.latency_s if elapsed_s is None else elapsed_s,
            busy_s=self.busy_by_resource(),
            dtype=self._plan.expert.dtype,
            uses_ndp=self.needs_ndp or work[NDP_FLOPS] > 0,
        )

    def busy_by_resource(self) -> dict[str, float]:
        """Busy seconds per resource (without building the timeline's events)."""
        busy = dict(self._plan.summary.busy)
        for event in self.added_events:
            busy[event.resource] = busy.get(event.resource, 0.0) + (event.end_s - event.start_s)
        return busy


@mypyc_attr(acyclic=True)
class StepResult:
    """The invocations of one :meth:`~hw_model.simulator.MoESimulator.simulate_step`: their latencies, and each
    invocation as a :class:`LayerResult` (``step[i]``, built on request)."""

    __slots__ = (
        "phase",
        "latencies_s",
        "latency_s",
        "_counts",
        "_records",
        "_layers",
        "_policy",
        "_prefetch",
        "_results",
        "_needs_ndp",
    )

    def __init__(
        self,
        phase: str,
        latencies_s: list[float],
        counts: np.ndarray,
        records: list,
        layers: Sequence[MoELayerShape],
        policy: str,
        has_prefetcher: bool,
        needs_ndp: bool,
    ) -> None:
        """``records`` holds per invocation (plan, recomputed, prefetch hits, misses, bytes copied, added events)
        of the simulator's ``layers`` under ``policy``; ``needs_ndp``: the policy keeps the NDP cores powered."""
        self.phase = phase
        self.latencies_s = latencies_s
        self.latency_s = sum(latencies_s)
        self._counts = counts
        self._records = records
        self._layers = layers
        self._policy = policy
        self._prefetch = has_prefetcher
        self._needs_ndp = needs_ndp
        self._results: dict[int, LayerResult] = {}

    def __len__(self) -> int:
        return len(self._records)

    @property
    def counts(self) -> np.ndarray:
        """The step's expert token counts, one row per invocation (the simulator's own copy; not to be modified)."""
        return self._counts

    def __getitem__(self, i: int) -> LayerResult:
        if i < 0:
            i += len(self._records)
        result = self._results.get(i)
        if result is None:
            plan, recomputed, hits, misses, copied, added = self._records[i]
            extra = dict(plan.extra)
            extra["recomputed"] = float(recomputed)
            if self._prefetch:
                extra["prefetch_hits"] = float(hits)
                extra["prefetch_misses"] = float(misses)
            extra["prefetch_bytes"] = copied
            layer_index = plan.layer_index
            tokens = -(-int(self._counts[i].sum()) // self._layers[layer_index].top_k)
            events = tuple(TimelineEvent(*event) for event in added)
            result = self._results[i] = LayerResult(
                layer_index, self.phase, tokens, plan, extra, self._policy, events, self._needs_ndp
            )
        return result

    def __iter__(self) -> Iterator[LayerResult]:
        return (self[i] for i in range(len(self._records)))


class SummarySnapshot:
    """What :meth:`~hw_model.simulator.MoESimulator.summary` reports, as the plain values of one moment;
    :meth:`as_dict` is the summary (the counters of ``values``, then ``busy_s`` sorted, then the prefetcher's or
    cache's stats)."""

    def __init__(
        self,
        values: dict[str, Any],
        busy_s: dict[str, float],
        prefetch: tuple[int, int, float, int, int, int, int, int] | None,
        cache: tuple[int, int, float] | None,
    ) -> None:
        self.values = values
        self.busy_s = busy_s
        self.prefetch = prefetch
        self.cache = cache

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.values)
        out["busy_s"] = dict(sorted(self.busy_s.items()))
        if self.prefetch is not None:
            out.update(ExpertPrefetcher.stats_of(self.prefetch))
        if self.cache is not None:
            out.update(ExpertLRUCache.stats_of(self.cache))
        return out
