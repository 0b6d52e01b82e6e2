"""Captured routing traces: per forward step and per MoE layer, the experts a real run routed its tokens to.

The file format (``.npz`` arrays plus a JSON header, versioned) is read and written by
:mod:`hw_model.routing_trace_io` and documented in docs/trace_format.md. This module holds what a file holds:

* :class:`TraceLayer`: one MoE layer's shapes as converted (experts, top-k, hidden, FFN, gated, shared experts,
  the weights' stored dtype and quantization block).
* :class:`TraceHeader`: the model's layers, the prompt / new-token counts, the settings the run was simulated
  under (hardware, NDP units, policy, dtype, tuning knobs), the dtype experts were costed in, the GPU memory the
  non-expert weights took, the versions of ndp-ep and ONNX Runtime, where it came from.
* :class:`RoutingSteps`: the routing, one *cell* per (step, layer): its tokens (``-1``: the layer did not run in
  that step) and its non-zero expert counts (token slots routed to each expert), stored compressed-sparse
  (``cell_offsets`` into ``experts`` / ``counts``); per step its phase, the non-expert GPU seconds the run was
  costed with and the simulated latency it reported. Optionally, per cell, the expert id and routing weight of
  every token slot (``slot_offsets`` into ``expert_ids`` / ``routing_weights``), when the capture had them.

A decode step of one token routes each of its ``top_k`` slots to a distinct expert, so its counts are its slots'
expert ids (each count 1). Pure numpy and standard library (mypyc-safe: no dynamic attributes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hw_model.errors import TraceFormatError
from hw_model.workload import WEIGHT_DTYPE_BYTES, ExpertShape, MoELayerShape, WeightFormat

FORMAT_NAME = "ndp-ep-routing-trace"
FORMAT_VERSION = 1
STEP_PHASES = ("prefill", "decode", "unknown")
ABSENT = -1  # layer_tokens of a layer that did not run in a step
QUANTIZED = ("int8", "int4")
SCALE_DTYPES = ("float32", "float16", "bfloat16")


def _int(name: str, value: object, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise TraceFormatError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TraceFormatError(f"{name} must be a string, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class TraceLayer:
    """One MoE layer as the provider ran it (``weight_dtype``: the experts' stored dtype; ``block_size`` and
    ``scale_dtype``: quantized weights' scale blocks, 0 and ``""`` for float weights). ``shared_experts``: experts
    every token runs (0 when the capture cannot tell: a converted model runs them as dense nodes)."""

    name: str
    num_experts: int
    top_k: int
    hidden: int
    ffn: int
    gated: bool = True
    shared_experts: int = 0
    weight_dtype: str = "float32"
    block_size: int = 0
    scale_dtype: str = ""

    def __post_init__(self) -> None:
        _text("layer name", self.name)
        _int(f"{self.name}: num_experts", self.num_experts, 1)
        _int(f"{self.name}: top_k", self.top_k, 1)
        if self.top_k > self.num_experts:
            raise TraceFormatError(f"{self.name}: top_k {self.top_k} exceeds num_experts {self.num_experts}")
        _int(f"{self.name}: hidden", self.hidden, 1)
        _int(f"{self.name}: ffn", self.ffn, 1)
        if not isinstance(self.gated, bool):
            raise TraceFormatError(f"{self.name}: gated must be true or false, got {self.gated!r}")
        _int(f"{self.name}: shared_experts", self.shared_experts)
        if self.weight_dtype not in WEIGHT_DTYPE_BYTES:
            known = ", ".join(WEIGHT_DTYPE_BYTES)
            raise TraceFormatError(f"{self.name}: weight_dtype {self.weight_dtype!r} unknown (known: {known})")
        if self.weight_dtype in QUANTIZED:
            _int(f"{self.name}: block_size", self.block_size, 1)
            if self.scale_dtype not in SCALE_DTYPES:
                raise TraceFormatError(f"{self.name}: scale_dtype {self.scale_dtype!r} not one of {SCALE_DTYPES}")
        elif self.block_size != 0 or self.scale_dtype != "":
            raise TraceFormatError(f"{self.name}: block_size / scale_dtype given for {self.weight_dtype} weights")

    @property
    def quantized(self) -> bool:
        return self.weight_dtype in QUANTIZED

    def shape(self, dtype: str, costed_as_stored: bool = True) -> MoELayerShape:
        """The simulator's shape of this layer with experts computed in ``dtype``: quantized weights move their
        stored bytes when ``costed_as_stored`` (what a session does without an explicit dtype), float weights
        and every weight otherwise are costed in ``dtype``."""
        weight_format = None
        if costed_as_stored and self.quantized:
            weight_format = WeightFormat(self.weight_dtype, block_size=self.block_size, scale_dtype=self.scale_dtype)
        expert = ExpertShape(self.hidden, self.ffn, self.gated, dtype, weight_format)
        return MoELayerShape(self.name, self.num_experts, self.top_k, expert, self.shared_experts)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "hidden": self.hidden,
            "ffn": self.ffn,
            "gated": self.gated,
            "shared_experts": self.shared_experts,
            "weight_dtype": self.weight_dtype,
            "block_size": self.block_size,
            "scale_dtype": self.scale_dtype,
        }

    @classmethod
    def from_json(cls, doc: object) -> TraceLayer:
        if not isinstance(doc, dict):
            raise TraceFormatError(f"a layer must be an object, got {type(doc).__name__}")
        keys = ("name", "num_experts", "top_k", "hidden", "ffn", "gated", "shared_experts", "weight_dtype")
        missing = [key for key in (*keys, "block_size", "scale_dtype") if key not in doc]
        if missing:
            raise TraceFormatError(f"a layer lacks the field {missing[0]!r}")
        return cls(
            name=_text("layer name", doc["name"]),
            num_experts=doc["num_experts"],
            top_k=doc["top_k"],
            hidden=doc["hidden"],
            ffn=doc["ffn"],
            gated=doc["gated"],
            shared_experts=doc["shared_experts"],
            weight_dtype=_text("weight_dtype", doc["weight_dtype"]),
            block_size=doc["block_size"],
            scale_dtype=_text("scale_dtype", doc["scale_dtype"]),
        )


@dataclass(frozen=True)
class TraceHeader:
    """What the JSON header of a trace file says (docs/trace_format.md lists each field).

    ``settings``: the simulation settings of the capturing run (``hw``, ``ndp_units``, ``policy``, ``dtype`` and
    the tuning knobs, JSON values); ``dtype``: what experts were computed in; ``costed_as_stored``: quantized
    weights moved as stored (no explicit dtype); ``gpu_reserved_bytes``: GPU memory the non-expert weights took;
    ``versions``: ``ndp_ep`` and ``onnxruntime``; ``source``: what captured it (a command, a model path)."""

    layers: tuple[TraceLayer, ...]
    prompt_tokens: int
    new_tokens: int
    settings: Mapping[str, Any] = field(default_factory=dict)
    dtype: str = "bf16"
    costed_as_stored: bool = True
    gpu_reserved_bytes: float = 0.0
    versions: Mapping[str, str] = field(default_factory=dict)
    source: str = ""
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.layers, tuple) or not all(isinstance(x, TraceLayer) for x in self.layers):
            raise TraceFormatError("layers must be a tuple of TraceLayer")
        _int("prompt_tokens", self.prompt_tokens)
        _int("new_tokens", self.new_tokens)
        if not isinstance(self.settings, Mapping):
            raise TraceFormatError("settings must be an object")
        _text("dtype", self.dtype)
        if not isinstance(self.costed_as_stored, bool):
            raise TraceFormatError("costed_as_stored must be true or false")
        reserved = self.gpu_reserved_bytes
        if isinstance(reserved, bool) or not isinstance(reserved, int | float) or not reserved >= 0:
            raise TraceFormatError(f"gpu_reserved_bytes must be a non-negative number, got {reserved!r}")
        object.__setattr__(self, "gpu_reserved_bytes", float(reserved))
        if not isinstance(self.versions, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.versions.items()
        ):
            raise TraceFormatError("versions must map names to version strings")
        _text("source", self.source)
        if not isinstance(self.notes, tuple) or not all(isinstance(n, str) for n in self.notes):
            raise TraceFormatError("notes must be a list of strings")

    @property
    def width(self) -> int:
        """The widest layer's experts (the rows of a step's dense counts)."""
        return max((layer.num_experts for layer in self.layers), default=0)

    def layer_shapes(self, dtype: str | None = None) -> list[MoELayerShape]:
        """The simulator's layer shapes: as the capture costed them, or every weight in ``dtype`` when given."""
        if dtype is None:
            return [layer.shape(self.dtype, self.costed_as_stored) for layer in self.layers]
        return [layer.shape(dtype, False) for layer in self.layers]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "layers": [layer.to_json() for layer in self.layers],
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "settings": dict(self.settings),
            "dtype": self.dtype,
            "costed_as_stored": self.costed_as_stored,
            "gpu_reserved_bytes": self.gpu_reserved_bytes,
            "versions": dict(self.versions),
            "source": self.source,
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, doc: object) -> TraceHeader:
        """The header of a parsed JSON document; :class:`TraceFormatError` for a foreign or other-version one."""
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
            raise TraceFormatError(f"not an ndp-ep routing trace (its header's format is not {FORMAT_NAME!r})")
        version = doc.get("version")
        if version != FORMAT_VERSION:
            raise TraceFormatError(
                f"routing trace format version {version!r} is not supported (this ndp-ep reads version "
                f"{FORMAT_VERSION})"
            )
        required = ("layers", "prompt_tokens", "new_tokens", "settings", "dtype", "costed_as_stored")
        missing = [key for key in (*required, "gpu_reserved_bytes", "versions", "source", "notes") if key not in doc]
        if missing:
            raise TraceFormatError(f"the header lacks the field {missing[0]!r}")
        layers, notes = doc["layers"], doc["notes"]
        if not isinstance(layers, list):
            raise TraceFormatError("the header's layers must be a list")
        if not isinstance(notes, list):
            raise TraceFormatError("the header's notes must be a list")
        return cls(
            layers=tuple(TraceLayer.from_json(layer) for layer in layers),
            prompt_tokens=doc["prompt_tokens"],
            new_tokens=doc["new_tokens"],
            settings=doc["settings"],
            dtype=doc["dtype"],
            costed_as_stored=doc["costed_as_stored"],
            gpu_reserved_bytes=doc["gpu_reserved_bytes"],
            versions=doc["versions"],
            source=doc["source"],
            notes=tuple(notes),
        )


# the arrays of a trace file: name -> (dtype, dimensions); the slot arrays are optional (all three or none)
ARRAY_SPECS: Mapping[str, tuple[str, int]] = {
    "phase": ("uint8", 1),
    "gap_s": ("float64", 1),
    "reported_s": ("float64", 1),
    "layer_tokens": ("int32", 2),
    "cell_offsets": ("int64", 1),
    "experts": ("int32", 1),
    "counts": ("int32", 1),
}
SLOT_ARRAYS: Mapping[str, tuple[str, int]] = {
    "slot_offsets": ("int64", 1),
    "expert_ids": ("int32", 1),
    "routing_weights": ("float32", 1),
}


@dataclass(frozen=True)
class RoutingSteps:
    """The routing arrays of a trace (see the module docstring); checked against ``num_layers`` and each
    layer's experts and top-k by :meth:`check`."""

    phase: np.ndarray
    gap_s: np.ndarray
    reported_s: np.ndarray
    layer_tokens: np.ndarray
    cell_offsets: np.ndarray
    experts: np.ndarray
    counts: np.ndarray
    slot_offsets: np.ndarray | None = None
    expert_ids: np.ndarray | None = None
    routing_weights: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return int(self.phase.shape[0])

    @property
    def has_slots(self) -> bool:
        return self.slot_offsets is not None

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array, by its file name, in the file's order."""
        out = {name: getattr(self, name) for name in ARRAY_SPECS}
        if self.slot_offsets is not None:
            out.update({name: getattr(self, name) for name in SLOT_ARRAYS})
        return out

    def check(self, layers: Sequence[TraceLayer]) -> None:
        """:class:`TraceFormatError` naming the first array of the wrong type, shape or content."""
        given = self.arrays()
        for name, (dtype, ndim) in {**ARRAY_SPECS, **(SLOT_ARRAYS if self.has_slots else {})}.items():
            array = given[name]
            if not isinstance(array, np.ndarray) or array.dtype != np.dtype(dtype) or array.ndim != ndim:
                raise TraceFormatError(f"array {name!r} must be {dtype} with {ndim} dimension(s)")
        if self.has_slots and (self.expert_ids is None or self.routing_weights is None):
            raise TraceFormatError("slot_offsets, expert_ids and routing_weights come together")
        steps, num_layers = self.num_steps, len(layers)
        for name in ("gap_s", "reported_s"):
            if given[name].shape != (steps,):
                raise TraceFormatError(f"array {name!r} must have one value per step ({steps})")
        if self.layer_tokens.shape != (steps, num_layers):
            raise TraceFormatError(f"array 'layer_tokens' must be [steps, layers] = [{steps}, {num_layers}]")
        if steps and int(self.phase.max()) >= len(STEP_PHASES):
            raise TraceFormatError(f"array 'phase' holds a value beyond {len(STEP_PHASES) - 1}")
        if not np.isfinite(self.gap_s).all() or (self.gap_s < 0).any():
            raise TraceFormatError("array 'gap_s' must hold finite non-negative seconds")
        if (self.layer_tokens < ABSENT).any():
            raise TraceFormatError("array 'layer_tokens' holds a value below -1")
        cells = steps * num_layers
        _check_offsets("cell_offsets", self.cell_offsets, cells, self.experts.shape[0])
        if self.counts.shape != self.experts.shape:
            raise TraceFormatError("arrays 'experts' and 'counts' must have the same length")
        if self.counts.size and int(self.counts.min()) < 1:
            raise TraceFormatError("array 'counts' holds a count below 1 (only non-zero counts are stored)")
        experts_of = np.array([layer.num_experts for layer in layers], dtype=np.int64)
        top_k_of = np.array([layer.top_k for layer in layers], dtype=np.int64)
        cell_layer = np.tile(np.arange(num_layers, dtype=np.int64), steps)
        sizes = np.diff(self.cell_offsets)
        entry_layer = np.repeat(cell_layer, sizes)
        if self.experts.size and ((self.experts < 0) | (self.experts >= experts_of[entry_layer])).any():
            raise TraceFormatError("array 'experts' holds an expert id outside its layer's experts")
        tokens = self.layer_tokens.reshape(-1).astype(np.int64)
        entry_cell = np.repeat(np.arange(cells, dtype=np.int64), sizes)
        totals = np.bincount(entry_cell, weights=self.counts, minlength=cells).astype(np.int64)  # exact below 2^53
        if (totals != np.maximum(tokens, 0) * top_k_of[cell_layer]).any():
            raise TraceFormatError("a cell's counts do not add up to its tokens times its layer's top_k")
        if self.has_slots:
            self._check_slots(cells, totals, experts_of, cell_layer)

    def _check_slots(self, cells: int, totals: np.ndarray, experts_of: np.ndarray, cell_layer: np.ndarray) -> None:
        assert self.slot_offsets is not None and self.expert_ids is not None and self.routing_weights is not None
        _check_offsets("slot_offsets", self.slot_offsets, cells, self.expert_ids.shape[0])
        if self.routing_weights.shape != self.expert_ids.shape:
            raise TraceFormatError("arrays 'expert_ids' and 'routing_weights' must have the same length")
        if (np.diff(self.slot_offsets) != totals).any():
            raise TraceFormatError("a cell's slots do not match its counts")
        slot_layer = np.repeat(cell_layer, np.diff(self.slot_offsets))
        ids = self.expert_ids.astype(np.int64)
        if ids.size and ((ids < 0) | (ids >= experts_of[slot_layer])).any():
            raise TraceFormatError("array 'expert_ids' holds an expert id outside its layer's experts")
        width = int(experts_of.max()) if experts_of.size else 0
        slot_cell = np.repeat(np.arange(cells, dtype=np.int64), np.diff(self.slot_offsets))
        from_slots = np.bincount(slot_cell * width + ids, minlength=cells * width)
        sizes = np.diff(self.cell_offsets)
        entry_cell = np.repeat(np.arange(cells, dtype=np.int64), sizes)
        from_counts = np.zeros(cells * width, dtype=np.int64)
        from_counts[entry_cell * width + self.experts] = self.counts
        if not np.array_equal(from_slots, from_counts):
            raise TraceFormatError("a cell's expert_ids do not match its counts")

    def step(self, step: int, num_layers: int, width: int) -> tuple[list[int], list[int], np.ndarray]:
        """One step's routing: the layers that ran (in order), their tokens and their dense counts
        ``[len(layers), width]`` (what :meth:`hw_model.simulator.MoESimulator.simulate_step` takes)."""
        row = self.layer_tokens[step]
        layers = [int(i) for i in np.flatnonzero(row >= 0)]
        dense = np.zeros((len(layers), width), dtype=np.int64)
        for position, layer in enumerate(layers):
            cell = step * num_layers + layer
            lo, hi = int(self.cell_offsets[cell]), int(self.cell_offsets[cell + 1])
            dense[position, self.experts[lo:hi]] = self.counts[lo:hi]
        return layers, [int(row[i]) for i in layers], dense

    def layer_counts(self, num_layers: int, width: int) -> np.ndarray:
        """``[layers, width]``: token slots routed to each expert of each layer over the whole trace."""
        cell_layer = np.tile(np.arange(num_layers, dtype=np.int64), self.num_steps)
        entry_layer = np.repeat(cell_layer, np.diff(self.cell_offsets))
        flat = np.bincount(entry_layer * width + self.experts, weights=self.counts, minlength=num_layers * width)
        return flat.astype(np.int64).reshape(num_layers, width)


def _check_offsets(name: str, offsets: np.ndarray, cells: int, entries: int) -> None:
    if offsets.shape != (cells + 1,):
        raise TraceFormatError(f"array {name!r} must have one value per (step, layer) cell plus one ({cells + 1})")
    if int(offsets[0]) != 0 or int(offsets[-1]) != entries or (np.diff(offsets) < 0).any():
        raise TraceFormatError(f"array {name!r} must rise from 0 to the length of the arrays it indexes")


@dataclass(frozen=True)
class CapturedTrace:
    """A routing trace file's content: its :class:`TraceHeader` and its :class:`RoutingSteps` (checked)."""

    header: TraceHeader
    steps: RoutingSteps

    def __post_init__(self) -> None:
        self.steps.check(self.header.layers)

    @property
    def num_layers(self) -> int:
        return len(self.header.layers)

    @property
    def num_steps(self) -> int:
        return self.steps.num_steps

    def step(self, step: int) -> tuple[str, list[int], list[int], np.ndarray]:
        """Step ``step``'s phase, the layers that ran, their tokens and their dense counts."""
        layers, tokens, dense = self.steps.step(step, self.num_layers, self.header.width)
        return STEP_PHASES[int(self.steps.phase[step])], layers, tokens, dense

    def layer_counts(self) -> np.ndarray:
        """``[layers, width]``: selections of each expert of each layer over every step."""
        return self.steps.layer_counts(self.num_layers, self.header.width)

    @property
    def reported_total_s(self) -> float:
        """The simulated seconds the capturing run reported over every step (summed in step order)."""
        total = 0.0
        for value in self.steps.reported_s.tolist():
            total += value
        return total


def steps_from_cells(
    phases: Sequence[str],
    gap_s: Sequence[float],
    reported_s: Sequence[float],
    layer_tokens: np.ndarray,
    cells: Sequence[tuple[np.ndarray, np.ndarray]],
    slots: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
) -> RoutingSteps:
    """:class:`RoutingSteps` from per-step lists and per-cell ``(experts, counts)`` (non-zero entries, cells in
    (step, layer) order) and, optionally, per-cell ``(expert_ids, routing_weights)`` of every slot."""
    sizes = [len(experts) for experts, _ in cells]
    offsets = np.zeros(len(cells) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(sizes, dtype=np.int64)
    experts = np.concatenate([e for e, _ in cells]).astype(np.int32) if cells else np.zeros(0, np.int32)
    counts = np.concatenate([c for _, c in cells]).astype(np.int32) if cells else np.zeros(0, np.int32)
    slot_arrays: dict[str, np.ndarray | None] = {"slot_offsets": None, "expert_ids": None, "routing_weights": None}
    if slots is not None:
        slot_offsets = np.zeros(len(slots) + 1, dtype=np.int64)
        slot_offsets[1:] = np.cumsum([len(ids) for ids, _ in slots], dtype=np.int64)
        slot_arrays = {
            "slot_offsets": slot_offsets,
            "expert_ids": np.concatenate([i for i, _ in slots]).astype(np.int32) if slots else np.zeros(0, np.int32),
            "routing_weights": np.concatenate([w for _, w in slots]).astype(np.float32)
            if slots
            else np.zeros(0, np.float32),
        }
    return RoutingSteps(
        phase=np.array([STEP_PHASES.index(p) for p in phases], dtype=np.uint8),
        gap_s=np.array(gap_s, dtype=np.float64).reshape(-1),
        reported_s=np.array(reported_s, dtype=np.float64).reshape(-1),
        layer_tokens=np.asarray(layer_tokens, dtype=np.int32),
        cell_offsets=offsets,
        experts=experts,
        counts=counts,
        **slot_arrays,
    )


def sparse_counts(dense_row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The non-zero ``(experts, counts)`` of one cell's dense counts."""
    experts = np.flatnonzero(dense_row)
    return experts.astype(np.int32), np.asarray(dense_row)[experts].astype(np.int32)


def from_token_ids(
    header: TraceHeader, expert_ids: np.ndarray, routing_weights: np.ndarray | None = None
) -> CapturedTrace:
    """A trace of per-token ids ``[layers, tokens, top_k]`` (as :class:`hw_model.traces.RoutingTrace` holds them):
    the first ``header.prompt_tokens`` tokens are one prefill step, each later token a decode step; every slot is
    kept, with ``routing_weights`` (same shape; default ``1 / top_k`` each). Steps carry no non-expert time and no
    reported latency (NaN)."""
    ids = np.asarray(expert_ids)
    if ids.ndim != 3 or ids.shape[0] != len(header.layers):
        raise TraceFormatError(f"expert ids must be [layers={len(header.layers)}, tokens, top_k]")
    layers, tokens, top_k = ids.shape
    weights = np.full(ids.shape, 1.0 / top_k, dtype=np.float32) if routing_weights is None else routing_weights
    prompt = header.prompt_tokens
    bounds = ([(0, prompt)] if prompt else []) + [(t, t + 1) for t in range(prompt, tokens)]
    cells: list[tuple[np.ndarray, np.ndarray]] = []
    slots: list[tuple[np.ndarray, np.ndarray]] = []
    for start, stop in bounds:
        for layer in range(layers):
            block = ids[layer, start:stop].reshape(-1)
            cells.append(sparse_counts(np.bincount(block, minlength=header.layers[layer].num_experts)))
            slots.append((block.astype(np.int32), np.asarray(weights[layer, start:stop]).reshape(-1)))
    phases = ["prefill" if stop - start > 1 else "decode" for start, stop in bounds]
    layer_tokens = np.array([[stop - start] * layers for start, stop in bounds], dtype=np.int32).reshape(-1, layers)
    nan = [float("nan")] * len(bounds)
    steps = steps_from_cells(phases, [0.0] * len(bounds), nan, layer_tokens, cells, slots)
    return CapturedTrace(header, steps)
