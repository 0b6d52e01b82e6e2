"""The routing statistics people compare traces by, per MoE layer (``ndp-ep trace-stats``).

From a captured trace (:mod:`hw_model.routing_trace`), per layer:

* popularity: the share of all selections taken by the busiest 10 % and 25 % of the layer's experts (at least one
  expert; :func:`hw_model.traces.top_share`, the measure ``CALIBRATED_SKEW`` was fitted to);
* temporal locality over the decode steps: the median *reuse distance* (steps since the same expert was last
  selected in that layer; the prefill counts as the step before the first decode step) and the share of selections
  whose expert the previous step selected too;
* an LRU cache of the layer's ``cache_fraction`` most recently used experts (at least one; warmed by the prefill):
  the share of decode selections it hits, and the bytes its misses copy host to GPU (the expert's stored weights).

A count-only file (per-expert selection counts, no steps, like ``../shared/traces/olmoe_expert_counts/``) gives
the popularity figures only (:func:`load_count_file`). :func:`summarise` folds layers into min / median / max per
group (the first component of a count file's layer path: the model). Pure numpy (mypyc-safe).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from hw_model.errors import TraceFormatError
from hw_model.routing_trace import CapturedTrace
from hw_model.routing_trace_io import MAX_JSON_DEPTH, json_depth
from hw_model.traces import top_share

DEFAULT_CACHE_FRACTION = 0.25
MAX_COUNT_FILE_BYTES = 64 << 20


@dataclass(frozen=True)
class LayerStats:
    """One layer's statistics (None: not defined for this input, e.g. locality of a count-only file)."""

    name: str
    num_experts: int
    selections: int
    active_experts: int
    top10_share: float
    top25_share: float
    decode_steps: int | None = None
    reuse_distance_median: float | None = None
    reuse_next_step_share: float | None = None
    cache_experts: int | None = None
    cache_hit_rate: float | None = None
    cache_miss_bytes: float | None = None

    def to_json(self) -> dict[str, object]:
        return {key: getattr(self, key) for key in self.__dataclass_fields__}


def _popularity(name: str, counts: np.ndarray) -> LayerStats:
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    shares = (top_share(counts, 0.10), top_share(counts, 0.25)) if total else (0.0, 0.0)
    return LayerStats(name, int(counts.size), total, int((counts > 0).sum()), shares[0], shares[1])


def count_stats(layers: Mapping[str, np.ndarray]) -> list[LayerStats]:
    """Popularity of each count-only layer (name -> per-expert selection counts)."""
    return [_popularity(name, counts) for name, counts in layers.items()]


def trace_stats(trace: CapturedTrace, cache_fraction: float = DEFAULT_CACHE_FRACTION) -> list[LayerStats]:
    """Every statistic of the module docstring, per layer of a captured trace."""
    if not 0.0 < cache_fraction <= 1.0:
        raise TraceFormatError(f"cache fraction must be in (0, 1], got {cache_fraction}")
    header, steps = trace.header, trace.steps
    num_layers = len(header.layers)
    totals = trace.layer_counts()
    offsets = steps.cell_offsets.tolist()
    experts = steps.experts.tolist()
    tokens = steps.layer_tokens.tolist()
    phases = steps.phase.tolist()
    shapes = header.layer_shapes()
    out = []
    for index, layer in enumerate(header.layers):
        base = _popularity(layer.name, totals[index, : layer.num_experts])
        capacity = max(1, int(round(cache_fraction * layer.num_experts)))
        cache: OrderedDict[int, None] = OrderedDict()
        last: dict[int, int] = {}
        distances: list[int] = []
        hits = selections = decode_steps = 0
        clock = 0
        for step in range(steps.num_steps):
            if tokens[step][index] < 0:
                continue
            cell = step * num_layers + index
            chosen = experts[offsets[cell] : offsets[cell + 1]]
            decode = phases[step] == 1
            if decode:
                decode_steps += 1
                for expert in chosen:
                    selections += 1
                    if expert in cache:
                        hits += 1
                    if expert in last:
                        distances.append(clock - last[expert])
            for expert in chosen:
                last[expert] = clock
                cache[expert] = None
                cache.move_to_end(expert)
                if len(cache) > capacity:
                    cache.popitem(last=False)
            clock += 1
        expert_bytes = shapes[index].expert.weight_bytes()
        out.append(
            replace(
                base,
                decode_steps=decode_steps,
                reuse_distance_median=float(np.median(distances)) if distances else None,
                reuse_next_step_share=sum(1 for d in distances if d == 1) / selections if selections else None,
                cache_experts=capacity,
                cache_hit_rate=hits / selections if selections else None,
                cache_miss_bytes=(selections - hits) * expert_bytes,
            )
        )
    return out


def summarise(stats: Sequence[LayerStats], group_of_path: bool = False) -> dict[str, dict[str, float]]:
    """Per group (everything, or the first ``/`` component of each layer's name with ``group_of_path``): the
    min, median and max over its layers of the top-10 % and top-25 % shares."""
    groups: dict[str, list[LayerStats]] = {}
    for item in stats:
        key = item.name.split("/", 1)[0] if group_of_path else "all layers"
        groups.setdefault(key, []).append(item)
    out: dict[str, dict[str, float]] = {}
    for key, items in groups.items():
        top10 = [s.top10_share for s in items]
        top25 = [s.top25_share for s in items]
        out[key] = {
            "layers": float(len(items)),
            "top10_min": min(top10),
            "top10_median": float(np.median(top10)),
            "top10_max": max(top10),
            "top25_min": min(top25),
            "top25_median": float(np.median(top25)),
            "top25_max": max(top25),
        }
    return out


def load_count_file(path: str | Path, max_bytes: int = MAX_COUNT_FILE_BYTES) -> dict[str, np.ndarray]:
    """The per-expert selection counts of a count-only JSON file: every list of non-negative integers under its
    ``counts`` object (or the whole document without one), named by its key path (``olmoe/arxiv/0``)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise TraceFormatError(f"{path}: {size:,} bytes, over the limit of {max_bytes:,} for a count file")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: cannot read it as UTF-8 text ({exc})") from None
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise TraceFormatError(f"{path}: nests {depth} deep, more than {MAX_JSON_DEPTH}")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise TraceFormatError(f"{path}: not JSON ({exc})") from None
    root = doc.get("counts", doc) if isinstance(doc, dict) else doc
    layers: dict[str, np.ndarray] = {}
    _collect(root, "", layers)
    if not layers:
        raise TraceFormatError(f"{path}: no per-expert count lists (lists of non-negative integers) in it")
    return layers


def _collect(node: object, prefix: str, out: dict[str, np.ndarray]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key != "meta":
                _collect(value, f"{prefix}/{key}" if prefix else str(key), out)
    elif isinstance(node, list) and node and all(isinstance(v, int) and not isinstance(v, bool) for v in node):
        if min(node) < 0:
            raise TraceFormatError(f"count list {prefix or '(root)'} holds a negative count")
        out[prefix or "layer"] = np.asarray(node, dtype=np.int64)
    elif isinstance(node, list):
        for position, value in enumerate(node):
            _collect(value, f"{prefix}/{position}" if prefix else str(position), out)
