"""Detection rules: each finds MoE blocks of some exported form and describes them as plans.

A rule is an object with ``name: str`` and ``find(index: GraphIndex) -> list[MoEBlockPlan | MoECandidate |
Skip]``; it never mutates the graph. Rules are tried in order; a block claimed by an earlier rule (same
output value) is not reported again.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from graph_passes.graph_index import GraphIndex
from graph_passes.plan import MoEBlockPlan, MoECandidate, Skip


class MoERule(Protocol):
    name: str

    def find(self, index: GraphIndex) -> list[MoEBlockPlan | MoECandidate | Skip]: ...


_RULE_CLASSES = (
    ("graph_passes.rules.fused_moe", "FusedMoERule"),
    ("graph_passes.rules.onehot_experts", "OneHotExpertsRule"),
    ("graph_passes.rules.gathered_experts", "GatheredExpertsRule"),
)


def default_rules() -> list[MoERule]:
    """The rules the converter runs, most specific first (modules not present are left out)."""
    rules: list[MoERule] = []
    for module_name, class_name in _RULE_CLASSES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        rules.append(getattr(module, class_name)())
    return rules
