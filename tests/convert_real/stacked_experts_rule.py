"""A test-only rule: the TorchScript matcher restricted to the dynamo exporter's ``GatherND`` selections.

Used as an independent check of the dynamo fixtures next to the general gathered-experts rule.
"""

from __future__ import annotations

from graph_passes.rules.onehot_experts import OneHotExpertsRule


class StackedExpertsRule(OneHotExpertsRule):
    """The same structural matcher for the dynamo exporter's ``GatherND`` selections only (no eager report).

    For registering next to :class:`OneHotExpertsRule` as a fallback (or replacement) of the general
    gathered-experts rule on dynamo exports.
    """

    name = "stacked_experts"

    def __init__(self) -> None:
        super().__init__(claim_gathernd=True, claim_gather=False, report_eager=False)
