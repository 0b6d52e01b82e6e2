"""Detection rules: each finds MoE blocks of some exported form and describes them as plans.

A rule is a class with ``name: str`` and ``find(index: GraphIndex) -> list[MoEBlockPlan | MoECandidate | Skip]``;
it never mutates the graph. A module of this package adds its rule to the default set with the
:func:`default_rule` class decorator, giving its place in the order (most specific first); a block claimed by an
earlier rule (same output value) is not reported again. Adding a rule means adding its module here: the
package's modules are imported when the default set is first asked for.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Protocol

from graph_passes.graph_index import GraphIndex
from graph_passes.plan import MoEBlockPlan, MoECandidate, Skip
from graph_passes.sharded_op import DOMAIN, OP_TYPE, is_sharded_node


class MoERule(Protocol):
    name: str

    def find(self, index: GraphIndex) -> list[MoEBlockPlan | MoECandidate | Skip]: ...


_DEFAULT: dict[type, float] = {}  # rule class -> its place in the order


def default_rule(order: float):
    """Class decorator: a rule of the default set, tried in ascending ``order`` (specific forms first)."""

    def add(cls: type) -> type:
        if not isinstance(getattr(cls, "name", None), str) or not callable(getattr(cls, "find", None)):
            raise TypeError(f"{cls.__name__} is not a rule: it needs a name and a find(index) method")
        _DEFAULT[cls] = order
        return cls

    return add


def _rule_classes() -> tuple[type, ...]:
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return tuple(sorted(_DEFAULT, key=_DEFAULT.__getitem__))


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
    converted = sum(1 for n in index.graph.node if is_sharded_node(n))
    if converted:
        hint = f"the model already holds {converted} converted expert op(s) ({DOMAIN}::{OP_TYPE}): nothing to convert"
    elif fused:
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
