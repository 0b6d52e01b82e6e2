"""``ndp-expert-per-unit``: the NDP-only baseline (whole experts on their home unit, no GPU)."""

from __future__ import annotations

from hw_model.layout import InvocationLayout
from hw_model.policies.base import Policy, PolicyState
from hw_model.run_context import RunContext


class NdpExpertPerUnit(Policy):
    name = "ndp-expert-per-unit"
    role = "baseline"
    description = "whole experts on NDP units, expert e on unit e mod N; no GPU, no tensor parallelism"
    source = "the NDP-only design point of NDP-DIMM papers (Hermes, HPCA 2025)"

    def place(self, ctx: RunContext, state: PolicyState, out: InvocationLayout, phase: str) -> None:
        out.whole_on_units(out.active, out.active_tokens)
        out.finish()
