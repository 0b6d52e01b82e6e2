"""``tp+lb``: the ablation of tensor parallelism and the load-balancing packer, without prefetch.

With ``power_cap_w`` set (a tuning knob), it and the policies built on it (ours, ``+lookahead``) take the fastest
placement that keeps the run's average power within the cap (:mod:`hw_model.power_cap`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from hw_model.layout import InvocationLayout
from hw_model.policies.base import Policy, PolicyState
from hw_model.policies.drift import DriftTracker
from hw_model.policies.packing import _scheduled_gpu_set
from hw_model.policies.residency import _keep_copies
from hw_model.policies.splitting import balanced_split, record_split
from hw_model.power_cap import PowerBudget, capped_gpu_set
from hw_model.prefetch import ExpertPrefetcher
from hw_model.run_context import RunContext


class TensorParallelLoadBalanced(Policy):
    name = "tp+lb"
    role = "ablation"
    description = "tp + the load-balancing packer moving whole experts to the GPU where the layer ends sooner"
    source = "arXiv 2601.03992 (load-balancing-aware scheduler)"
    tensor_parallel = True
    layout = "sliced"
    balances_splits: ClassVar[bool] = False  # ours: one expert split between the GPU and the units (balance_split)

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
        cap = ctx.tuning.power_cap_w
        if cap > 0:  # the fastest placement that keeps the run's average power within the cap
            budget = state.power_budget
            if budget is None:
                budget = state.power_budget = PowerBudget(cap)
            if state.prefetcher is not None:
                budget.charge_copies(ctx, state.prefetcher.bytes_moved)
            on_gpu = capped_gpu_set(ctx, state, out, on_gpu, resident, budget)
            if state.prefetcher is not None:  # its copies in this invocation's idle time: what the bank pays for
                state.prefetcher.allowance_bytes = budget.copy_allowance_bytes()
        out.extra["resident_selected"] = float(sum(resident))
        split = None
        if self.balances_splits and ctx.tuning.balance_split and cap <= 0 and out.units:
            split = balanced_split(ctx, state, out, on_gpu, resident)
        if split is None:
            on_the_gpu = out.gpu_or_sliced(on_gpu, resident)
        else:
            on_the_gpu = record_split(out, on_gpu, resident, split[0], split[1])
            out.extra["split_parts"] = float(split[1])
            out.finish()
        if on_the_gpu:
            if phase == "prefill" and state.prefetcher is not None and ctx.tuning.adopt_prefill_copies:
                _adopt_prefill_copies(state.prefetcher, out, on_the_gpu)
            _keep_copies(ctx, state, layer_index, on_the_gpu, ctx.expert_bytes[layer_index])


def _adopt_prefill_copies(
    prefetcher: ExpertPrefetcher, out: InvocationLayout, on_the_gpu: list[tuple[int, bool]]
) -> None:
    """The prefill's copies of ``on_the_gpu`` (``(expert, resident)`` pairs) kept resident
    (:meth:`ExpertPrefetcher.adopt_prefill_copies`)."""
    tokens = dict(zip(out.active, out.active_tokens, strict=True))
    prefetcher.adopt_prefill_copies(out.layer_index, [(e, tokens[e]) for e, res in on_the_gpu if not res])
