"""Numeric check of MoE block readings: the chosen reading must reproduce the block's real output.

Each candidate block is proven **in isolation**: its own region — the nodes the rewrite replaces, plus the
router nodes a fused op's plan inserts, plus any upstream nodes computable from the region's inputs (shape
arithmetic, constants) — becomes a small ONNX model whose inputs are the block's hidden state, expert ids and
routing weights (or, for a fused op, its router logits). ONNX Runtime runs it on random inputs of the right
shapes and dtypes (distinct expert ids per token, positive routing weights); each reading then recomputes the
block with :mod:`graph_passes.expert_math` (float32, dequantized weights) and the first reading whose output
matches within the tolerance of the weights' precision is kept. Nothing depends on guessing feeds for the
rest of the model (KV caches, masks, conv states, control flow elsewhere).

A region that is not self-contained (it reads some other computed value whose range is unknown) falls back
to one run of the whole model on the feeds :func:`graph_passes.feeds.random_feeds` builds; if that run fails
the block is skipped with the error. A block with no matching reading is skipped, never rewritten.

A block whose region would hold more than ``max_weight_bytes`` (a real model's layer of 128 experts) is proven on
its first :func:`sampled_expert_count` experts: the same region with every stacked expert tensor cut to those
experts (router logits narrowed to match), run on ids drawn among them, against each reading computed from the
same experts' stored bytes. Where those are external data, ONNX Runtime maps the first experts' bytes (a prefix
of each stacked tensor) from the model's own files, as it maps a model's data, rather than being handed copies.
The reading's arithmetic is the same for every expert, so this proves the reading while holding only a few
experts in memory; the convert note names the experts checked. Only a block that not even that sample can check
(per-expert initializers, a region that does not run cut down) keeps its best structural reading (the caller
reports that).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from graph_passes.blas import _openblas_local_threads_setter, single_threaded_blas_here  # noqa: F401 (re-exported)
from graph_passes.expert_math import ExpertArrays, expert_ffn, group_slots_by_expert, load_expert
from graph_passes.feeds import DecoderConfig, random_feeds
from graph_passes.graph_index import GraphIndex, live_nodes
from graph_passes.plan import MoEBlockPlan, MoECandidate, Skip
from graph_passes.probe_run import _capture, _fed_weights  # noqa: F401 (_fed_weights re-exported)
from graph_passes.region import (  # noqa: F401 (PROBE_SEQ_LEN re-exported)
    PROBE_SEQ_LEN,
    _empty_like,
    _random_region_feeds,
    _with_router_nodes,
    isolated_region,
)
from graph_passes.tensors import element_count
from graph_passes.weights import WeightStore

DEFAULT_MAX_WEIGHT_BYTES = 512 * 2**20
RTOL = 1e-4
ATOL = 1e-5
# relative tolerance (of the largest output magnitude) by weight precision: ONNX Runtime computes float16
# experts in float16 and may quantize activations for 8-bit experts; a wrong reading is off by O(1)
RELATIVE_TOLERANCE = {"float32": RTOL, "float16": 2e-2, "bfloat16": 5e-2, "int8": 2e-2, "int4": 2e-2}


@dataclass(frozen=True)
class Verdict:
    plan: MoEBlockPlan | None
    skip: Skip | None
    checked_numerically: bool
    max_abs_error: float | None = None
    isolated: bool = False  # checked on the block's own region (not a whole-model run)
    note: str = ""
    # a speculative verdict: ``plan`` is the reading the still-pending check is expected to confirm, and
    # ``deferred()`` runs that check (safe on another thread) and returns the real verdict
    deferred: Callable[[], Verdict] | None = None
    # the block whose numeric check proved this one's reading (same signature, see graph_passes.proof_sharing);
    # "" when checked on its own
    proven_by: str = ""


def reference_block(
    plan: MoEBlockPlan,
    store: WeightStore,
    x,
    ids,
    rw,
    activation_block: int = 0,
    operands: dict[int, ExpertArrays] | None = None,
) -> np.ndarray:
    """The block's output per ``plan``, computed expert by expert (float32) from the weights ``store.expert``
    reads (``activation_block``: see :func:`graph_passes.expert_math.expert_ffn`). ``operands``: a memo of the
    experts' float32 operands for ``plan``, filled here, so that another arithmetic of the same reading does not
    dequantize its experts again."""
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).astype(np.float32)
    ids2 = ids.reshape(-1, plan.top_k)
    rw2 = rw.reshape(-1, plan.top_k).astype(np.float32)
    out = np.zeros_like(x2)
    for expert, rows, slots in group_slots_by_expert(ids2, plan.num_experts):
        weights = operands.get(expert) if operands is not None else None
        if weights is None:
            weights = _float32_operands(plan, store.expert, expert)
            if operands is not None:
                operands[expert] = weights
        y = expert_ffn(plan, x2[rows], weights, activation_block)
        out[rows] += y * rw2.reshape(-1)[slots][:, None]
    return out.reshape(x.shape[:-1] + (hidden,))


def _float32_operands(plan: MoEBlockPlan, read_expert, expert: int) -> ExpertArrays:
    """Expert ``expert``'s weights as float32 ``x @ W`` operands. Float matrices are converted in their stored
    order (a transposed ``[out, in]`` source stays a transposed view, which BLAS multiplies as it is), so no
    transposing copy is made; quantized ones are dequantized, in their stored order too."""
    views = load_expert(plan, read_expert, expert, views=True)
    return ExpertArrays(
        **{
            f.name: None if (a := getattr(views, f.name)) is None else a.astype(np.float32, copy=False)
            for f in dataclasses.fields(views)
        }
    )


def _weight_bytes(plan: MoEBlockPlan, store: WeightStore) -> int:
    """The bytes of the block's expert matrices a check holds: at float32 size (the check dequantizes quantized
    matrices, an int4 one takes 8 times its packed size there, and ONNX Runtime's CPU kernels and the widened probe
    hold float16 and bfloat16 ones as float32)."""
    w = plan.weights
    inputs = {}
    for matrix, width in ((w.up, plan.hidden), (w.gate, plan.hidden), (w.down, plan.ffn)):
        if matrix is not None:
            for name in (matrix.initializer, *matrix.per_expert):
                if name:
                    inputs[name] = width if matrix.scales else 0
    total = 0
    for name, width in inputs.items():
        tensor = store.tensors[name]
        total += math.prod(tensor.dims[:2]) * width * 4 if width else element_count(tensor) * 4
    return total


def _tolerance(plan: MoEBlockPlan, expected: np.ndarray) -> float:
    scale = float(np.max(np.abs(expected.astype(np.float32)), initial=0.0))
    return ATOL + RELATIVE_TOLERANCE[plan.weight_dtype] * scale


def _arithmetics(plan: MoEBlockPlan) -> tuple[int, ...]:
    """How ONNX Runtime may multiply the block's experts: dequantized weights in float (0), and for quantized
    weights also int8 activations per quantization block (newer CPU QMoE kernels, see docs/genai.md). A reading
    is proven when either reproduces the output: the provider computes whichever the running ONNX Runtime does."""
    return (0, plan.quant_block_size) if plan.quantized else (0,)


def _judge(candidate: MoECandidate, store: WeightStore, captured: dict[str, np.ndarray], isolated: bool) -> Verdict:
    first = candidate.readings[0]
    x = captured[first.hidden_value]
    ids = captured[first.expert_ids_value]
    rw = captured[first.routing_weights_value]
    expected = captured[first.output_value].astype(np.float32)
    best_error = np.inf
    for reading in candidate.readings:
        # quantized experts are dequantized once per reading (held: the block is within the check's budget at
        # float32 size, see _weight_bytes); float ones have one arithmetic and are read as views
        operands: dict[int, ExpertArrays] | None = {} if reading.quantized else None
        for activation_block in _arithmetics(reading):
            try:
                got = reference_block(reading, store, x, ids, rw, activation_block, operands=operands)
            except ValueError:
                continue
            if got.shape != expected.shape:
                continue
            error = float(np.max(np.abs(got - expected))) if expected.size else 0.0
            best_error = min(best_error, error)
            if error <= _tolerance(reading, expected):
                return Verdict(reading, None, True, error, isolated)
    reason = (
        f"no reading of the expert computation reproduces its output "
        f"(best max abs error {best_error:.3g} over {len(candidate.readings)} readings)"
    )
    return Verdict(None, Skip(first.name, reason, first.replaced_nodes), True, best_error, isolated)


def choose_readings(
    model: onnx.ModelProto,
    candidates: list[MoECandidate],
    store: WeightStore,
    max_weight_bytes: int = DEFAULT_MAX_WEIGHT_BYTES,
    seed: int = 0,
    index: GraphIndex | None = None,
    decoder: DecoderConfig | None = None,
    defer_sampled: bool = False,
    share_proofs: bool = False,
) -> list[Verdict]:
    """Pick, for every candidate, the reading that reproduces its output (in isolation where possible).
    ``defer_sampled``: a block checked on its first experts gets a speculative verdict whose ``deferred`` check
    the caller runs later (for instance while it writes the conversion, committing only once it is confirmed).
    ``share_proofs``: a block with the signature of an earlier one is covered by that block's check
    (:mod:`graph_passes.proof_sharing`; its verdict's ``proven_by`` names it, and the caller must audit its shards)."""
    from graph_passes.proof_sharing import covered_verdict, representatives

    index = index if index is not None else GraphIndex(model)
    covered = representatives(model, index, candidates, store) if share_proofs else {}
    verdicts: dict[int, Verdict] = {}
    whole_model: list[MoECandidate] = []
    for position, candidate in enumerate(candidates):
        if position in covered:
            continue
        found = _own_verdict(model, index, candidate, store, max_weight_bytes, seed, defer_sampled)
        if found is None:
            whole_model.append(candidate)
        else:
            verdicts[position] = found
    if whole_model:
        fallback = _whole_model_verdicts(model, whole_model, store, seed, decoder)
        for candidate, verdict in zip(whole_model, fallback, strict=True):
            verdicts[candidates.index(candidate)] = verdict
    for position, first in covered.items():

        def own(candidate: MoECandidate = candidates[position]) -> Verdict:
            found = _own_verdict(model, index, candidate, store, max_weight_bytes, seed, False)
            return found if found is not None else _whole_model_verdicts(model, [candidate], store, seed, decoder)[0]

        verdicts[first], verdicts[position] = covered_verdict(
            candidates[first], verdicts[first], candidates[position], own
        )
    return [verdicts[position] for position in range(len(candidates))]


def _own_verdict(
    model: onnx.ModelProto,
    index: GraphIndex,
    candidate: MoECandidate,
    store: WeightStore,
    max_weight_bytes: int,
    seed: int,
    defer_sampled: bool,
) -> Verdict | None:
    """The verdict of ``candidate``'s own check: on its first experts when too large to check whole, else on its
    isolated region; None when the region cannot run alone (the caller checks it in a whole-model run)."""
    if _check_bytes(candidate.readings[0], store) > max_weight_bytes:
        return _sampled_verdict(model, index, candidate, store, max_weight_bytes, seed, defer_sampled)
    region = isolated_region(model, index, candidate.readings[0])
    if region is None:
        return None
    captured, note = None, ""
    for probe in (region, _widened_to_float32(region, store, (onnx.TensorProto.BFLOAT16,))[0]):
        if probe is None:
            continue
        try:
            feeds = _random_region_feeds(probe, candidate.readings[0], seed)
            captured = _capture(probe, store, feeds, map_files=True)
            break
        except Exception:  # ORT refusing the region (no kernel, an op it cannot run alone)
            note = "checked on float32 copies of its bfloat16 weights (ONNX Runtime CPU has no bfloat16 kernel)"
            continue
    if captured is None:
        return None
    verdict = _judge(candidate, store, captured, isolated=True)
    return dataclasses.replace(verdict, note=note) if verdict.plan is not None else verdict


def _whole_model_verdicts(
    model: onnx.ModelProto,
    candidates: list[MoECandidate],
    store: WeightStore,
    seed: int,
    decoder: DecoderConfig | None = None,
) -> list[Verdict]:
    """The fallback: one run of ``model`` (pruned to what the blocks need) on random feeds."""
    checkable, probe = _probe_model(model, candidates, store, DEFAULT_MAX_WEIGHT_BYTES)
    captured: dict[str, np.ndarray] = {}
    failure = ""
    if checkable:
        try:
            feeds = random_feeds(model, seed=seed, seq_len=PROBE_SEQ_LEN, config=decoder)
            captured = _capture(probe, store, feeds)
        except Exception as exc:  # onnxruntime raises its own exception types; all mean "cannot check"
            failure = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    verdicts = []
    for candidate in candidates:
        first = candidate.readings[0]
        if candidate not in checkable:  # too large to run: the best structural reading, reported by the caller
            verdicts.append(Verdict(candidate.readings[candidate.structural_choice], None, False))
            continue
        if failure:
            reason = f"its region cannot run alone and the whole model failed on random feeds ({failure[:200]})"
            verdicts.append(Verdict(None, Skip(first.name, reason, first.replaced_nodes), False))
            continue
        verdicts.append(_judge(candidate, store, captured, isolated=False))
    return verdicts


# ---------------------------------------------------------------------------------------- large blocks

SAMPLED_TOKENS = 2  # between them they pick every sampled expert (see _random_region_feeds)
SAMPLED_LOCATION = "first-experts"  # the location of the cut-down tensors' headers (their values are handed over)


def sampled_expert_count(plan: MoEBlockPlan) -> int:
    """How many experts a block too large to check whole is checked on: one more than top-k, so every token picks
    distinct experts and the picks vary (a wrong expert stride or layout shows on any expert but the first)."""
    return min(plan.num_experts, plan.top_k + 1)


def _stacked_expert_tensors(candidate: MoECandidate) -> set[str] | None:
    """The stacked ``[E, ...]`` initializers of every reading (weights, scales, zero points, biases), or None when
    a reading keeps one initializer per expert."""
    names: set[str] = set()
    for reading in candidate.readings:
        w = reading.weights
        for matrix in (w.up, w.gate, w.down):
            if matrix is None:
                continue
            if matrix.per_expert:
                return None
            names.update(n for n in (matrix.initializer, matrix.scales, matrix.zero_points) if n)
        names.update(b.initializer for b in (w.up_bias, w.gate_bias, w.down_bias) if b is not None)
    return names


def _first_experts(region: onnx.ModelProto, plan: MoEBlockPlan, names: set[str], experts: int) -> bool:
    """Cut ``region`` in place to the first ``experts`` experts: each of ``names`` becomes a header of
    ``[experts, ...]`` (values handed over at run time) and a fused op's router logits get ``experts`` columns.
    False when a tensor or the logits do not have the expert count where expected."""
    found = set()
    for position, tensor in enumerate(region.graph.initializer):
        if tensor.name not in names:
            continue
        if not tensor.dims or tensor.dims[0] != plan.num_experts:
            return False
        header = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=[experts, *tensor.dims[1:]])
        header.data_location = onnx.TensorProto.EXTERNAL
        header.external_data.add(key="location", value=SAMPLED_LOCATION)
        region.graph.initializer[position].CopyFrom(header)
        found.add(tensor.name)
    if found != names:
        return False
    router_reads = {i for n in plan.router_nodes for i in n.input}
    for value in region.graph.input:
        if value.name in router_reads:
            last = value.type.tensor_type.shape.dim[-1]
            if last.dim_value != plan.num_experts:
                return False
            last.dim_value = experts
    return True


def _mapped_first_experts(
    region: onnx.ModelProto, store: WeightStore, names: set[str], experts: int
) -> onnx.ModelProto | None:
    """A copy of the cut ``region`` (:func:`_first_experts`) whose cut tensors in external data name the first
    ``experts`` experts' bytes in their source's data file (the prefix of each stacked tensor), for ONNX Runtime to
    map from the model's folder (:func:`_capture`, ``map_files``; the others, small, stay handed over); None when
    none is in external data or one is bfloat16 (ONNX Runtime's CPU kernels cannot run it: it is widened from
    copies instead)."""
    if store.base_dir is None or any(store.tensors[n].data_type == onnx.TensorProto.BFLOAT16 for n in names):
        return None
    mapped = onnx.ModelProto()
    mapped.CopyFrom(region)
    count = 0
    for tensor in mapped.graph.initializer:
        source = store.tensors.get(tensor.name)
        if tensor.name not in names or source.data_location != onnx.TensorProto.EXTERNAL:
            continue
        count += 1
        _, offset, length = store.external_location(tensor.name)
        entries = {e.key: e.value for e in source.external_data}
        del tensor.external_data[:]
        tensor.external_data.add(key="location", value=entries["location"])
        tensor.external_data.add(key="offset", value=str(offset))
        tensor.external_data.add(key="length", value=str(length // source.dims[0] * experts))
    return mapped if count else None


def _widened_to_float32(
    probe: onnx.ModelProto,
    store: WeightStore,
    narrow: tuple[int, ...],
    held: dict[str, np.ndarray] | None = None,
) -> tuple[onnx.ModelProto | None, dict[str, np.ndarray]]:
    """``probe`` computing in float32 from float32 copies of its weights and inputs of the ``narrow`` float types
    (ONNX data types), or None when none is narrow or a node casts to a narrow type; and ``held`` (values handed
    over for the probe's header initializers, see :func:`_capture`) with the narrow ones widened.

    The semantics a reading must reproduce (layouts, activation, routing) do not depend on the float type, and
    float16/bfloat16 widen to float32 exactly: ONNX Runtime's CPU provider has no bfloat16 MoE kernel, and it
    multiplies float32 many times faster than float16.
    """
    held = held or {}
    if not _widens(probe, narrow):
        return None, held
    wide = onnx.ModelProto()
    wide.CopyFrom(probe)
    widened = dict(held)
    for position, tensor in enumerate(wide.graph.initializer):
        if tensor.data_type not in narrow:
            continue
        if tensor.name in held:  # a header: its values are handed over
            tensor.data_type = onnx.TensorProto.FLOAT
            widened[tensor.name] = held[tensor.name].astype(np.float32, copy=False)  # held wide already: no copy
        else:
            values = store.full(tensor.name).astype(np.float32)
            wide.graph.initializer[position].CopyFrom(onnx.numpy_helper.from_array(values, tensor.name))
    for value in wide.graph.input:
        if value.type.tensor_type.elem_type in narrow:
            value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return wide, widened


def _widens(probe: onnx.ModelProto, narrow: tuple[int, ...]) -> bool:
    """Whether :func:`_widened_to_float32` widens ``probe`` (some initializer is narrow, no node casts to narrow)."""
    if not any(t.data_type in narrow for t in probe.graph.initializer):
        return False
    return not any(a.name == "to" and a.i in narrow for node in probe.graph.node for a in node.attribute)


def _first_experts_of(store: WeightStore, name: str, experts: int, dtype: np.dtype | None = None) -> np.ndarray:
    """``name[:experts]`` of a stacked initializer, read expert by expert into one array of ``dtype`` (the stored
    one when None): a narrow tensor to be widened is converted as it is read, its bytes copied once."""
    first = store.expert(name, 0)
    out = np.empty((experts, *first.shape), dtype=first.dtype if dtype is None else dtype)
    out[0] = first
    for e in range(1, experts):
        out[e] = store.expert(name, e)
    return out


class _HeldExperts:
    """What a sampled check's readings read: the cut-down expert tensors it already holds (the first experts,
    possibly widened to float32), the store for anything else."""

    def __init__(self, store: WeightStore, held: Mapping[str, np.ndarray]) -> None:
        self._store = store
        self._held = held

    def expert(self, name: str, expert: int) -> np.ndarray:
        held = self._held.get(name)
        return held[expert] if held is not None else self._store.expert(name, expert)


def _sampled_verdict(
    model: onnx.ModelProto,
    index: GraphIndex,
    candidate: MoECandidate,
    store: WeightStore,
    max_weight_bytes: int,
    seed: int,
    defer: bool = False,
) -> Verdict:
    """The verdict on a block too large to check whole, from its first few experts (see the module docstring);
    the best structural reading when not even that can run. ``defer``: the expensive part (reading the experts,
    running ONNX Runtime, judging the readings) is returned as the speculative verdict's ``deferred`` check."""
    first = candidate.readings[0]
    structural = Verdict(candidate.readings[candidate.structural_choice], None, False)
    experts = sampled_expert_count(first)
    names = _stacked_expert_tensors(candidate)
    if names is None or experts >= first.num_experts:
        return structural
    if _check_bytes(first, store) * experts // first.num_experts > max_weight_bytes:
        return structural
    region = isolated_region(model, index, first, SAMPLED_TOKENS)
    if region is None or not _first_experts(region, first, names, experts):
        return structural

    def check() -> Verdict:
        narrow = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
        widen = _widens(region, narrow)
        mapped = _mapped_first_experts(region, store, names, experts)

        def held(wide: bool) -> dict[str, np.ndarray]:
            """The first experts of each stacked tensor, the narrow ones widened to float32 when ``wide``."""
            wanted = {n: np.dtype(np.float32) if wide and store.tensors[n].data_type in narrow else None for n in names}
            return {name: _first_experts_of(store, name, experts, dtype) for name, dtype in wanted.items()}

        def attempts():
            """The probe reading its first experts from their own files (ONNX Runtime maps them: nothing is copied
            here), then the widened probe (its weights read straight into float32), then the probe as stored."""
            if mapped is not None:
                inline = {n for n in names if store.tensors[n].data_location != onnx.TensorProto.EXTERNAL}
                yield mapped, {n: _first_experts_of(store, n, experts) for n in inline}, True
            if widen:
                yield (*_widened_to_float32(region, store, narrow, held(True)), False)
            yield region, held(False), False

        captured = None
        for probe, values, from_files in attempts():
            try:
                feeds = _random_region_feeds(probe, first, seed, experts)
                captured = _capture(probe, store, feeds, values, background=defer, map_files=from_files)
                break
            except Exception:  # ORT refusing the cut-down region (a shape that hard-codes the expert count)
                continue
        if captured is None:
            return structural
        verdict = _judge(candidate, _HeldExperts(store, values), captured, isolated=True)
        if verdict.plan is None:
            return verdict
        note = f"weights too large to check whole: checked on its first {experts} of {first.num_experts} experts"
        return dataclasses.replace(verdict, note=note)

    return dataclasses.replace(structural, deferred=check) if defer else check()


def _check_bytes(plan: MoEBlockPlan, store: WeightStore) -> int:
    """What checking ``plan``'s region may hold: its weights, plus the per-slot weight copies a gathered block
    materialises (a fused op computes expert by expert)."""
    extra = 0 if plan.router_nodes else _activation_bytes(plan, store)
    return _weight_bytes(plan, store) + extra


def _activation_bytes(plan: MoEBlockPlan, store: WeightStore) -> int:
    """What running the block may hold at once besides its weights: a copy of the selected experts' weights
    per routed slot (the gathered form materialises exactly that) for the probe's tokens."""
    per_expert = _weight_bytes(plan, store) // max(plan.num_experts, 1)
    return PROBE_SEQ_LEN * plan.top_k * per_expert


def _wanted_values(plan: MoEBlockPlan) -> list[str]:
    return [plan.hidden_value, plan.expert_ids_value, plan.routing_weights_value, plan.output_value]


def _probe_model(
    model: onnx.ModelProto, candidates: list[MoECandidate], store: WeightStore, max_weight_bytes: int
) -> tuple[list[MoECandidate], onnx.ModelProto]:
    """The candidates that can be checked, and a model computing exactly the values their check needs.

    Candidates are taken in order while the weights of every initializer the probe reads (the block's
    experts and everything upstream of it), plus the largest block's per-slot weight copies, stay within
    ``max_weight_bytes`` in total, so the check never holds much more than that. External initializers
    stay headers in the probe (the caller supplies arrays).
    """
    initializers = {t.name: t for t in model.graph.initializer}
    nodes = list(model.graph.node)  # references: trials below never copy a NodeProto
    chosen: list[MoECandidate] = []
    for candidate in candidates:
        reading = candidate.readings[0]
        if _weight_bytes(reading, store) > max_weight_bytes:
            continue
        trial = _with_router_nodes(nodes, reading)
        wanted = [v for c in [*chosen, candidate] for v in _wanted_values(c.readings[0])]
        _, reads = live_nodes(trial, wanted)
        activations = max(_activation_bytes(c.readings[0], store) for c in [*chosen, candidate])
        if sum(store.nbytes(n) for n in reads if n in initializers) + activations > max_weight_bytes:
            continue
        chosen.append(candidate)
        nodes = trial
    probe = _empty_like(model, model.graph.name)
    if not chosen:
        return chosen, probe
    wanted = list(dict.fromkeys(v for c in chosen for v in _wanted_values(c.readings[0])))
    nodes, reads = live_nodes(nodes, wanted)
    probe.graph.input.extend(model.graph.input)
    probe.graph.node.extend(nodes)
    probe.graph.initializer.extend(initializers[n] for n in initializers if n in reads)
    probe.graph.value_info.extend(v for v in model.graph.value_info if v.name in reads)
    for value in wanted:
        probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(value))
    return chosen, probe
