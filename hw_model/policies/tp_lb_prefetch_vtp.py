"""``tp+lb+prefetch+vtp``: ours with a tensor-parallel degree per expert (sliced or whole on its home unit)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from hw_model.layout import InvocationLayout
from hw_model.policies.base import PolicyState
from hw_model.policies.residency import _keep_copies
from hw_model.policies.splitting import variable_degree_choice
from hw_model.policies.tp_lb_prefetch import Ours
from hw_model.run_context import RunContext


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
                _keep_copies(ctx, state, layer_index, [(e, res[i])], ctx.expert_bytes[layer_index])
            elif whole[i]:
                out.whole_on_units([e], [tokens])
            else:
                out.sliced([e], [tokens])
        out.extra["resident_selected"] = float(sum(res))
        out.extra["whole_on_unit"] = float(whole.sum())
        out.finish()
