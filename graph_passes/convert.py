"""The conversion pass: detect → plan → verify → emit, with every plan built before any mutation.

:func:`plan_conversion` decides; ``convert(model_or_path, shards=...)`` returns the rewritten model (lazy weights)
and a :class:`ConversionReport` listing each rewritten block and each skipped candidate with its reason (what
``ndp-ep convert`` prints and ``ndp-ep inspect`` lists: a block's ``replaced_nodes`` counts the nodes the rewrite
removed, which only :func:`convert` knows; a plan's report counts the nodes its rule matched).

With ``defer_checks`` the numeric checks of blocks too large to check whole (see :mod:`graph_passes.verify`)
are left pending: those blocks are planned on their structural reading, :class:`BackgroundChecks` runs the
checks while the caller stages its output, and :func:`settle` says whether every one confirmed its reading.
The caller commits nothing before that (``ndp_ep.convert_model`` converts again, checking first, when one
did not), so what is written is always what checking first would have written.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import onnx

from graph_passes import sharded_op
from graph_passes.blas import single_threaded_blas_here
from graph_passes.errors import UnsupportedModelError
from graph_passes.feeds import read_genai_config
from graph_passes.graph_index import GraphIndex
from graph_passes.model_io import load_model
from graph_passes.plan import MoEBlockPlan, MoECandidate, Skip
from graph_passes.rewrite import RewrittenModel, apply_plans
from graph_passes.rules import MoERule, default_rules, explain_no_anchor
from graph_passes.sharded_op import FLOAT_WEIGHT_DTYPE_OF_ONNX
from graph_passes.verify import DEFAULT_MAX_WEIGHT_BYTES, Verdict, choose_readings
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
    weight_dtype: str
    quant_block_size: int
    replaced_nodes: int
    checked_numerically: bool
    max_abs_error: float | None
    checked_in_isolation: bool = False
    proven_by: str = ""  # the block whose numeric check covers this one (same signature); "" when its own

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PendingCheck:
    """The numeric check of a block rewritten on a speculative reading (``plan``), still to run."""

    block: str
    plan: MoEBlockPlan
    check: Callable[[], Verdict]


@dataclass(frozen=True)
class ConversionReport:
    blocks: tuple[BlockReport, ...] = ()
    skipped: tuple[Skip, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    # blocks rewritten before their check ran (``convert(..., defer_checks=True)``): see :func:`settle`
    pending: tuple[PendingCheck, ...] = field(default=(), compare=False, repr=False)

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


@dataclass
class ConversionPlan:
    """Everything :func:`convert` decided before touching the graph."""

    model: onnx.ModelProto
    store: WeightStore
    plans: list[MoEBlockPlan]
    shards_by_block: dict[str, int]
    report: ConversionReport


def block_shards(plan: MoEBlockPlan, requested: int) -> int:
    """The largest shard count ≤ ``requested`` that splits the FFN width evenly (on quantization-block
    boundaries for quantized experts; one shard when the FFN width ends in a partial block)."""
    block = plan.quant_block_size if plan.quantized else 1
    return max(d for d in range(1, requested + 1) if d == 1 or (plan.ffn % d == 0 and (plan.ffn // d) % block == 0))


def plan_conversion(
    source: str | Path | onnx.ModelProto,
    shards: int = DEFAULT_SHARDS,
    strict: bool = False,
    rules: list[MoERule] | None = None,
    max_check_weight_bytes: int = DEFAULT_MAX_WEIGHT_BYTES,
    base_dir: str | Path | None = None,
    *,
    check: bool = True,
    defer_checks: bool = False,
    prove_every_block: bool = True,
) -> ConversionPlan:
    """Detect, plan and verify every MoE block of ``source``; nothing is rewritten or written. ``check=False``:
    the caller has just run :func:`graph_passes.model_check.check_model` on ``source`` itself.
    ``defer_checks``: blocks checked on their first experts are planned on their structural reading and their
    checks are left in ``report.pending``; the caller must run them and :func:`settle` the report before it
    commits anything (:class:`BackgroundChecks` runs them while the conversion is written).
    ``prove_every_block=False``: one numeric check per block signature (:mod:`graph_passes.proof_sharing`); the
    blocks it covers (``proven_by``) are proven only once :meth:`RewrittenModel.refuted_views` finds their shards,
    as written, exact byte views of their own weights: the caller asks before it commits anything."""
    if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
        raise UnsupportedModelError(f"shards must be a positive integer, got {shards!r}")
    model, data_dir = load_model(source, check=check)
    if isinstance(source, onnx.ModelProto):  # the caller's model: never mutate it (node names, small weights)
        model_copy = onnx.ModelProto()
        model_copy.CopyFrom(model)
    else:  # loaded here and private: no need to duplicate its embedded weights
        model_copy = model
    name_unnamed_nodes(model_copy)
    store = WeightStore(model_copy, base_dir if base_dir is not None else data_dir)
    index = GraphIndex(model_copy)

    candidates, skipped = _collect_candidates(index, rules if rules is not None else default_rules())

    plans: list[MoEBlockPlan] = []
    shards_by_block: dict[str, int] = {}
    reports: list[BlockReport] = []
    notes: list[str] = []
    if not candidates and not skipped:
        notes.append(explain_no_anchor(index))
    typed: list[MoECandidate] = []
    for candidate in candidates:
        found = _with_weight_dtype(candidate, store)
        (skipped if isinstance(found, Skip) else typed).append(found)
    decoder = None if isinstance(source, onnx.ModelProto) else read_genai_config(source)
    verdicts = choose_readings(
        model_copy,
        typed,
        store,
        max_weight_bytes=max_check_weight_bytes,
        index=index,
        decoder=decoder,
        defer_sampled=defer_checks,
        share_proofs=not prove_every_block,
    )
    pending: list[PendingCheck] = []
    for verdict in verdicts:
        if verdict.skip is not None:
            skipped.append(verdict.skip)
            continue
        plan = verdict.plan
        count = block_shards(plan, shards)
        if count != shards and plan.quantized and plan.ffn % plan.quant_block_size:
            notes.append(
                f"{plan.name}: FFN width {plan.ffn} ends in a partial quantization block of {plan.quant_block_size} "
                "(as ONNX Runtime's QMoE allows): using 1 shard"
            )
        elif count != shards:
            unit = f"multiple of the quantization block {plan.quant_block_size}" if plan.quantized else "integer"
            notes.append(
                f"{plan.name}: FFN width {plan.ffn} does not split into {shards} shards of {unit} width; "
                f"using {count} shards"
            )
        shards_by_block[plan.name] = count
        plans.append(plan)
        reports.append(_block_report(plan, count, verdict))
        if verdict.deferred is not None:
            pending.append(PendingCheck(plan.name, plan, verdict.deferred))
        else:
            notes.extend(_verdict_notes(verdict))
    if strict and skipped:
        first = skipped[0]
        raise UnsupportedModelError(f"strict: block at {first.where} was skipped: {first.reason}")
    report = ConversionReport(tuple(reports), tuple(skipped), tuple(notes), tuple(pending))
    return ConversionPlan(model_copy, store, plans, shards_by_block, report)


def _block_report(plan: MoEBlockPlan, shards: int, verdict: Verdict) -> BlockReport:
    return BlockReport(
        name=plan.name,
        **plan.summary(shards),
        replaced_nodes=len(plan.replaced_nodes),
        checked_numerically=verdict.checked_numerically,
        max_abs_error=verdict.max_abs_error,
        checked_in_isolation=verdict.isolated,
        proven_by=verdict.proven_by,
    )


def _verdict_notes(verdict: Verdict) -> list[str]:
    name = verdict.plan.name
    notes = [f"{name}: {verdict.note}"] if verdict.note else []
    if not verdict.checked_numerically:
        notes.append(f"{name}: weights too large for the numeric check; accepted on data-flow structure")
    return notes


def settle(report: ConversionReport, outcomes: Sequence[Verdict]) -> ConversionReport | None:
    """``report`` with its pending checks' ``outcomes`` (in order) filled in, or None when one of them did not
    confirm the reading its block was rewritten on (skipped, or another reading): then the rewrite is void and
    the caller converts again, checking first."""
    if len(outcomes) != len(report.pending):
        raise ValueError(f"expected {len(report.pending)} check outcomes, got {len(outcomes)}")
    blocks = {block.name: block for block in report.blocks}
    notes = list(report.notes)
    for pending, verdict in zip(report.pending, outcomes, strict=True):
        if verdict.plan != pending.plan:
            return None
        block = blocks[pending.block]
        blocks[pending.block] = replace(
            block,
            checked_numerically=verdict.checked_numerically,
            max_abs_error=verdict.max_abs_error,
            checked_in_isolation=verdict.isolated,
            proven_by=verdict.proven_by,
        )
        notes.extend(_verdict_notes(verdict))
    return replace(report, blocks=tuple(blocks.values()), notes=tuple(notes), pending=())


class BackgroundChecks:
    """Runs a report's pending checks, one after the other, on a thread of their own from construction on (ONNX
    Runtime and NumPy release the GIL, so they overlap the caller's writing); :meth:`settled` waits for them."""

    def __init__(self, report: ConversionReport) -> None:
        self._report = report
        self._outcomes: list[Verdict] = []
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ndp-ep-checks", daemon=True) if report.pending else None
        if self._thread is not None:
            self._thread.start()

    def _run(self) -> None:
        single_threaded_blas_here()  # the checks overlap the writer: no spinning BLAS pool (see there)
        try:
            self._outcomes = [pending.check() for pending in self._report.pending]
        except BaseException as exc:  # re-raised in the caller's thread by settled()
            self._failure = exc

    def settled(self) -> ConversionReport | None:
        """The settled report (see :func:`settle`; None when a check refuted its block's reading); a check that
        raised raises here."""
        if self._thread is None:
            return self._report
        self._thread.join()
        if self._failure is not None:
            raise self._failure
        return settle(self._report, self._outcomes)


def convert(
    source: str | Path | onnx.ModelProto,
    shards: int = DEFAULT_SHARDS,
    strict: bool = False,
    rules: list[MoERule] | None = None,
    max_check_weight_bytes: int = DEFAULT_MAX_WEIGHT_BYTES,
    base_dir: str | Path | None = None,
    *,
    check: bool = True,
    defer_checks: bool = False,
    prove_every_block: bool = True,
) -> tuple[RewrittenModel, ConversionReport]:
    """Convert every provable MoE block of ``source`` into sharded expert ops (``check``, ``defer_checks``,
    ``prove_every_block``: see :func:`plan_conversion`)."""
    planned = plan_conversion(
        source,
        shards,
        strict,
        rules,
        max_check_weight_bytes,
        base_dir,
        check=check,
        defer_checks=defer_checks,
        prove_every_block=prove_every_block,
    )
    audited = [block.name for block in planned.report.blocks if block.proven_by]
    rewritten = apply_plans(planned.model, planned.plans, planned.shards_by_block, planned.store, audited)
    # the rewrite also drops side nodes only the block used (shape arithmetic): count what the node records
    recorded = {
        sharded_op.block_of_node_name(node.name): len(sharded_op.get_metadata(node, sharded_op.META_REPLACED_NODES, []))
        for node in rewritten.model.graph.node
        if sharded_op.is_sharded_node(node)
    }
    blocks = tuple(
        replace(block, replaced_nodes=recorded.get(block.name, block.replaced_nodes)) for block in planned.report.blocks
    )
    return rewritten, replace(planned.report, blocks=blocks)


def _collect_candidates(index: GraphIndex, rules: list[MoERule]) -> tuple[list[MoECandidate], list[Skip]]:
    """Every rule's candidates in rule order; a block claimed by an earlier rule is not reported again."""
    candidates: list[MoECandidate] = []
    skipped: list[Skip] = []
    claimed_outputs: set[str] = set()
    claimed_nodes: set[str] = set()
    for rule in rules:
        for found in _find_fail_closed(rule, index):
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
    return candidates, skipped


def _find_fail_closed(rule: MoERule, index: GraphIndex) -> list:
    """The rule's findings; a rule that fails on a graph it was not written for finds nothing there (one ``Skip``
    saying so), so a broken or hostile graph is never rewritten and never ends the conversion with a traceback."""
    try:
        return list(rule.find(index))
    except (TypeError, ValueError, IndexError, KeyError, AttributeError, ZeroDivisionError, OverflowError) as exc:
        name = getattr(rule, "name", type(rule).__name__)
        return [Skip(name, f"rule {name} could not read this graph ({type(exc).__name__}: {exc}); nothing rewritten")]


def _with_unique_name(candidate: MoECandidate, taken: set[str]) -> MoECandidate:
    """Block names prefix the shard initializers, so two blocks must never share one."""
    if candidate.name not in taken:
        return candidate
    suffix = 1
    while f"{candidate.name}_{suffix}" in taken:
        suffix += 1
    name = f"{candidate.name}_{suffix}"
    return dataclasses.replace(candidate, readings=tuple(dataclasses.replace(r, name=name) for r in candidate.readings))


def _with_weight_dtype(candidate: MoECandidate, store: WeightStore) -> MoECandidate | Skip:
    """``candidate`` whose float readings carry the dtype their matrices have on disk (one dtype per block)."""
    first = candidate.readings[0]
    if first.quantized:
        return candidate
    w = first.weights
    names = [n for m in (w.up, w.down, w.gate) if m is not None for n in (m.initializer, *m.per_expert) if n]
    types = {store.tensors[n].data_type for n in names}
    if len(types) != 1 or next(iter(types)) not in FLOAT_WEIGHT_DTYPE_OF_ONNX:
        found = ", ".join(sorted(onnx.TensorProto.DataType.Name(t) for t in types))
        return Skip(candidate.name, f"expert weights of type {found} (one of float32, float16, bfloat16 expected)")
    dtype = FLOAT_WEIGHT_DTYPE_OF_ONNX[next(iter(types))]
    if dtype == first.weight_dtype:
        return candidate
    return dataclasses.replace(
        candidate, readings=tuple(dataclasses.replace(r, weight_dtype=dtype) for r in candidate.readings)
    )
