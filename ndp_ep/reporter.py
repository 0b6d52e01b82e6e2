"""Simulated-latency reports built from the routing the native provider recorded.

During ``run`` the library appends one record per compiled MoE node invocation to the session's routing log:
how many token slots each expert was routed (counters, not ids). A :class:`SessionReporter` drains that log
only when a report is asked for, groups the records by run, and simulates the runs it has not seen yet, in run
order, on one :class:`hw_model.simulator.MoESimulator` (so the prefetcher's state evolves across runs). Reports
live in a bounded ring (``report_ring``, default :data:`DEFAULT_REPORT_RING`) next to running aggregates that
never grow, so a long session stays small and ``last_report`` costs only the runs that happened since the last
call.

Non-expert work (attention, norms, the router) is costed on the GPU from the run's input shapes
(:class:`ndp_ep.costing.NonExpertCoster`), which ``ndp_ep.InferenceSession`` tags every run with. Runs that
were not tagged (a plain ONNX Runtime session, io binding) report the expert side
only and say so in their notes, as does every report of a model whose MoE blocks were skipped.

Runs on other threads may be in flight when a report is read. A tagged run is reported once all its layers are
recorded or its ``run`` has returned (``SessionReporter.run_finished``); until then its records are held.
An untagged run's end is not known: the newest run, when incomplete, is held until the next read. When the
library's log overflowed (records nobody read, ``routing_capacity``), runs it cut short are left out, counted
in :attr:`Aggregates.dropped_runs`, and the reports built next say how many records were lost. With pre-gating on
(:mod:`ndp_ep.pregating`) each run's report carries its hits, and a look-ahead policy simulates the run with its
predicted counts.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from graph_passes.sharded_op import FLOAT_WEIGHT_DTYPE_OF_ONNX, QUANTIZED_WEIGHT_DTYPES
from hw_model.hardware import DTYPE_BYTES, SystemSpec
from hw_model.settings import SimulationSettings
from hw_model.workload import ExpertShape, MoELayerShape, WeightFormat
from ndp_ep.ep import RoutingReader, check_positive
from ndp_ep.errors import NdpEpError
from ndp_ep.partition import ClaimedNode, claim
from ndp_ep.report import RunReport, StepLayers, simulated_summary

DEFAULT_REPORT_RING = 256
DEPLOYMENT_DTYPE = "bf16"  # what float experts are costed in unless a dtype is given
UNTAGGED_RUN_BASE = 1 << 40  # native/src/routing_log.h kUntaggedRunBase: run ids the library numbered itself
MAX_PENDING_SHAPES = 4096  # input shapes of tagged runs not yet reported (oldest forgotten first)
Shapes = tuple[tuple[str, tuple[int, ...]], ...]  # a run's input shapes, (name, shape) in feed order
EMPTY_RUN_NOTE = "the run had no tokens (a zero-size input): no expert work"
UNTAGGED_NOTE = "non-expert GPU work not costed: the run's input shapes are unknown (untagged run)"
_NOT_RUNNING: frozenset[int] = frozenset()


@dataclass
class Aggregates:
    """Running totals over every reported run of a session (constant size)."""

    runs: int = 0
    tokens: int = 0
    simulated_s: float = 0.0
    moe_s: float = 0.0
    non_expert_gpu_s: float = 0.0
    layer_invocations: list[int] = field(default_factory=list)
    layer_expert_tokens: list[int] = field(default_factory=list)
    dropped_records: int = 0  # routing records the library's log dropped unread (it keeps ``routing_capacity``)
    dropped_runs: int = 0  # runs left out because the log dropped some of their records

    def to_json(self) -> dict:
        return {
            "runs": self.runs,
            "tokens": self.tokens,
            "simulated_s": self.simulated_s,
            "moe_s": self.moe_s,
            "non_expert_gpu_s": self.non_expert_gpu_s,
            "layer_invocations": list(self.layer_invocations),
            "layer_expert_tokens": list(self.layer_expert_tokens),
            "dropped_records": self.dropped_records,
            "dropped_runs": self.dropped_runs,
        }


class SessionReporter:
    """Reports of one provider session (see the module docstring)."""

    def __init__(
        self,
        model,
        settings: SimulationSettings,
        session_key: str,
        *,
        report_ring: int = DEFAULT_REPORT_RING,
        claimed: tuple[ClaimedNode, ...] | None = None,
        notes: Sequence[str] = (),
        untagged_shapes: Callable[[int], Mapping[str, tuple[int, ...]] | None] | None = None,
    ) -> None:
        if report_ring is None:  # check_positive lets None (an option not given) through
            raise NdpEpError("report_ring must be a positive integer, got None")
        check_positive("report_ring", report_ring)
        # imported here, not with the module: a session imports the simulator while ONNX Runtime builds its own
        from hw_model.simulator import MoESimulator

        self.settings = settings
        self.system = settings.system
        self.policy = settings.policy  # also without MoE layers to simulate
        dtype = settings.dtype
        self.dtype = dtype or DEPLOYMENT_DTYPE
        self.claimed = claim(model) if claimed is None else claimed
        # an explicit dtype costs every expert's weights in it; otherwise quantized experts move the bytes they
        # are stored in (packed values and scales) and float experts are costed in the deployment dtype
        formats = [None] * len(self.claimed) if dtype is not None else stored_weight_formats(model, self.claimed)
        self.layers = [
            MoELayerShape(
                name=c.spec.layer,
                num_experts=c.spec.num_experts,
                top_k=c.spec.top_k,
                expert=ExpertShape(c.spec.hidden, c.spec.ffn, c.spec.gated, self.dtype, weight_format),
            )
            for c, weight_format in zip(self.claimed, formats, strict=True)
        ]
        self.weights = describe_weights(self.dtype, formats)
        self._layer_of_node = {c.name: c.index for c in self.claimed}
        self.notes = tuple(notes)
        if not self.layers:
            self.notes += ("the model has no MoE block the provider runs: there is no expert work to simulate",)
        self.non_expert_weight_bytes = non_expert_weight_bytes(model, self.claimed, self.dtype)
        self.simulator = (
            MoESimulator.from_settings(settings, self.layers, gpu_reserved_bytes=self.non_expert_weight_bytes)
            if self.layers
            else None
        )
        if self.simulator is not None and not self.simulator.capacity.feasible:
            self.notes += (
                f"this configuration does not fit, its latencies are simulated as if it did: "
                f"{self.simulator.capacity.reason}",
            )
        self._layer_names = [layer.name for layer in self.layers]
        self._hidden = self.layers[0].expert.hidden if self.layers else 0
        self._layer_widths = [layer.num_experts for layer in self.layers]
        # non-expert GPU seconds of the input shapes costed, and the sequences (batch) they hold
        self._costed: dict[Shapes, tuple[float, int]] = {}
        self._model = model
        self._unconverted_moe = _unconverted_moe_ops(model)
        if self._unconverted_moe:
            self.notes += (
                f"{len(self._unconverted_moe)} fused MoE op(s) not converted are costed as dense GPU work "
                "(all their experts' weights read, top-k experts per token computed)",
            )
        self._untagged_notes = (*self.notes, UNTAGGED_NOTE)
        self._coster = None  # built on first use: ONNX shape inference is not needed for the expert side
        self._reader = RoutingReader(session_key)
        self._native_layers: list[int] = []  # native layer index -> our layer index
        self._every_layer = tuple(range(len(self.layers)))
        self._native_order: list[int] | None = None  # native index of each of our layers, once known
        self._lock = threading.Lock()
        self._ring: deque[RunReport] = deque(maxlen=report_ring)
        self._shapes: dict[int, Shapes] = {}  # run tag -> its input shapes
        self._running: set[int] = set()  # tags of the runs whose ``run`` has not returned
        # run_finished(tag): the run tagged ``tag`` returned (or failed), so every record it made is in the log. The
        # set's own method, not a Python one: ``run`` calls it right after ONNX Runtime's run, where each object
        # touched is out of the caches (~0.6 us less). No lock: _update copies the set before it reads the log
        self.run_finished: Callable[[int], None] = self._running.discard
        self._held: tuple[list, list, list, list, np.ndarray] | None = None  # the records of runs that may still run
        self._lost = 0  # records the log dropped that no report has said so yet
        self._cut: set[int] = set()  # held runs whose records the log may have dropped
        self._width = max((layer.num_experts for layer in self.layers), default=0)
        # input shapes of an untagged run from its tokens, when the caller knows them (ndp-ep generate does)
        self._untagged_shapes = untagged_shapes
        self.capture = None  # a RoutingCapture (hw_model/routing_capture.py) while routing is captured (routing.py)
        # run id -> its PreGatingRun (ndp_ep/pregating.py) when the session predicts experts a layer ahead (slots.py)
        self.pre_gating_source: Callable[[int], object] | None = None
        self.aggregates = Aggregates(
            layer_invocations=[0] * len(self.layers), layer_expert_tokens=[0] * len(self.layers)
        )

    @property
    def report_ring(self) -> int:
        return self._ring.maxlen or 0

    def tag_run(self, tag: int, input_shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Remember the input shapes of the run ONNX Runtime will record under ``tag`` (a positive integer, new
        for each run), which is running until ``run_finished(tag)``."""
        with self._lock:
            self._shapes[tag] = tuple(input_shapes.items())
            if len(self._shapes) > MAX_PENDING_SHAPES:
                self._shapes.pop(next(iter(self._shapes)))
            self._running.add(tag)

    def add_run_without_moe(self, tag: int, input_shapes: Mapping[str, tuple[int, ...]]) -> None:
        """A run of a model without provider nodes: only its GPU cost is reported."""
        with self._lock:
            self._add_run(tuple(input_shapes.items()), None, (), (), None)

    # -- reading ----------------------------------------------------------------------------------------
    @property
    def reports(self) -> list[RunReport]:
        """The newest reports (at most ``report_ring``), oldest first."""
        with self._lock:
            self._update()
            return list(self._ring)

    @property
    def last_report(self) -> RunReport | None:
        with self._lock:
            self._update()
            return self._ring[-1] if self._ring else None

    def _update(self) -> None:
        if self.simulator is None:
            return
        # before the log is read: a tagged run not in this copy had recorded everything by then
        running = self._running.copy() if self._running else _NOT_RUNNING
        run_ids, native_layers, tokens, totals, counts = self._reader.take(self._width)
        if self._held is not None:  # the records of runs that were possibly still running at the last read
            held_ids, held_layers, held_tokens, held_totals, held_counts = self._held
            run_ids, native_layers = held_ids + run_ids, held_layers + native_layers
            tokens, totals = held_tokens + tokens, held_totals + totals
            counts = np.concatenate([held_counts, counts])
            self._held = None
        if not run_ids:
            return
        dropped = self._reader.dropped()
        overflowed = dropped != self.aggregates.dropped_records  # since the last read
        if overflowed:
            self._lost += dropped - self.aggregates.dropped_records
            self.aggregates.dropped_records = dropped
        if native_layers == self._native_order and run_ids.count(run_ids[0]) == len(run_ids):
            # the usual read after each run: that run's records, its layers in order
            notes = ()
            if self._lost:
                notes = self._loss_notes()
                self._lost = 0
            if self._cut:
                self._cut.discard(run_ids[0])
            shapes = self._shapes_of(run_ids[0], max(tokens))
            self._add_run(shapes, self._every_layer, tokens, totals, counts, notes, run_id=run_ids[0])
            return
        runs: list[tuple[int, dict[int, int]]] = []  # (run id, layer -> its record)
        open_runs: dict[int, int] = {}
        for record, (run_id, native_layer) in enumerate(zip(run_ids, native_layers, strict=True)):
            layer = self._layer_index(native_layer)
            position = open_runs.get(run_id)
            if position is None or layer in runs[position][1]:  # a layer twice: the next run of an untagged caller
                position = open_runs[run_id] = len(runs)
                runs.append((run_id, {}))
            runs[position][1][layer] = record
        layer_count, last = len(self.layers), len(runs) - 1
        held: list[int] = []  # the records of the runs held, in log order
        done: list[tuple[int, dict[int, int]]] = []
        for position, (run_id, records) in enumerate(runs):
            if len(records) < layer_count:
                # a tagged run may still be running until it returned (it is in ``running``, or else its shapes
                # wait for its report); an untagged one, only if it is the newest
                if run_id in running or (position == last and run_id not in self._shapes):
                    held += records.values()
                    if overflowed:  # while it ran: some of its records may be gone
                        self._cut.add(run_id)
                    continue
                if overflowed or run_id in self._cut:  # cut short by the overflow: not a run of its own
                    self._cut.discard(run_id)
                    self._shapes.pop(run_id, None)
                    self.aggregates.dropped_runs += 1
                    continue
            elif self._cut:
                self._cut.discard(run_id)
            done.append((run_id, records))
        if held:
            held.sort()
            self._held = (
                [run_ids[row] for row in held],
                [native_layers[row] for row in held],
                [tokens[row] for row in held],
                [totals[row] for row in held],
                counts[held],  # a copy: ``counts`` may be the reader's buffer
            )
        if not done:
            return
        notes = self._loss_notes() if self._lost else ()
        self._lost = 0
        for run_id, records in done:
            layers = sorted(records)
            rows = [records[layer] for layer in layers]
            first = rows[0]
            in_order = rows == list(range(first, first + len(rows)))  # the usual case: a slice, not a copy
            run_tokens = [tokens[row] for row in rows]
            self._add_run(
                self._shapes_of(run_id, max(run_tokens)),
                layers,
                run_tokens,
                [totals[row] for row in rows],
                counts[first : first + len(rows)] if in_order else counts[rows],
                notes,
                run_id=run_id,
            )

    def _loss_notes(self) -> tuple[str, ...]:
        """The note of the reports built after the log overflowed."""
        from ndp_ep.text import plural

        return (
            f"the routing log overflowed: {plural(self._lost, 'record')} dropped unread since the previous report "
            "(it keeps the newest routing_capacity; read reports more often or raise it); the runs they belonged "
            "to are not reported",
        )

    def _shapes_of(self, run_id: int, tokens: int) -> Shapes | None:
        """The input shapes of a run being reported (``tokens``: its token slots, the most any of its MoE layers
        ran): those it was tagged with, else (an untagged run, reported in run order) those the caller gives for an
        untagged run of ``tokens`` tokens (None: it does not know them), else None."""
        shapes = self._shapes.pop(run_id, None)
        if shapes is None and run_id >= UNTAGGED_RUN_BASE and self._untagged_shapes is not None:
            given = self._untagged_shapes(tokens)
            shapes = tuple(given.items()) if given is not None else None
        return shapes

    def _layer_index(self, native_layer: int) -> int:
        while len(self._native_layers) <= native_layer:
            names = self._reader.layer_names()
            self._native_layers = [self._layer_of_node.get(name, -1) for name in names]
            native_of = {layer: native for native, layer in enumerate(self._native_layers) if layer >= 0}
            self._native_order = [native_of.get(layer, -1) for layer in self._every_layer]
            if len(self._native_layers) <= native_layer:
                raise NdpEpError(f"routing record of unknown layer {native_layer}")
        layer = self._native_layers[native_layer]
        if layer < 0:
            raise NdpEpError(f"the provider ran a node this session did not claim ({native_layer})")
        return layer

    # -- simulation -------------------------------------------------------------------------------------
    def prepare_costing(self, input_shapes: Mapping[str, Sequence[int]] | None = None) -> None:
        """Build the non-expert costing now rather than at the first report, and cost ``input_shapes`` (the
        coming runs' input shapes, when known) ahead."""
        with self._lock:
            self._non_expert_coster()
            if input_shapes is not None:
                self._cost(tuple((name, tuple(int(d) for d in shape)) for name, shape in input_shapes.items()))

    def non_expert_cost(self, input_shapes: Mapping[str, Sequence[int]]):
        """The non-expert work of a run with these input shapes (:class:`ndp_ep.costing.GpuCost`, remembered per
        shapes, so the run's report reuses it): its GPU cost and its largest working set."""
        with self._lock:
            coster = self._non_expert_coster()
            return coster.cost({name: tuple(int(d) for d in shape) for name, shape in input_shapes.items()})

    def _non_expert_coster(self):
        if self._coster is None:
            from ndp_ep.costing import NonExpertCoster

            self._coster = NonExpertCoster(self._model, self.system, self.dtype)
        return self._coster

    def _cost(self, shapes: Shapes) -> tuple[float, int, tuple[str, ...]]:
        """Non-expert GPU seconds of a run with these input shapes, the sequences it holds (its batch) and the notes
        its costing needs (nodes it could not cost), remembered per shapes."""
        costed = self._costed.get(shapes)
        if costed is None:
            input_shapes = dict(shapes)
            from ndp_ep.costing import MAX_COSTED_SHAPES  # imported with the coster just built

            cost = self._non_expert_coster().cost(input_shapes)
            seconds = cost.time_s
            if self._unconverted_moe:
                seconds += sum(
                    op.gpu_seconds(self.system, _tokens_of(input_shapes, op.hidden), self.dtype)
                    for op in self._unconverted_moe
                )
            hidden = self._hidden or (self._unconverted_moe[0].hidden if self._unconverted_moe else 0)
            if len(self._costed) >= MAX_COSTED_SHAPES:
                self._costed.pop(next(iter(self._costed)))
            costed = self._costed[shapes] = (
                seconds,
                _sequences_of(input_shapes, hidden),
                _uncosted_notes(cost.uncosted),
            )
        return costed

    def _add_run(
        self,
        shapes: Shapes | None,
        layers: Sequence[int] | None,
        layer_tokens: Sequence[int],
        totals: Sequence[int],
        counts: np.ndarray | None,
        extra_notes: tuple[str, ...] = (),
        run_id: int | None = None,
    ) -> None:
        """Simulate one run, append its report to the ring and add it to the aggregates. Its routing: its MoE
        layers in order (None for a model without provider nodes), each one's tokens, expert token total (the
        sum of its counts) and expert counts (the rows of ``counts``). ``extra_notes`` follow the usual ones."""
        if shapes is None:  # unknown input shapes: every token slot is taken for a sequence of its own
            notes, gpu_s, sequences = self._untagged_notes, 0.0, 1
        else:
            notes = self.notes
            gpu_s, sequences, cost_notes = self._cost(shapes)
            if cost_notes:
                notes += cost_notes
        if extra_notes:
            notes += extra_notes
        if layers is not None and not any(layer_tokens):  # a zero-size batch or sequence: nothing to simulate
            layers, notes = None, (*notes, EMPTY_RUN_NOTE)
        a = self.aggregates
        if layers is None:
            tokens = 0
            if shapes and self._unconverted_moe:  # tokens of the skipped MoE ops' input
                tokens = _tokens_of(dict(shapes), self._unconverted_moe[0].hidden)
            report = RunReport(
                run_index=a.runs,
                hardware=self.system.name,
                ndp_units=self.system.num_ndp_units,
                policy=self.policy,
                dtype=self.dtype,
                weights=self.weights,
                phase=_phase(tokens, sequences),
                tokens=tokens,
                non_expert_gpu_s=gpu_s,
                layers=(),
                simulator=simulated_summary(self.simulator.summary_snapshot()) if self.simulator is not None else {},
                notes=notes,
            )
            moe_s = 0.0
        else:
            tokens = max(layer_tokens)
            phase = _phase(tokens, sequences)
            pre_gating = self.pre_gating_source(run_id) if self.pre_gating_source is not None else None
            # attention and other GPU work precede each MoE layer; prefetch copies may use that PCIe idle time
            step = self.simulator.simulate_step(  # layers=None: every layer, in order (fewer checks)
                phase,
                counts,
                layers=None if len(layers) == len(self.layers) else layers,  # sorted and distinct
                gap_before_layer_s=gpu_s / len(layers),
                predictions=self._lookahead_predictions(pre_gating, layers),
            )
            system = self.system
            report = RunReport.of_step(
                a.runs,
                system.name,
                system.num_ndp_units,
                self.policy,
                self.dtype,
                self.weights,
                phase,
                tokens,
                gpu_s,
                StepLayers(layers, self._layer_names, self._layer_widths, layer_tokens, step.counts, step),
                self.simulator.summary_snapshot(),
                notes,
                pre_gating=pre_gating.hits if pre_gating is not None else None,
            )
            moe_s = sum(step.latencies_s)  # report.moe_s: the layers' latencies summed once
            invocations, expert_tokens = a.layer_invocations, a.layer_expert_tokens
            for index, total in zip(layers, totals, strict=True):  # a row is zero beyond its layer's experts
                invocations[index] += 1
                expert_tokens[index] += total
        self._ring.append(report)
        if self.capture is not None:
            self.capture.add_step(report.phase, layers, layer_tokens, counts, gpu_s, gpu_s + moe_s, run_id)
        a.runs += 1
        a.tokens += tokens
        a.simulated_s += gpu_s + moe_s  # report.simulated_latency_s
        a.moe_s += moe_s
        a.non_expert_gpu_s += gpu_s

    def _lookahead_predictions(self, pre_gating, layers: Sequence[int]) -> list | None:
        """A look-ahead policy's predictions for the run's invocations: before layer ``l`` runs, layer ``l + 1``'s
        expert counts its pre-gating predicted from ``l``'s hidden state (None for a layer without); None for
        other policies or a run without pre-gating."""
        if pre_gating is None or not self.simulator.policy_impl.lookahead:
            return None
        predicted = pre_gating.predicted_counts
        return [predicted[index + 1] if index + 1 < len(predicted) else None for index in layers]


def _uncosted_notes(uncosted: Sequence[str]) -> tuple[str, ...]:
    """The note of a run whose costing left nodes out (``uncosted``: ``name (op type)`` each), or none."""
    if not uncosted:
        return ()
    from collections import Counter

    kinds = Counter(label[label.rfind("(") + 1 : -1] for label in uncosted)
    listed = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items(), key=lambda item: (-item[1], item[0])))
    return (f"{len(uncosted)} non-expert node(s) not costed (shape inference gives them no shape): {listed}",)


def _phase(tokens: int, sequences: int) -> str:
    """Decode when each of the run's ``sequences`` has one token, prefill when more; token slots that do not
    split evenly over them count as one sequence."""
    if sequences > 1 and tokens % sequences == 0:
        tokens //= sequences
    return ("prefill" if tokens > 1 else "decode") if tokens else "unknown"


def stored_weight_formats(model, claimed: Sequence[ClaimedNode]) -> list[WeightFormat | None]:
    """How each claimed node's expert weights are stored: quantized ones as packed values with their block size and
    the scale dtype the model has; None for float experts (costed in the deployment dtype)."""
    quantized = {c.name for c in claimed if c.spec.weight_dtype in QUANTIZED_WEIGHT_DTYPES}
    if not quantized:
        return [None] * len(claimed)
    types = {t.name: t.data_type for t in model.graph.initializer}
    weight_inputs = {n.name: n.input[3:] for n in model.graph.node if n.name in quantized}
    formats: list[WeightFormat | None] = []
    for node in claimed:
        spec = node.spec
        if node.name not in quantized:
            formats.append(None)
            continue
        scales = spec.split_inputs(weight_inputs[node.name])["first_scales"][0]
        scale_dtype = FLOAT_WEIGHT_DTYPE_OF_ONNX.get(types.get(scales, 1), "float32")
        formats.append(WeightFormat(spec.weight_dtype, block_size=spec.quant_block_size, scale_dtype=scale_dtype))
    return formats


def describe_weights(dtype: str, formats: Sequence[WeightFormat | None]) -> str:
    """What the report says its expert weights were costed as."""
    stored = sorted(
        {f"{f.dtype} as stored (blocks of {f.block_size}, {f.scale_dtype} scales)" for f in formats if f is not None}
    )
    if not stored:
        return dtype
    floats = [f"{dtype} for float experts"] if any(f is None for f in formats) else []
    return "; ".join([*stored, *floats]) + f", computed in {dtype}"


@dataclass(frozen=True)
class UnconvertedMoE:
    """A fused ``com.microsoft.MoE``/``QMoE`` op the conversion skipped: it runs on the GPU as it is."""

    name: str
    num_experts: int
    top_k: int
    hidden: int
    first_width: int  # fc1 outputs (2I for gated experts)
    ffn: int

    def __post_init__(self) -> None:
        if min(self.num_experts, self.top_k, self.hidden, self.first_width, self.ffn) < 1:
            raise NdpEpError(f"{self.name}: MoE op dimensions must be positive")

    def gpu_seconds(self, system: SystemSpec, tokens: int, dtype: str) -> float:
        from hw_model.cost import kernel_time_s

        per_expert = self.hidden * self.first_width + self.ffn * self.hidden
        flops = 2.0 * tokens * self.top_k * per_expert
        bytes_moved = (self.num_experts * per_expert + 2 * tokens * self.hidden) * DTYPE_BYTES[dtype]
        return kernel_time_s(system.gpu, flops, bytes_moved, dtype, kernels=2)


def _unconverted_moe_ops(model) -> tuple[UnconvertedMoE, ...]:
    from onnx import helper

    fused = [
        node
        for node in model.graph.node
        if node.domain == "com.microsoft" and node.op_type in ("MoE", "QMoE") and len(node.input) >= 5
    ]
    if not fused:  # the usual case: no table of every initializer's dims to build
        return ()
    dims = {t.name: tuple(t.dims) for t in model.graph.initializer}
    found = []
    for node in fused:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        fc1, fc2 = dims.get(node.input[2]), dims.get(node.input[4])
        if not fc1 or not fc2 or len(fc1) != 3 or len(fc2) != 3:
            continue
        pack = 8 // int(attrs.get("expert_weight_bits", 4)) if node.op_type == "QMoE" else 1
        found.append(UnconvertedMoE(node.name, fc1[0], int(attrs.get("k", 1)), fc1[2] * pack, fc1[1], fc2[2] * pack))
    return tuple(found)


def _token_dims(input_shapes: Mapping[str, tuple[int, ...]], hidden: int) -> tuple[int, ...]:
    """The token dims of a run's first input: the leading dims of hidden states ``[..., hidden]``, else all dims
    (token ids)."""
    if not input_shapes:
        return ()
    shape = next(iter(input_shapes.values()))
    return shape[:-1] if shape and shape[-1] == hidden else shape


def _tokens_of(input_shapes: Mapping[str, tuple[int, ...]], hidden: int) -> int:
    """Tokens of a run from its first input (:func:`_token_dims`)."""
    leading = _token_dims(input_shapes, hidden)
    return int(np.prod(leading, dtype=np.int64)) if leading else 1


def _sequences_of(input_shapes: Mapping[str, tuple[int, ...]], hidden: int) -> int:
    """The sequences (batch) of a run: the first of its first input's token dims (:func:`_token_dims`) when it
    has more than one (``[batch, sequence]`` ids, ``[batch, sequence, hidden]`` states), else 1 (flat tokens)."""
    leading = _token_dims(input_shapes, hidden)
    return max(int(leading[0]), 1) if len(leading) > 1 else 1


def non_expert_weight_bytes(model, claimed: tuple[ClaimedNode, ...], dtype: str) -> float:
    """GPU memory the non-expert weights take at the simulated dtype (not available to experts)."""
    claimed_names = {c.name for c in claimed}
    expert = {i for n in model.graph.node if n.name in claimed_names for i in n.input[3:]}
    elements = sum(math.prod(t.dims) for t in model.graph.initializer if t.name not in expert)  # not np.prod: 20x
    return float(elements * DTYPE_BYTES[dtype])


_plain_reporters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_plain_lock = threading.Lock()


def reporter_for(session) -> SessionReporter:
    """The reporter of an ``ndp_ep.InferenceSession`` or of a plain ``onnxruntime.InferenceSession`` created
    with :func:`ndp_ep.session_options` (its hardware from the EP options ``hw``, ``ndp_units``, ``policy``,
    ``dtype``, checked by :func:`ndp_ep.ep.parse_ep_options`)."""
    own = getattr(session, "reporter", None)
    if isinstance(own, SessionReporter):
        return own
    if not callable(getattr(session, "get_session_options", None)):  # None, a path, a SessionOptions...
        raise NdpEpError(
            "expected an ndp_ep.InferenceSession or an onnxruntime.InferenceSession created with "
            f"ndp_ep.session_options(), got {type(session).__name__}"
        )
    from ndp_ep.ep import EP_NAME, REPORT_OPTION_KEYS, SESSION_KEY_OPTION, parse_ep_options, session_option

    with _plain_lock:
        found = _plain_reporters.get(session)
        if found is not None:
            return found
        options = session.get_session_options()
        # named in providers=, the provider's options are the session's, not config entries of its SessionOptions
        named = session.get_provider_options().get(EP_NAME, {})

        def option(name: str) -> str | None:
            return named.get(name) or session_option(options, name)

        key = option(SESSION_KEY_OPTION)
        if key is None:
            raise NdpEpError(
                "this session has no ndp-ep session key: create its options with ndp_ep.session_options() "
                "(or pass session_key in the provider options)"
            )
        given = {name: value for name in REPORT_OPTION_KEYS if (value := option(name)) is not None}
        settings = parse_ep_options(given)
        model = _session_model(session)
        reporter = SessionReporter(model, settings, key)
        _plain_reporters[session] = reporter
        return reporter


def last_report(session):
    """The simulated-latency report of the newest run of a session created with :func:`ndp_ep.session_options`
    (or an ``ndp_ep.InferenceSession``); None before the first run."""
    return reporter_for(session).last_report


def _session_model(session):
    """The model a plain ONNX Runtime session was created from, without external weight bytes: read again from its
    file at the session's first report (ONNX Runtime keeps the path it was given, not the model)."""
    import onnx

    path = getattr(session, "_model_path", None)
    data = getattr(session, "_model_bytes", None)
    if path:
        try:
            return onnx.load(str(path), load_external_data=False)
        except Exception as exc:  # noqa: BLE001 - missing, moved, unreadable or no longer ONNX
            raise NdpEpError(
                f"cannot read the session's model {str(path)!r} again to build its report ({type(exc).__name__}: it "
                "was moved, deleted or replaced, or the working directory changed since the session was created); "
                "read ndp_ep.last_report(session) once right after creating the session to keep what the reports "
                "need"
            ) from None
    if data:
        return onnx.load_from_string(data)
    raise NdpEpError("cannot read this session's model (neither a path nor bytes)")
