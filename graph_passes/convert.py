"""The conversion pass: detect → plan → verify → emit, with every plan built before any mutation.

``convert(model_or_path, shards=...)`` returns the rewritten model (lazy weights) and a
:class:`ConversionReport` listing each rewritten block and each skipped candidate with its reason.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from graph_passes.errors import UnsupportedModelError
from graph_passes.graph_index import GraphIndex
from graph_passes.model_io import load_model
from graph_passes.plan import MoEBlockPlan, MoECandidate, Skip
from graph_passes.rewrite import RewrittenModel, apply_plans
from graph_passes.rules import MoERule, default_rules
from graph_passes.verify import DEFAULT_MAX_WEIGHT_BYTES, choose_readings
from graph_passes.weights import WeightStore

DEFAULT_SHARDS = 4


@dataclass(frozen=True)
class BlockReport:
    name: str
    rule: str
    num_experts: int
    top_k: int
    hidden: int
    ffn: int
    shards: int
    activation: str
    replaced_nodes: int
    checked_numerically: bool
    max_abs_error: float | None

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ConversionReport:
    blocks: tuple[BlockReport, ...] = ()
    skipped: tuple[Skip, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict:
        return {
            "moe_blocks": [b.to_json() for b in self.blocks],
            "skipped": [{"where": s.where, "reason": s.reason} for s in self.skipped],
            "notes": list(self.notes),
        }


def name_unnamed_nodes(model: onnx.ModelProto) -> None:
    """Give every unnamed node a unique name (rules and reports refer to nodes by name)."""
    taken = {n.name for n in model.graph.node if n.name}
    for position, node in enumerate(model.graph.node):
        if not node.name or node.name in ("",):
            candidate = f"{node.op_type}_{position}"
            while candidate in taken:
                candidate += "_"
            node.name = candidate
            taken.add(candidate)
    seen: set[str] = set()
    for position, node in enumerate(model.graph.node):
        if node.name in seen:
            node.name = f"{node.name}__{position}"
        seen.add(node.name)


def convert(
    source: str | Path | onnx.ModelProto,
    shards: int = DEFAULT_SHARDS,
    strict: bool = False,
    rules: list[MoERule] | None = None,
    max_check_weight_bytes: int = DEFAULT_MAX_WEIGHT_BYTES,
    base_dir: str | Path | None = None,
) -> tuple[RewrittenModel, ConversionReport]:
    """Convert every provable MoE block of ``source`` into sharded expert ops."""
    if not isinstance(shards, int) or shards < 1:
        raise UnsupportedModelError(f"shards must be a positive integer, got {shards!r}")
    model, data_dir = load_model(source)
    if isinstance(source, onnx.ModelProto):  # the caller's model: never mutate it (node names, small weights)
        model_copy = onnx.ModelProto()
        model_copy.CopyFrom(model)
    else:  # loaded here and private: no need to duplicate its embedded weights
        model_copy = model
    name_unnamed_nodes(model_copy)
    store = WeightStore(model_copy, base_dir if base_dir is not None else data_dir)
    index = GraphIndex(model_copy)

    candidates: list[MoECandidate] = []
    skipped: list[Skip] = []
    claimed_outputs: set[str] = set()
    claimed_nodes: set[str] = set()
    for rule in rules if rules is not None else default_rules():
        for found in rule.find(index):
            if isinstance(found, Skip):
                if not claimed_nodes.intersection(found.nodes):
                    skipped.append(found)
                continue
            candidate = found if isinstance(found, MoECandidate) else MoECandidate((found,))
            if candidate.output_value in claimed_outputs:
                continue
            if claimed_nodes.intersection(candidate.readings[0].replaced_nodes):
                skipped.append(Skip(candidate.name, "its nodes overlap a block another rule already claimed"))
                continue
            candidate = _with_unique_name(candidate, {c.name for c in candidates})
            claimed_outputs.add(candidate.output_value)
            claimed_nodes.update(candidate.readings[0].replaced_nodes)
            candidates.append(candidate)

    plans: list[MoEBlockPlan] = []
    shards_by_block: dict[str, int] = {}
    reports: list[BlockReport] = []
    notes: list[str] = []
    unsupported = [c for c in candidates if not all(_weights_supported(r, store) for r in c.readings[:1])]
    for candidate in unsupported:
        skipped.append(Skip(candidate.name, "expert weights are not float32 (only float32 is supported)"))
    candidates = [c for c in candidates if c not in unsupported]
    verdicts = choose_readings(model_copy, candidates, store, max_weight_bytes=max_check_weight_bytes)
    for verdict in verdicts:
        if verdict.skip is not None:
            skipped.append(verdict.skip)
            continue
        plan = verdict.plan
        block_shards = max(d for d in range(1, shards + 1) if plan.ffn % d == 0)
        if block_shards != shards:
            notes.append(f"{plan.name}: FFN width {plan.ffn} is not divisible by {shards}; using {block_shards} shards")
        shards_by_block[plan.name] = block_shards
        if not verdict.checked_numerically:
            notes.append(f"{plan.name}: weights too large for the numeric check; accepted on data-flow structure")
        plans.append(plan)
        reports.append(
            BlockReport(
                name=plan.name,
                **plan.summary(block_shards),
                replaced_nodes=len(plan.replaced_nodes),
                checked_numerically=verdict.checked_numerically,
                max_abs_error=verdict.max_abs_error,
            )
        )
    if strict and skipped:
        first = skipped[0]
        raise UnsupportedModelError(f"strict: block at {first.where} was skipped: {first.reason}")
    rewritten = apply_plans(model_copy, plans, shards_by_block, store)
    return rewritten, ConversionReport(tuple(reports), tuple(skipped), tuple(notes))


def _with_unique_name(candidate: MoECandidate, taken: set[str]) -> MoECandidate:
    """Block names prefix the shard initializers, so two blocks must never share one."""
    if candidate.name not in taken:
        return candidate
    suffix = 1
    while f"{candidate.name}_{suffix}" in taken:
        suffix += 1
    name = f"{candidate.name}_{suffix}"
    return dataclasses.replace(candidate, readings=tuple(dataclasses.replace(r, name=name) for r in candidate.readings))


def _weights_supported(plan: MoEBlockPlan, store: WeightStore) -> bool:
    w = plan.weights
    names = [m.initializer for m in (w.up, w.down, w.gate) if m is not None and m.initializer]
    names += [n for m in (w.up, w.down, w.gate) if m is not None for n in m.per_expert]
    return all(store.dtype_supported(n) for n in names)
