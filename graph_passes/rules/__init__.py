"""Detection rules: each finds MoE blocks of some exported form and describes them as plans.

A rule is a class with ``name: str`` and ``find(index: GraphIndex) -> list[MoEBlockPlan | MoECandidate | Skip]``;
it never mutates the graph. :data:`DEFAULT_RULES` lists the rule classes the converter runs, most specific
first; a block claimed by an earlier rule (same output value) is not reported again. Adding a rule means
adding its module here and its class to :data:`DEFAULT_RULES`.
"""

from __future__ import annotations

from typing import Protocol

from graph_passes.graph_index import GraphIndex
from graph_passes.plan import MoEBlockPlan, MoECandidate, Skip


class MoERule(Protocol):
    name: str

    def find(self, index: GraphIndex) -> list[MoEBlockPlan | MoECandidate | Skip]: ...


def _rule_classes() -> tuple[type, ...]:
    from graph_passes.rules.fused_moe import FusedMoERule
    from graph_passes.rules.gathered_experts import GatheredExpertsRule
    from graph_passes.rules.onehot_experts import OneHotExpertsRule

    return (FusedMoERule, OneHotExpertsRule, GatheredExpertsRule)


def default_rules() -> list[MoERule]:
    """One instance of every default rule, in the order they are tried."""
    return [rule_class() for rule_class in _rule_classes()]


def explain_no_anchor(index: GraphIndex) -> str:
    """Why no rule found an MoE block in the graph of ``index`` (what each rule anchors on, and what is there)."""
    fused = sum(1 for n in index.graph.node if n.domain == "com.microsoft" and n.op_type in ("MoE", "QMoE"))
    routers = sum(1 for n in index.graph.node if n.op_type in ("TopK", "ArgMax") and n.domain in ("", "ai.onnx"))
    stacked = {name for name, t in index.initializers.items() if len(t.dims) == 3 and t.dims[0] > 1}
    selections = [n for n in index.graph.node if n.op_type in ("Gather", "GatherND") and n.input]
    selected = {n.input[0] for n in selections if n.input[0] in stacked}
    facts = (
        f"{fused} com.microsoft.MoE/QMoE node(s), {routers} TopK/ArgMax router(s), {len(stacked)} stacked "
        f"[E, ., .] initializer(s), {len(selected)} of them selected by Gather/GatherND"
    )
    if fused:
        hint = "every fused op was skipped (see the reasons)"
    elif not routers:
        hint = "no router picks experts: this does not look like an MoE model"
    elif not selected:
        hint = (
            "a router exists but no stacked expert weights are selected by its ids: experts may be unrolled or "
            "computed densely; export with experts_implementation='batched_mm'"
        )
    else:
        hint = "stacked expert weights are selected, but no rule proved a block around them"
    return f"no MoE block anchored: {facts}; {hint}"
