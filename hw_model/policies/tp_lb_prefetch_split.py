"""``tp+lb+prefetch+split``: ours splitting one expert between GPU and NDP by the rule it had before its balancing
split (:func:`hw_model.policies.splitting.balanced_split`), kept to compare the two."""

from __future__ import annotations

from hw_model.layout import InvocationLayout
from hw_model.policies.base import PolicyState
from hw_model.policies.packing import _scheduled_gpu_set
from hw_model.policies.residency import _keep_copies
from hw_model.policies.splitting import _best_split
from hw_model.policies.tp_lb_prefetch import Ours
from hw_model.run_context import RunContext


class OursSplit(Ours):
    name = "tp+lb+prefetch+split"
    role = "extension"
    description = (
        "ours with the narrower split it had before its balancing split (issue 29): after the packer, the NDP expert "
        "with the most tokens runs 1/k of its FFN columns on the GPU (that part of its weights copied) and the rest "
        "sliced over the units, with k in 2..8 chosen by the packer's objective to end the layer soonest (only when "
        "it does)"
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
                _keep_copies(ctx, state, layer_index, [(e, res)], ctx.expert_bytes[layer_index])
            elif split is not None and e == out.active[split[0]]:
                out.split(e, tokens, split[1])
            else:
                out.sliced([e], [tokens])
        out.extra["resident_selected"] = float(sum(resident))
        out.extra["split_parts"] = float(split[1]) if split is not None else 0.0
        out.finish()
