"""``tp+lb+prefetch+lookahead``: ours with look-ahead prefetch of the next layer's predicted experts."""

from __future__ import annotations

from hw_model.policies.base import PolicyState
from hw_model.policies.tp_lb_prefetch import Ours


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
