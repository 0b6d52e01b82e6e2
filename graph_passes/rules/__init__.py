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
