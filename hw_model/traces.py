"""Routing traces: which experts each token selects in each MoE layer; synthetic, loaded from files, calibrated.

A trace is ``expert_ids[layer, token, slot]`` (int, ``top_k`` distinct ids per token) over ``prompt_tokens``
prefill tokens followed by the generated (decode) tokens.

Trace file format (``.npz`` or ``.json``; see docs/bench.md)::

    .npz : arrays  expert_ids  int [layers, tokens, top_k]
                   num_experts int scalar,  prompt_tokens int scalar
    .json: {"format": "ndp-ep-trace/1", "num_experts": E, "prompt_tokens": P,
            "expert_ids": [[[e, ...] per token] per layer]}

Synthetic traces have three documented knobs (:class:`TraceKnobs`):

* ``skew``  Zipf exponent of expert popularity (weight of the r-th most popular expert ∝ r^-skew; 0 = uniform).
  Each layer ranks its experts by its own random permutation. Tokens pick ``top_k`` distinct experts with
  probability following those weights (Gumbel top-k).
* ``locality``  probability that a slot keeps the expert the previous token chose (temporal locality).
* ``shift_at``  fraction of the generated tokens after which the domain shifts: every layer draws a new
  popularity permutation (``None``: no shift).

:data:`CALIBRATED_SKEW` holds, per model, the skew range (low, typical, high) that reproduces measured routing
statistics; :func:`top_share` and :func:`fit_skew` are the tools that derived it (see their docstrings).
"""

from __future__ import annotations

import json
import math
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hw_model.errors import WorkloadError
from ndp_io.limits import MAX_TRACE_BYTES, limit_note
from ndp_io.parsing import read_json

TRACE_FORMAT = "ndp-ep-trace/1"

# Share of selections taken by the busiest 10 % of experts (at least one expert), per model: (low, typical, high).
# mixtral-8x7b and olmoe-1b-7b: min / median / max over 5 domains x layers 0, 7, 15 of the per-expert counts in
# ../shared/traces/olmoe_expert_counts/expert_counts.json (allenai/OLMoE, commit 357454f4), recomputed by
# tests/hw_model/test_traces.py when that directory is present.
# qwen3-30b-a3b and deepseek-v2-lite: no counts available; the short real per-token traces summarised in
# ../shared/traces/README.md (FLAME-MoE, Qwen1.5-MoE) gave 13-19 % for the top 10 %; 16 % taken as typical.
MEASURED_TOP10_SHARE: Mapping[str, tuple[float, float, float]] = {
    "mixtral-8x7b": (0.1346, 0.1465, 0.1660),
    "olmoe-1b-7b": (0.1568, 0.2902, 0.4383),
    "qwen3-30b-a3b": (0.13, 0.16, 0.19),
    "deepseek-v2-lite": (0.13, 0.16, 0.19),
}

# Zipf skews whose synthetic top-10 % share matches MEASURED_TOP10_SHARE (fit_skew, seed 0, 8192 tokens).
CALIBRATED_SKEW: Mapping[str, tuple[float, float, float]] = {
    "mixtral-8x7b": (0.051, 0.134, 0.242),
    "olmoe-1b-7b": (0.271, 0.682, 1.127),
    "qwen3-30b-a3b": (0.116, 0.222, 0.312),
    "deepseek-v2-lite": (0.167, 0.279, 0.375),
}
DEFAULT_SKEW_LEVELS = ("low", "typical", "high")


@dataclass(frozen=True)
class TraceKnobs:
    """Synthetic-trace knobs (see the module docstring)."""

    skew: float = 0.0
    locality: float = 0.0
    shift_at: float | None = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.skew <= 10.0:
            raise WorkloadError(f"trace skew must be in [0, 10], got {self.skew}")
        if not 0.0 <= self.locality <= 1.0:
            raise WorkloadError(f"trace locality must be in [0, 1], got {self.locality}")
        if self.shift_at is not None and not 0.0 <= self.shift_at <= 1.0:
            raise WorkloadError(f"trace shift_at must be in [0, 1] or None, got {self.shift_at}")


@dataclass(frozen=True)
class TraceDistribution:
    """What a synthetic trace was drawn from: phase ``i`` starts at token ``phase_starts[i]`` (the first at 0) and
    draws each token of layer ``l`` from the popularity weights ``weights[i, l]`` (normalised, ``[phases, layers,
    experts]``); ``locality`` is the trace's temporal locality. With no locality the tokens of one phase are
    independent draws from its weights, so the experts a token most likely selects are known: the largest weights
    (``hw_model.bench_bound`` fills its causal bound's GPU pool with them)."""

    phase_starts: tuple[int, ...]
    weights: np.ndarray
    locality: float

    def __post_init__(self) -> None:
        weights = np.asarray(self.weights, dtype=np.float64)
        starts = tuple(int(s) for s in self.phase_starts)
        if weights.ndim != 3 or weights.shape[0] != len(starts) or not starts or starts[0] != 0:
            raise WorkloadError(
                "TraceDistribution needs weights [phases, layers, experts], one phase start each, 0 first"
            )
        increasing = all(b > a for a, b in zip(starts, starts[1:], strict=False))
        if not increasing or not np.isfinite(weights).all() or (weights < 0).any():
            raise WorkloadError("TraceDistribution's phase starts must increase and its weights be finite, >= 0")
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "phase_starts", starts)

    def phase_weights(self, start: int, stop: int) -> np.ndarray | None:
        """``[layers, experts]``: the weights tokens ``start..stop-1`` are drawn from, or None when they span
        phases."""
        phase = int(np.searchsorted(self.phase_starts, start, side="right")) - 1
        following = self.phase_starts[phase + 1] if phase + 1 < len(self.phase_starts) else None
        if following is not None and stop > following:
            return None
        return self.weights[phase]


@dataclass(frozen=True)
class RoutingTrace:
    """Selected expert ids ``[layers, tokens, top_k]``; the first ``prompt_tokens`` tokens are the prompt;
    ``distribution``: what a synthetic trace was drawn from (None for a trace read from a file or captured)."""

    expert_ids: np.ndarray
    num_experts: int
    prompt_tokens: int
    distribution: TraceDistribution | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        ids = np.asarray(self.expert_ids)
        if ids.ndim != 3 or ids.shape[2] < 1 or not np.issubdtype(ids.dtype, np.integer):
            raise WorkloadError("trace expert_ids must be an integer array [layers, tokens, top_k]")
        if self.num_experts < 1 or ids.size and (ids.min() < 0 or ids.max() >= self.num_experts):
            raise WorkloadError(f"trace expert ids must be in 0..{self.num_experts - 1}")
        if not 0 <= self.prompt_tokens <= ids.shape[1]:
            raise WorkloadError(f"trace prompt_tokens {self.prompt_tokens} outside 0..{ids.shape[1]}")
        sorted_ids = np.sort(ids, axis=2)
        if (np.diff(sorted_ids, axis=2) == 0).any():
            raise WorkloadError("a token selects the same expert twice in one layer")
        object.__setattr__(self, "expert_ids", ids.astype(np.int32, copy=False))

    @property
    def num_layers(self) -> int:
        return int(self.expert_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.expert_ids.shape[1])

    @property
    def top_k(self) -> int:
        return int(self.expert_ids.shape[2])

    @property
    def generated_tokens(self) -> int:
        return self.num_tokens - self.prompt_tokens

    def counts(self, layer: int, start: int, stop: int) -> np.ndarray:
        """Tokens routed to each expert of ``layer`` over tokens ``start..stop-1``."""
        ids = self.expert_ids[layer, start:stop].ravel()
        return np.bincount(ids, minlength=self.num_experts).astype(np.int64)

    def prefill_counts(self, layer: int) -> np.ndarray:
        return self.counts(layer, 0, self.prompt_tokens)

    def step_counts(self, start: int, stop: int, num_layers: int | None = None) -> np.ndarray:
        """``[layers, experts]``: tokens ``start..stop-1`` routed to each expert of each layer (the first
        ``num_layers``): one forward step's routing, as :meth:`MoESimulator.simulate_step` takes it."""
        layers = self.num_layers if num_layers is None else num_layers
        ids = self.expert_ids[:layers, start:stop].reshape(layers, -1).astype(np.int64)
        ids += np.arange(layers)[:, None] * self.num_experts  # one bincount over every layer
        return np.bincount(ids.ravel(), minlength=layers * self.num_experts).reshape(layers, self.num_experts)

    def token_counts(self, token: int, num_layers: int | None = None) -> np.ndarray:
        """:meth:`step_counts` of one generated token."""
        return self.tokens_counts(token, token + 1, num_layers)[0]

    def tokens_counts(self, start: int, stop: int, num_layers: int | None = None) -> np.ndarray:
        """``[tokens, layers, experts]``: :meth:`step_counts` of each token ``start..stop-1`` (one decode step
        each), from one ``bincount``."""
        layers = self.num_layers if num_layers is None else num_layers
        tokens = max(0, stop - start)
        ids = self.expert_ids[:layers, start:stop].astype(np.int64)  # [layers, tokens, top_k]
        ids += (np.arange(tokens)[None, :, None] * layers + np.arange(layers)[:, None, None]) * self.num_experts
        size = tokens * layers * self.num_experts
        return np.bincount(ids.ravel(), minlength=size).reshape(tokens, layers, self.num_experts)

    def prefill_step_counts(self, num_layers: int | None = None) -> np.ndarray:
        """:meth:`step_counts` of the prompt."""
        return self.step_counts(0, self.prompt_tokens, num_layers)

    def save(self, path: str | Path) -> None:
        """Write the trace (``.npz`` or ``.json``) atomically."""
        from ndp_io import atomic_write

        path = Path(path)
        suffix = path.suffix.lower()
        if suffix not in (".npz", ".json"):
            raise WorkloadError(f"trace file must end in .npz or .json: {path}")
        with atomic_write(path) as handle:
            if suffix == ".npz":
                np.savez_compressed(
                    handle,
                    expert_ids=self.expert_ids,
                    num_experts=np.int64(self.num_experts),
                    prompt_tokens=np.int64(self.prompt_tokens),
                )
            else:
                doc = {
                    "format": TRACE_FORMAT,
                    "num_experts": self.num_experts,
                    "prompt_tokens": self.prompt_tokens,
                    "expert_ids": self.expert_ids.tolist(),
                }
                handle.write(json.dumps(doc).encode())


def load_trace(path: str | Path) -> RoutingTrace:
    """Read a trace file (format in the module docstring); errors name the problem."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(2, "no such trace file", str(path))
    try:
        if path.suffix.lower() == ".npz":
            _check_npz_size(path)  # from the members' headers, before any array is inflated
            with np.load(path, allow_pickle=False) as data:
                missing = {"expert_ids", "num_experts", "prompt_tokens"} - set(data.files)
                if missing:
                    raise WorkloadError(f"{path}: missing array '{sorted(missing)[0]}'")
                ids_array = data["expert_ids"]
                num_experts, prompt_tokens = data["num_experts"], data["prompt_tokens"]
            return RoutingTrace(
                ids_array, _count(path, "num_experts", num_experts), _count(path, "prompt_tokens", prompt_tokens)
            )
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        if isinstance(exc, WorkloadError):
            raise
        raise WorkloadError(f"{path}: not a readable trace file ({exc})") from None
    prefix = f"{path}: "

    def unreadable(message: str) -> WorkloadError:
        return WorkloadError(f"{path}: not a readable trace file ({message.removeprefix(prefix)})")

    doc = read_json(path, unreadable)  # size- and depth-bounded (ndp_io/limits.py)
    if not isinstance(doc, dict) or doc.get("format") != TRACE_FORMAT:
        raise WorkloadError(f"{path}: 'format' must be {TRACE_FORMAT!r}")
    for key in ("num_experts", "prompt_tokens", "expert_ids"):
        if key not in doc:
            raise WorkloadError(f"{path}: missing field '{key}'")
    try:
        ids = np.asarray(doc["expert_ids"], dtype=np.int64)
    except (ValueError, TypeError, OverflowError):
        raise WorkloadError(f"{path}: expert_ids must be a [layers][tokens][top_k] list of integers") from None
    return RoutingTrace(
        ids, _count(path, "num_experts", doc["num_experts"]), _count(path, "prompt_tokens", doc["prompt_tokens"])
    )


def _count(path: Path, field: str, value: Any) -> int:
    """A trace's scalar count field as an int: an integer (or a 0-d/1-element integer array) from 0 to 2^31."""
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind not in "iu" or not 0 <= int(array.reshape(())) <= 2**31:
        shown = repr(value) if array.size == 1 else f"an array of shape {array.shape}"
        raise WorkloadError(f"{path}: {field} must be an integer from 0 to 2^31, got {shown[:80]}")
    return int(array.reshape(()))


def _check_npz_size(path: Path) -> None:
    """:class:`WorkloadError` when the arrays of the ``.npz`` at ``path`` would inflate to more than
    :data:`ndp_io.limits.MAX_TRACE_BYTES` (each member's ``.npy`` header read, nothing decompressed beyond it)."""
    total = 0
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(member)
                else:
                    shape, _, dtype = np.lib.format.read_array_header_2_0(member)
            if dtype.hasobject:
                raise WorkloadError(f"{path}: {info.filename} holds Python objects; not read")
            total += int(np.prod(shape, dtype=object)) * dtype.itemsize
            if total > MAX_TRACE_BYTES:
                raise WorkloadError(
                    f"{path}: its arrays would take over {MAX_TRACE_BYTES:,} bytes {limit_note('MAX_TRACE_BYTES')}"
                )


def popularity_weights(num_experts: int, skew: float, rng: np.random.Generator) -> np.ndarray:
    """Zipf weights over a random permutation of the experts (normalised)."""
    weights = np.arange(1, num_experts + 1, dtype=np.float64) ** -skew
    weights = weights[rng.permutation(num_experts)]
    return weights / weights.sum()


# Relative gap below which two ranking keys of one token count as tied (see _gumbel_top_k): numpy's vectorised
# log may differ from the C library's log (what ``Generator.gumbel`` uses) by a few units in the last place.
_KEY_TIE_TOLERANCE = 1e-9
# Tokens ranked per batch, times the experts: small arrays reuse the allocator's memory (large ones fault pages).
_BATCH_ELEMENTS = 32768


def _gumbel_top_k(segments: list[tuple[np.ndarray, int]], top_k: int, rng: np.random.Generator) -> np.ndarray:
    """``[tokens, top_k]`` expert ids: per token, the ``top_k`` experts with the largest log weight plus Gumbel
    noise, in descending key order. ``segments`` lists ``(weights, tokens)`` in token order.

    Defined as ``argsort(-(log(weights) + rng.gumbel(size=(tokens, experts))), axis=1)[:, :top_k]`` per segment,
    and computed so, random stream included, but faster: the noise is ``-log(-log(1 - u))`` of uniforms ``u``
    (``Generator.gumbel``'s transform), so a key ranks as ``-log(1 - u) / weight`` ranks ascending, which takes one
    vectorised log and a partition, batch by batch of tokens; a token whose ``top_k + 1`` best lie within
    :data:`_KEY_TIE_TOLERANCE` of each other is ranked from keys computed exactly as ``Generator.gumbel`` does."""
    experts = segments[0][0].size
    batch = max(1, _BATCH_ELEMENTS // experts)
    state = rng.bit_generator.state
    parts = []
    for weights, count in segments:
        for start in range(0, count, batch):
            uniform = rng.random((min(batch, count - start), experts))
            if (uniform == 0.0).any():  # Generator.gumbel redraws a zero uniform (probability 2^-53 each)
                rng.bit_generator.state = state
                keys = [np.log(w) + rng.gumbel(size=(n, experts)) for w, n in segments]
                return np.argsort(-np.concatenate(keys), axis=1)[:, :top_k]
            parts.append(_rank_batch(uniform, weights, top_k))
    return np.concatenate(parts) if parts else np.empty((0, top_k), dtype=np.int64)


def _rank_batch(uniform: np.ndarray, weights: np.ndarray, top_k: int) -> np.ndarray:
    """:func:`_gumbel_top_k` of one batch of tokens sharing ``weights``, from their uniforms."""
    tokens, experts = uniform.shape
    scaled = 1.0 - uniform
    np.log(scaled, out=scaled)  # in place: a fresh output array costs more than the log
    np.negative(scaled, out=scaled)
    with np.errstate(divide="ignore"):  # a weight of 0 (weighted_trace): an infinite key, never picked
        scaled /= weights
    take = min(top_k + 1, experts)
    best = np.argpartition(scaled, take - 1, axis=1)[:, :take] if take < experts else np.argsort(scaled, axis=1)
    rows = np.arange(tokens)[:, None]
    ranked = scaled[rows, best]
    order = np.argsort(ranked, axis=1)
    best = best[rows, order]
    ranked = ranked[rows, order]
    gaps = ranked[:, 1:] - ranked[:, :-1]
    ties = (gaps[:, :top_k] <= _KEY_TIE_TOLERANCE * ranked[:, 1 : top_k + 1]).any(axis=1)
    if ties.any():
        with np.errstate(divide="ignore"):
            log_w = np.log(weights)
        for token in np.flatnonzero(ties).tolist():
            noise = [0.0 - math.log(-math.log(1.0 - u)) for u in uniform[token].tolist()]  # the C library's log
            best[token] = np.argsort(-(log_w + np.array(noise)))[:take]
    return best[:, :top_k]


def synthetic_trace(
    num_layers: int,
    num_experts: int,
    top_k: int,
    prompt_tokens: int,
    generated_tokens: int,
    knobs: TraceKnobs,
) -> RoutingTrace:
    """A seeded synthetic trace (knobs in the module docstring).

    Per layer, the random stream gives: the popularity permutation before the shift, the one after it, the
    Gumbel noise of every token (``[tokens, experts]``), then, with locality, the keep draws ``[tokens, top_k]``."""
    if top_k > num_experts or top_k < 1:
        raise WorkloadError(f"top_k must be in 1..{num_experts}")
    rng = np.random.default_rng(knobs.seed)

    def zipf(_: int) -> tuple[np.ndarray, np.ndarray]:
        before = popularity_weights(num_experts, knobs.skew, rng)
        return before, popularity_weights(num_experts, knobs.skew, rng)

    return _draw_trace(num_layers, num_experts, top_k, prompt_tokens, generated_tokens, knobs, rng, zipf)


def weighted_trace(
    before: np.ndarray,
    after: np.ndarray,
    top_k: int,
    prompt_tokens: int,
    generated_tokens: int,
    knobs: TraceKnobs,
) -> RoutingTrace:
    """A seeded trace drawn as :func:`synthetic_trace` draws one, from given popularity weights instead of Zipf's:
    ``before[layer, expert]`` up to the shift (``knobs.shift_at``), ``after`` from it (e.g. measured selection
    counts of two domains; ``knobs.skew`` is not used). Each layer's weights need at least ``top_k`` positive ones."""
    before, after = np.asarray(before, dtype=np.float64), np.asarray(after, dtype=np.float64)
    if before.ndim != 2 or before.shape != after.shape or not 1 <= top_k <= before.shape[1]:
        raise WorkloadError("weighted_trace needs before and after weights [layers, experts] alike, top_k <= experts")
    for weights in (before, after):
        if not np.isfinite(weights).all() or (weights < 0).any() or ((weights > 0).sum(axis=1) < top_k).any():
            raise WorkloadError(f"every layer's weights must be finite, >= 0, with at least {top_k} positive")
    rng = np.random.default_rng(knobs.seed)

    def given(layer: int) -> tuple[np.ndarray, np.ndarray]:
        return before[layer] / before[layer].sum(), after[layer] / after[layer].sum()

    layers, experts = before.shape
    return _draw_trace(layers, experts, top_k, prompt_tokens, generated_tokens, knobs, rng, given)


def _draw_trace(
    num_layers: int,
    num_experts: int,
    top_k: int,
    prompt_tokens: int,
    generated_tokens: int,
    knobs: TraceKnobs,
    rng: np.random.Generator,
    weights_of: Callable[[int], tuple[np.ndarray, np.ndarray]],
) -> RoutingTrace:
    """The tokens of every layer drawn from ``weights_of(layer)`` (before and after the shift; called just before
    that layer's draws), with the knobs' locality, and the :class:`TraceDistribution` they were drawn from."""
    total = prompt_tokens + generated_tokens
    shift_token = total if knobs.shift_at is None else prompt_tokens + int(round(knobs.shift_at * generated_tokens))
    ids = np.empty((num_layers, total, top_k), dtype=np.int32)
    drawn = np.empty((2, num_layers, num_experts))  # per layer, the weights before and after the shift
    for layer in range(num_layers):
        before, after = weights_of(layer)
        drawn[0, layer], drawn[1, layer] = before, after
        ids[layer] = _gumbel_top_k([(before, shift_token), (after, total - shift_token)], top_k, rng)
        if knobs.locality > 0:
            _apply_locality(ids[layer], knobs.locality, rng)
    starts, drawn_from = [], []  # the phases that hold tokens: before the shift (if any), after it (if any)
    if shift_token > 0 or shift_token == total:
        starts.append(0)
        drawn_from.append(0)
    if shift_token < total:
        starts.append(shift_token if starts else 0)
        drawn_from.append(1)
    distribution = TraceDistribution(tuple(starts), drawn[drawn_from], knobs.locality)
    return RoutingTrace(ids, num_experts, prompt_tokens, distribution)


def _apply_locality(ids: np.ndarray, locality: float, rng: np.random.Generator) -> None:
    """Each slot of ``ids`` (``[tokens, top_k]``, the fresh picks, rewritten in place) keeps the previous token's
    expert with probability ``locality``; the free slots take the token's fresh picks not kept, in order (there
    are always enough: the ``top_k`` picks are distinct, so at most one per kept expert is dropped)."""
    total, top_k = ids.shape
    keep = (rng.random((total, top_k)) < locality).tolist()
    rows = ids.tolist()
    for token in range(1, total):
        keep_row = keep[token]
        if any(keep_row):
            kept = [expert for expert, keep_slot in zip(rows[token - 1], keep_row, strict=True) if keep_slot]
            fresh = [expert for expert in rows[token] if expert not in kept]
            rows[token] = kept + fresh[: top_k - len(kept)]
    ids[:] = np.asarray(rows, dtype=ids.dtype).reshape(total, top_k)


def predicted_counts(
    trace: RoutingTrace, layer: int, token: int, accuracy: float, rng: np.random.Generator
) -> np.ndarray:
    """A look-ahead predictor for trace replay: the experts ``token`` selects in ``layer``, each of its
    ``top_k`` slots right with probability ``accuracy`` and otherwise an expert drawn uniformly from those it
    did not select. Stands in for running the next layer's router on the current hidden state (pre-gating),
    whose accuracy the caller states."""
    if not 0.0 <= accuracy <= 1.0:
        raise WorkloadError(f"look-ahead accuracy must be in [0, 1], got {accuracy}")
    true = trace.expert_ids[layer, token].tolist()
    counts = np.zeros(trace.num_experts, dtype=np.int64)
    draws = rng.random(len(true)).tolist()
    for expert, draw in zip(true, draws, strict=True):
        if draw < accuracy or len(true) >= trace.num_experts:
            counts[expert] += 1
            continue
        while True:  # a wrong guess: an expert this token did not select, not guessed yet
            guess = int(rng.integers(trace.num_experts))
            if guess not in true and counts[guess] == 0:
                counts[guess] += 1
                break
    return counts


def top_share(counts: np.ndarray, fraction: float = 0.10) -> float:
    """Share of all selections taken by the busiest ``fraction`` of experts (at least one expert)."""
    counts = np.sort(np.asarray(counts, dtype=np.float64))[::-1]
    top = max(1, int(round(fraction * counts.size)))
    return float(counts[:top].sum() / counts.sum())


def synthetic_top_share(num_experts: int, top_k: int, skew: float, tokens: int = 8192, seed: int = 0) -> float:
    """Top-10 % share of one synthetic layer (the quantity :func:`fit_skew` matches)."""
    trace = synthetic_trace(1, num_experts, top_k, tokens, 0, TraceKnobs(skew=skew, shift_at=None, seed=seed))
    return top_share(trace.counts(0, 0, tokens))


def fit_skew(num_experts: int, top_k: int, target_share: float, tokens: int = 8192, seed: int = 0) -> float:
    """The Zipf skew whose synthetic top-10 % share equals ``target_share`` (bisection, seeded)."""
    low, high = 0.0, 4.0
    if synthetic_top_share(num_experts, top_k, low, tokens, seed) >= target_share:
        return 0.0
    for _ in range(22):
        mid = 0.5 * (low + high)
        if synthetic_top_share(num_experts, top_k, mid, tokens, seed) < target_share:
            low = mid
        else:
            high = mid
    return round(0.5 * (low + high), 3)


def skew_for(model_name: str, level: str) -> float:
    """Calibrated skew of ``model_name`` at ``level`` (low/typical/high); unknown models use qwen3's range."""
    if level not in DEFAULT_SKEW_LEVELS:
        raise WorkloadError(f"skew level must be one of {DEFAULT_SKEW_LEVELS}, got {level!r}")
    levels = CALIBRATED_SKEW.get(model_name, CALIBRATED_SKEW["qwen3-30b-a3b"])
    return levels[DEFAULT_SKEW_LEVELS.index(level)]
