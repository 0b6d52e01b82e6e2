"""Scheduling under an average-power cap: the fastest placement of each invocation that keeps the run's average
power (the simulator's own energy accounting, :func:`hw_model.energy.run_energy`) within ``power_cap_w``.

The packer (:func:`hw_model.scheduler.pack`) gives the latency-optimal GPU set. If that invocation would take the
run above its cap, the candidates are that set with its copied (non-resident) experts returned to the NDP units a
one more at a time, fewest tokens first (they gain least from the GPU), then everything on the NDP units; the
fastest candidate within the budget is taken, or, when none is, the one of lowest average power. The budget is
cumulative, as an average is: ``cap x (time so far + this invocation) - joules so far`` (the prefetcher's copies
included, priced per byte as the simulator prices them), so an invocation under the cap banks energy a later one
may spend. The time the non-expert ops take between MoE layers (static power only in the simulator's accounting)
is not counted, which keeps the run within its cap whenever the cap is above the system's static power.
"""

from __future__ import annotations

from hw_model.energy import COPY_DRAM_BYTES, GPU_BYTES, WORK_FIELDS, run_energy
from hw_model.layout import InvocationLayout, LayoutState, LayoutSummary
from hw_model.run_context import RunContext


class PowerBudget:
    """A power-capped run's running totals: joules spent, seconds elapsed, prefetch bytes already charged, and the
    joules of each laid-out invocation summary (memoised by summary object)."""

    def __init__(self, cap_w: float) -> None:
        self.cap_w = cap_w
        self.spent_j = 0.0
        self.elapsed_s = 0.0
        self.charged_copy_bytes = 0.0
        self.copy_j_per_byte = -1.0  # priced on first use
        self.over_cap = 0  # invocations where no candidate fitted the budget
        self._energy: dict[int, tuple[LayoutSummary, float]] = {}

    def energy_j(self, ctx: RunContext, layer_index: int, summary: LayoutSummary) -> float:
        """The joules of one invocation laid out as ``summary`` (its work over its latency)."""
        known = self._energy.get(id(summary))
        if known is not None and known[0] is summary:
            return known[1]
        report = run_energy(
            ctx.system,
            summary.work,
            pcie_bytes=summary.host_to_gpu_bytes + summary.gpu_to_host_bytes,
            elapsed_s=summary.latency_s,
            busy_s=summary.busy,
            dtype=ctx.layers[layer_index].expert.dtype,
            uses_ndp=True,
        )
        joules = report.total_j if report is not None else 0.0
        if len(self._energy) > 50_000:
            self._energy.clear()
        self._energy[id(summary)] = (summary, joules)
        return joules

    def charge_copies(self, ctx: RunContext, copied_bytes: float) -> None:
        """Charge prefetch copies made since the last call (``copied_bytes``: the run's total so far)."""
        if self.copy_j_per_byte < 0:
            self.copy_j_per_byte = copy_joules_per_byte(ctx)
        new = copied_bytes - self.charged_copy_bytes
        if new > 0:
            self.spent_j += new * self.copy_j_per_byte
            self.charged_copy_bytes = copied_bytes

    def record(self, joules: float, seconds: float) -> None:
        self.spent_j += joules
        self.elapsed_s += seconds


def copy_joules_per_byte(ctx: RunContext) -> float:
    """What one byte copied from the DIMMs into GPU memory adds to the run's energy in the simulator's accounting
    (DRAM read, host side, PCIe, GPU memory write), found as the difference of two priced runs."""
    base = [0.0] * len(WORK_FIELDS)
    copied = list(base)
    copied[GPU_BYTES] = copied[COPY_DRAM_BYTES] = 1e6
    dtype = ctx.layers[0].expert.dtype
    one = run_energy(ctx.system, base, pcie_bytes=0.0, elapsed_s=1.0, busy_s={}, dtype=dtype, uses_ndp=True)
    two = run_energy(ctx.system, copied, pcie_bytes=1e6, elapsed_s=1.0, busy_s={}, dtype=dtype, uses_ndp=True)
    if one is None or two is None:
        return 0.0
    return (two.total_j - one.total_j) / 1e6


def capped_gpu_set(
    ctx: RunContext,
    state: LayoutState,
    out: InvocationLayout,
    on_gpu: list[bool],
    resident: list[bool],
    budget: PowerBudget,
) -> list[bool]:
    """The GPU set (per active expert of ``out``) to lay out: the packer's ``on_gpu`` if the run stays within
    ``budget`` with it, else the fastest candidate that does (module docstring); ``budget`` is charged for it."""
    layer_index = out.layer_index
    candidates = [on_gpu]
    movable = sorted(
        (i for i in range(len(on_gpu)) if on_gpu[i] and not resident[i]), key=lambda i: (out.active_tokens[i], i)
    )
    current = list(on_gpu)
    for i in movable:
        current = list(current)
        current[i] = False
        candidates.append(current)
    if any(current):
        candidates.append([False] * len(on_gpu))
    fastest: tuple[float, list[bool], float] | None = None  # (seconds, set, joules) within the budget
    lowest: tuple[float, list[bool], float, float] | None = None  # (average power, set, joules, seconds)
    on_demand = state.on_demand_bytes  # trial layouts count on-demand copies: put back after each
    for position, candidate in enumerate(candidates):
        trial = InvocationLayout(ctx, state, layer_index, out.active, out.active_tokens)
        trial.gpu_or_sliced(candidate, resident)
        state.on_demand_bytes = on_demand
        summary = trial.summary
        joules = budget.energy_j(ctx, layer_index, summary)
        seconds = summary.latency_s
        if budget.spent_j + joules <= budget.cap_w * (budget.elapsed_s + seconds):
            if position == 0:  # the packer's own choice fits: nothing else to weigh
                budget.record(joules, seconds)
                return candidate
            if fastest is None or seconds < fastest[0]:
                fastest = (seconds, candidate, joules)
        power = (budget.spent_j + joules) / max(budget.elapsed_s + seconds, 1e-30)
        if lowest is None or power < lowest[0]:
            lowest = (power, candidate, joules, seconds)
    if fastest is not None:
        budget.record(fastest[2], fastest[0])
        return fastest[1]
    assert lowest is not None
    budget.over_cap += 1
    budget.record(lowest[2], lowest[3])
    return lowest[1]
