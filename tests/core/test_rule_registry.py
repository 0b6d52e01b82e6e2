"""The default rule set comes from the rule modules' own ``@default_rule`` declarations, in their order."""

from __future__ import annotations

import pytest

from graph_passes import rules


def test_the_default_rules_are_the_decorated_classes_most_specific_first():
    assert [rule.name for rule in rules.default_rules()] == ["fused_moe", "onehot_experts", "gathered_experts"]


def test_a_decorated_rule_joins_the_default_set_at_its_place(monkeypatch):
    monkeypatch.setattr(rules, "_DEFAULT", dict(rules._DEFAULT))

    @rules.default_rule(order=15)
    class ProbeRule:
        name = "probe"

        def find(self, index):
            return []

    names = [rule.name for rule in rules.default_rules()]
    assert names == ["fused_moe", "probe", "onehot_experts", "gathered_experts"]


def test_a_class_that_is_not_a_rule_is_refused():
    with pytest.raises(TypeError, match="not a rule"):
        rules.default_rule(order=1)(type("NoFind", (), {"name": "no_find"}))
