"""``duplex``: the Duplex-style baseline (MICRO 2024), an Op/B split between GPU and NDP."""

from __future__ import annotations

from hw_model.layout import InvocationLayout
from hw_model.policies.base import Policy, PolicyState
from hw_model.run_context import RunContext


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
