"""Event timeline of one MoE layer invocation over the resources GPU, PCIe, NDP units and the DIMM-link.

    pcie_d2h  [act]                                              hidden states to the NDP units
    ndp0..N   .....[shard][shard][shard]                         each unit runs its jobs in order
    ndp_link                             [reduce]                TP partial sums to one unit (or not, see below)
    pcie      [w0][w1][w2]..........[out]                        expert weights to the GPU, NDP outputs back
    gpu           [e0][e1]   [e2]        [combine]               compute once its weights have arrived

GPU jobs are ordered by Johnson's rule (the optimal order of a two-stage copy-then-compute flow shop), so
weight copies overlap GPU compute. A weight copy reads its source DIMMs' DRAM, which the NDP cores streaming
the same ranks then lack: a unit ends no earlier than its DRAM time (its kernels' bytes plus the bytes copies
read from it, at its streaming bandwidth), shown as "DRAM reads for weight copies". NDP partial outputs are
reduced where it is cheaper: over the DIMM-link to one unit and then one PCIe copy, or each unit copying its
partial output to the GPU, which adds them.
The layer ends when the GPU has combined every expert's output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from hw_model.cost import kernel_time_s
from hw_model.hardware import SystemSpec
from hw_model.workload import MoELayerShape


class TimelineEvent(NamedTuple):
    """One busy interval of one resource (``gpu``, ``pcie``, ``pcie_d2h``, ``ndp0``..., ``ndp_link``).

    An immutable named tuple rather than a frozen dataclass: a bench run creates tens of millions of them.
    """

    resource: str
    start_s: float
    end_s: float
    label: str


class GpuJob(NamedTuple):
    """Expert work on the GPU: copy its weights (``transfer_s``, 0 when resident), then compute.

    An immutable named tuple (cheap to create: every GPU expert of every invocation makes one)."""

    label: str
    transfer_s: float
    compute_s: float
    transfer_bytes: float


@dataclass(frozen=True)
class LayerTimeline:
    """One invocation's timeline. ``base_events`` are the few GPU, PCIe and DIMM-link intervals; the per-job
    intervals of the NDP units are built only when :attr:`events` is read (``ndp_jobs[u]`` run back to back
    from ``ndp_start_s``, then unit ``u``'s DRAM reads for copies until ``ndp_end_s[u]``), so simulating does
    not create one object per NDP job. :meth:`busy_s` needs no events at all."""

    base_events: tuple[TimelineEvent, ...]
    latency_s: float
    host_to_gpu_bytes: float
    gpu_to_host_bytes: float
    reduction: str
    ndp_start_s: float = 0.0
    ndp_jobs: tuple[tuple[int, tuple[tuple[str, float], ...]], ...] = ()
    ndp_end_s: tuple[tuple[int, float], ...] = ()
    # the work done, per hw_model.energy.WORK_FIELDS (GPU FLOPs and memory bytes, NDP FLOPs and DRAM bytes, DIMM
    # bytes read for copies, DIMM-link bytes): what the energy model prices
    work: tuple[float, ...] = ()
    _events: list = field(default_factory=list, repr=False, compare=False)
    _busy: list = field(default_factory=list, repr=False, compare=False)

    @property
    def events(self) -> tuple[TimelineEvent, ...]:
        """Every busy interval: the base events, then each NDP unit's jobs (built on first access)."""
        if not self._events:
            out = list(self.base_events)
            ends = dict(self.ndp_end_s)
            for unit, jobs in self.ndp_jobs:
                resource = f"ndp{unit}"
                clock = self.ndp_start_s
                for label, seconds in jobs:
                    out.append(TimelineEvent(resource, clock, clock + seconds, label))
                    clock += seconds
                if ends[unit] > clock:
                    out.append(TimelineEvent(resource, clock, ends[unit], "DRAM reads for weight copies"))
            self._events.append(tuple(out))
        return self._events[0]

    @property
    def ndp_done_s(self) -> float:
        """When the last NDP unit finishes (0 without NDP work)."""
        return max((end for _, end in self.ndp_end_s), default=0.0)

    def busy_by_resource(self) -> dict[str, float]:
        """Busy seconds per resource, from the base events and the units' spans (no NDP events built)."""
        return dict(self.busy_map())

    def busy_map(self) -> dict[str, float]:
        """:meth:`busy_by_resource`, computed once and shared: read it, do not change it."""
        if self._busy:
            return self._busy[0]
        busy: dict[str, float] = {}
        for event in self.base_events:
            busy[event.resource] = busy.get(event.resource, 0.0) + (event.end_s - event.start_s)
        for unit, end in self.ndp_end_s:
            key = f"ndp{unit}"
            busy[key] = busy.get(key, 0.0) + (end - self.ndp_start_s)
        self._busy.append(busy)
        return busy


WORK_LENGTH = 6  # len(hw_model.energy.WORK_FIELDS): gpu FLOPs, gpu bytes, ndp FLOPs, ndp DRAM, copy DRAM, link bytes

_COMBINE_MEMO: dict[tuple, tuple[object, float]] = {}


def _combine_s(system: SystemSpec, layer: MoELayerShape, tokens: int, row_bytes: float) -> float:
    """GPU time of the weighted sum of ``top_k`` expert outputs over ``tokens`` rows (memoised per GPU object;
    the entry keeps its GPU alive, so an id is never reused for another one while cached)."""
    gpu = system.gpu
    key = (id(gpu), layer.top_k, layer.expert.hidden, layer.expert.dtype, tokens)
    entry = _COMBINE_MEMO.get(key)
    if entry is None or entry[0] is not gpu:
        if len(_COMBINE_MEMO) > 100_000:
            _COMBINE_MEMO.clear()
        flops = 2.0 * tokens * layer.top_k * layer.expert.hidden
        bytes_moved = (layer.top_k + 1) * tokens * row_bytes
        entry = _COMBINE_MEMO[key] = (gpu, kernel_time_s(gpu, flops, bytes_moved, layer.expert.dtype, kernels=1))
    return entry[1]


def johnson_order(jobs: list[GpuJob]) -> list[GpuJob]:
    """Johnson's rule for a two-machine flow shop (copy, then compute): minimises the GPU side's makespan."""
    if len(jobs) < 2:
        return list(jobs)
    first = sorted((j for j in jobs if j.transfer_s <= j.compute_s), key=lambda j: j.transfer_s)
    last = sorted((j for j in jobs if j.transfer_s > j.compute_s), key=lambda j: -j.compute_s)
    return first + last


def build_layer_timeline(
    system: SystemSpec,
    layer: MoELayerShape,
    tokens: int,
    unit_jobs: list[list[tuple[str, float]]],
    unit_tokens: list[int],
    gpu_jobs: list[GpuJob],
    tensor_parallel: bool,
    unit_dram_s: list[float] | None = None,
    work: list[float] | None = None,
) -> LayerTimeline:
    """Lay out one invocation. ``unit_jobs[u]`` are (label, seconds) run in order on NDP unit ``u``;
    ``unit_tokens[u]`` is how many token rows unit ``u``'s partial output has; ``tensor_parallel`` says whether
    the units' partial outputs are sums over the same rows (reducible over the DIMM-link); ``unit_dram_s[u]`` is
    unit ``u``'s DRAM busy time (its kernels' bytes and the weight copies reading it) when known; ``work`` the experts'
    work (:data:`hw_model.energy.WORK_FIELDS`), to which the combine and the DIMM-link reduction are added."""
    events: list[TimelineEvent] = []
    row_bytes = layer.expert.hidden * layer.expert.dtype_bytes
    active_units = [u for u, jobs in enumerate(unit_jobs) if jobs]
    d2h_bytes = 0.0
    ndp_start = 0.0
    if active_units:
        d2h_bytes = float(tokens * row_bytes)
        ndp_start = system.host_link.transfer_time_s(d2h_bytes)
        events.append(TimelineEvent("pcie_d2h", 0.0, ndp_start, "hidden states to NDP"))
    pcie_clock, gpu_clock, h2d_bytes = _lay_out_gpu_jobs(gpu_jobs, events)
    unit_end = _ndp_unit_ends(unit_jobs, active_units, ndp_start, unit_dram_s)
    outputs_ready = 0.0
    reduction = "none"
    link_bytes = 0.0
    if active_units:
        outputs_ready, reduction, link_bytes, h2d_bytes = _collect_ndp_outputs(
            system,
            tokens,
            row_bytes,
            unit_tokens,
            active_units,
            unit_end,
            tensor_parallel,
            pcie_clock,
            h2d_bytes,
            events,
        )

    # The weighted sum of the top-k expert outputs (and of NDP partial sums) on the GPU.
    combine_s = _combine_s(system, layer, tokens, row_bytes)
    start = max(gpu_clock, outputs_ready)
    events.append(TimelineEvent("gpu", start, start + combine_s, "combine"))
    done = list(work) if work is not None else [0.0] * WORK_LENGTH
    done[0] += 2.0 * tokens * layer.top_k * layer.expert.hidden  # the combine's FLOPs and bytes (as _combine_s)
    done[1] += (layer.top_k + 1) * tokens * row_bytes
    done[5] += link_bytes
    return LayerTimeline(
        tuple(events),
        start + combine_s,
        h2d_bytes,
        d2h_bytes,
        reduction,
        ndp_start_s=ndp_start,
        ndp_jobs=_ndp_jobs(unit_jobs, active_units),
        ndp_end_s=tuple(unit_end.items()),
        work=tuple(done),
    )


def _lay_out_gpu_jobs(gpu_jobs: list[GpuJob], events: list[TimelineEvent]) -> tuple[float, float, float]:
    """The GPU jobs in Johnson's order, each one's weight copy on PCIe before its compute on the GPU (their events
    appended to ``events``): returns when PCIe and the GPU are done with them and the bytes copied to the GPU."""
    pcie_clock = 0.0
    gpu_clock = 0.0
    h2d_bytes = 0.0
    for job in johnson_order(gpu_jobs):
        ready = 0.0
        if job.transfer_s > 0:
            events.append(TimelineEvent("pcie", pcie_clock, pcie_clock + job.transfer_s, f"{job.label} weights"))
            pcie_clock += job.transfer_s
            h2d_bytes += job.transfer_bytes
            ready = pcie_clock
        start = max(gpu_clock, ready)
        gpu_clock = start + job.compute_s
        events.append(TimelineEvent("gpu", start, gpu_clock, job.label))
    return pcie_clock, gpu_clock, h2d_bytes


def _ndp_unit_ends(
    unit_jobs: list[list[tuple[str, float]]], active_units: list[int], ndp_start: float, unit_dram_s: list[float] | None
) -> dict[int, float]:
    """When each active unit is done: its jobs back to back from ``ndp_start``, or its DRAM time if that is later."""
    unit_end: dict[int, float] = {}
    job_ends: dict[int, float] = {}  # id(job list) -> end: units given the same list (sliced experts) share it
    for unit in active_units:
        jobs = unit_jobs[unit]
        clock = job_ends.get(id(jobs))
        if clock is None:
            clock = ndp_start
            for _, seconds in jobs:
                clock += seconds
            job_ends[id(jobs)] = clock
        if unit_dram_s is not None and ndp_start + unit_dram_s[unit] > clock:
            clock = ndp_start + unit_dram_s[unit]
        unit_end[unit] = clock
    return unit_end


def _collect_ndp_outputs(
    system: SystemSpec,
    tokens: int,
    row_bytes: int,
    unit_tokens: list[int],
    active_units: list[int],
    unit_end: dict[int, float],
    tensor_parallel: bool,
    pcie_clock: float,
    h2d_bytes: float,
    events: list[TimelineEvent],
) -> tuple[float, str, float, float]:
    """Bring the active units' outputs to the GPU the cheaper way (their events appended to ``events``), PCIe free
    from ``pcie_clock``: returns when they are there, the reduction (``"gpu"`` or ``"dimm-link"``), the DIMM-link
    bytes and ``h2d_bytes`` with the output copies added."""
    link = system.host_link
    # Option A: each unit copies its partial output to the GPU (PCIe queue after the weight copies).
    clock_a = pcie_clock
    copies_a = []
    durations: dict[int, float] = {}  # per row count (tensor-parallel units all have the same)
    for unit in sorted(active_units, key=unit_end.__getitem__):
        start = max(clock_a, unit_end[unit])
        rows = unit_tokens[unit]
        duration = durations.get(rows)
        if duration is None:
            duration = durations[rows] = link.transfer_time_s(rows * row_bytes)
        copies_a.append((unit, start, start + duration))
        clock_a = start + duration
    option_a_end = clock_a
    option_b_end = float("inf")
    if tensor_parallel and len(active_units) > 1:
        # Option B: reduce the partial sums over the DIMM-link into one unit, then one PCIe copy.
        reduce_start = max(unit_end.values())
        reduce_s = (len(active_units) - 1) * system.ndp_link.transfer_time_s(tokens * row_bytes)
        copy_start = max(pcie_clock, reduce_start + reduce_s)
        option_b_end = copy_start + link.transfer_time_s(tokens * row_bytes)
    if option_b_end < option_a_end:
        link_bytes = float((len(active_units) - 1) * tokens * row_bytes)
        events.append(TimelineEvent("ndp_link", reduce_start, reduce_start + reduce_s, "reduce partial sums"))
        events.append(TimelineEvent("pcie", copy_start, option_b_end, "NDP output to GPU"))
        h2d_bytes += tokens * row_bytes
        return option_b_end, "dimm-link", link_bytes, h2d_bytes
    for unit, start, end in copies_a:
        events.append(TimelineEvent("pcie", start, end, f"ndp{unit} output to GPU"))
        h2d_bytes += unit_tokens[unit] * row_bytes
    return option_a_end, "gpu", 0.0, h2d_bytes


def _ndp_jobs(unit_jobs: list[list[tuple[str, float]]], active_units: list[int]) -> tuple:
    """``(unit, jobs)`` per active unit, one tuple per distinct job list (units may share one list)."""
    frozen: dict[int, tuple] = {}
    out = []
    for unit in active_units:
        jobs = unit_jobs[unit]
        jobs_tuple = frozen.get(id(jobs))
        if jobs_tuple is None:
            jobs_tuple = frozen[id(jobs)] = tuple(jobs)
        out.append((unit, jobs_tuple))
    return tuple(out)
