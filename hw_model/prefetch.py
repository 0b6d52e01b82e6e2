"""Which experts live in GPU memory: the dataset-free prefetcher (ours) and an LRU cache (offload baseline).

Dataset-free prefetch keeps online counts of expert selections per (layer, expert); no offline profile::

    prefill of layer l ──counts──▶ scores[l, :]
    first decode step ──▶ plan: the highest-scoring (layer, expert) pairs that fit residency_cap_bytes
                          ──▶ load queue (PCIe, in the background, layer order) ──▶ resident when copied
    every update_interval_tokens decode steps ──▶ scores decay, decode counts added, re-plan with hysteresis
    a selected expert that is not resident (yet) is a miss: the scheduler runs it on NDP or stages it;
    a staged copy of a planned expert is kept (adopted) instead of being copied again

Loads only use PCIe time the layers leave idle (see :meth:`ExpertPrefetcher.drain`), so a prefetch is never
free and a big residency cap can keep the link busy. Hits, misses and bytes moved are counted.

A small model's scores (at most :data:`LIST_KEPT_CELLS` layers x experts, as a session's report simulates) are
kept as Python lists, which a step's loops update and its re-plans rank faster than numpy's calls (they are copied
into the score array at each re-plan, for readers); the same values and plans to the last bit either way.

Residency is kept per layer as Python sets (:attr:`ExpertPrefetcher.resident_sets`): an invocation asks about a
handful of experts, where a set look-up is far cheaper than indexing an array; the re-plan, which ranks every
(layer, expert) pair at once, works on arrays built from them.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hw_model.errors import WorkloadError

_NO_EXPERTS: frozenset[int] = frozenset()
# a model of at most this many layers x experts keeps its per-expert step bookkeeping (prefetch scores and re-plans, the
# policies' drift histograms) as Python lists: compiled loops over them beat numpy's per-call cost up to about this
# size (the two cost the same per step at 128 cells: benchmarks/bench_simulator.py, "per-expert bookkeeping")
LIST_KEPT_CELLS = 128


@dataclass(frozen=True)
class PrefetchConfig:
    """Knobs of the prefetcher. ``decay`` multiplies old scores at each decode re-plan (1.0 = plain counts).
    ``change_z`` > 0 turns on the change detector (see :func:`change_statistic`): at each re-plan, per layer, the
    counts of the last ``w`` intervals (each ``w`` of ``change_windows``) are tested against the layer's counts
    before them; a layer whose test exceeds the chi-square quantile ``change_z`` standard normal deviates out
    forgets what came before (its scores restart from the window's counts). ``lazy_eviction``: a resident the plan
    drops stays resident (and hits) until a planned copy needs its bytes (the least valuable goes first); else it goes
    at the re-plan."""

    residency_cap_bytes: float
    update_interval_tokens: int = 32
    decay: float = 0.5
    swap_margin: float = 1.5
    change_z: float = 0.0
    change_windows: tuple[int, ...] = (1, 2, 4, 8)
    lazy_eviction: bool = True

    def __post_init__(self) -> None:
        if not self.residency_cap_bytes >= 0:
            raise WorkloadError("PrefetchConfig.residency_cap_bytes must be non-negative")
        if self.update_interval_tokens < 1:
            raise WorkloadError("PrefetchConfig.update_interval_tokens must be >= 1")
        if not 0.0 <= self.decay <= 1.0:
            raise WorkloadError("PrefetchConfig.decay must be in [0, 1]")
        if self.swap_margin < 1.0:
            raise WorkloadError("PrefetchConfig.swap_margin must be >= 1")
        if not 0.0 <= self.change_z < math.inf:
            raise WorkloadError("PrefetchConfig.change_z must be non-negative and finite")
        if not self.change_windows or any(w < 1 for w in self.change_windows):
            raise WorkloadError("PrefetchConfig.change_windows must be positive interval counts")


class ExpertPrefetcher:
    """Online-count prefetcher over ``num_layers`` x ``num_experts`` experts of ``expert_bytes[layer]`` each
    (``as_lists``: keep the scores as Python lists, or not, whatever the size; see the module docstring)."""

    def __init__(
        self,
        num_experts: list[int],
        expert_bytes: list[float],
        config: PrefetchConfig,
        *,
        as_lists: bool | None = None,
    ) -> None:
        if len(num_experts) != len(expert_bytes):
            raise WorkloadError("one expert count and one expert size per layer are needed")
        if not all(size > 0 and math.isfinite(size) for size in expert_bytes):
            raise WorkloadError(f"expert sizes must be positive and finite, got {list(expert_bytes)}")
        self.config = config
        self.expert_bytes = np.asarray(expert_bytes, dtype=np.float64)
        self._expert_bytes = self.expert_bytes.tolist()  # the same sizes as Python floats, per layer
        width = max(num_experts) if num_experts else 0
        self.scores = np.zeros((len(num_experts), width))  # with lists: a copy of them, made at each re-plan
        self._lists = len(num_experts) * width <= LIST_KEPT_CELLS if as_lists is None else as_lists
        self._score_rows: list[list[float]] = [[0.0] * width for _ in num_experts] if self._lists else []
        self.valid = np.zeros((len(num_experts), width), dtype=bool)
        for layer, count in enumerate(num_experts):
            self.valid[layer, :count] = True
        # per layer, the experts whose copy is on the GPU (sets: the simulator asks about a handful of experts
        # per invocation, where a set look-up is much cheaper than indexing an array)
        self.resident_sets: list[set[int]] = [set() for _ in num_experts]
        self.held_bytes = 0.0  # bytes of the resident experts (kept as they are loaded, adopted and evicted)
        self._widths = list(num_experts)
        self._wanted_sets: list[set[int]] = [set() for _ in num_experts]  # the plan, per layer
        self._wanted_mask = np.zeros_like(self.valid)  # the plan as an array (kept by the array ranking only)
        self._queue: deque[tuple[int, int, float]] = deque()  # (layer, expert, bytes left)
        # residents the plan no longer wants (lazy eviction), most valuable first: evicted from the end for copies
        self._leftovers: list[tuple[int, int]] = []
        self.queued_bytes = 0.0  # bytes left to copy in the queue (0 when it is empty)
        self._decode_steps = 0
        self._planned = False
        # the change detector's snapshots of the scores at the last re-plans (newest last), and per layer how many of
        # them hold counts since its last detected change (older ones are not compared with)
        self._history: deque[np.ndarray] = deque(maxlen=max(config.change_windows))
        self._ages = [0] * len(num_experts)
        # per interval since the last detected change, (selections of the favoured experts, all selections): per
        # layer, and summed over the layers
        self._window_shares: list[list[tuple[float, float]]] = [[] for _ in num_experts]
        self._all_shares: list[tuple[float, float]] = []
        self.changes_detected = 0
        self.hits = 0
        self.misses = 0
        self.bytes_moved = 0.0
        self.loads_completed = 0
        self.evictions = 0
        self.replans = 0
        self.adopted = 0
        # bytes the queued copies may still move (a power cap's energy budget sets it, hw_model/power_cap.py)
        self.allowance_bytes = math.inf

    # -- what the simulator asks ------------------------------------------------------------------------
    @property
    def resident(self) -> np.ndarray:
        """Resident experts as a layers x experts boolean array (a fresh copy of :attr:`resident_sets`)."""
        mask = np.zeros_like(self.valid)
        width = mask.shape[1]
        mask.ravel()[[layer * width + e for layer, experts in enumerate(self.resident_sets) for e in experts]] = True
        return mask

    def before_invocation(self, layer: int, phase: str) -> None:
        """Re-plan at the first decode step (from prefill counts) and every ``update_interval_tokens`` after."""
        if phase != "decode" or layer != 0:
            return
        if not self._planned:
            self._replan(first=True)
        elif self._decode_steps % self.config.update_interval_tokens == 0:
            self._replan(first=False)
        self._decode_steps += 1

    def observe(self, layer: int, counts: np.ndarray, phase: str) -> None:
        """Count this invocation's selections (and, in decode, its hits and misses against the current
        residency): :meth:`count_hits` and :meth:`add_scores` in one call."""
        if phase == "decode":
            self.count_hits(layer, np.flatnonzero(counts).tolist())
        self.add_scores(layer, counts)

    def count_hits(self, layer: int, active: list[int]) -> tuple[int, int]:
        """Count a decode invocation's selected experts ``active`` as hits (resident now) or misses."""
        hit = len(self.resident_sets[layer].intersection(active))
        miss = len(active) - hit
        self.hits += hit
        self.misses += miss
        return hit, miss

    def add_scores(self, layers: int | slice | Sequence[int] | np.ndarray, counts: np.ndarray) -> None:
        """Add selection counts to the scores: one layer's ``counts``, or rows of ``counts`` for ``layers``."""
        if self._lists:
            indices = [layers] if isinstance(layers, int) else _layer_indices(layers, len(self._score_rows))
            rows = counts.tolist()
            self._add_score_rows(indices, [rows] * len(indices) if counts.ndim == 1 else rows)
            return
        if counts.ndim == 1:
            self.scores[layers, : counts.size] += counts
        else:
            self.scores[layers, : counts.shape[1]] += counts

    def _add_score_rows(self, layers: Sequence[int], rows: list[list[int]]) -> None:
        for i in range(len(rows)):
            scores = self._score_rows[layers[i]]
            row = rows[i]
            for j in range(len(row)):
                scores[j] += row[j]

    def drain(self, seconds: float, bandwidth_bytes_per_s: float) -> float:
        """Copy queued experts for ``seconds`` of idle PCIe time; returns the bytes copied."""
        if not self._queue:  # nothing queued (queued_bytes is 0.0 then)
            return 0.0
        budget = min(seconds * bandwidth_bytes_per_s, self.allowance_bytes)
        copied: list[float] = []  # each copy's bytes, summed at the end
        queue, resident = self._queue, self.resident_sets
        while budget > 0 and queue:
            layer, expert, left = queue[0]
            if expert in resident[layer]:  # adopted from an on-demand copy meanwhile: nothing to copy
                queue.popleft()
                self.queued_bytes -= left
                continue
            if left == self._expert_bytes[layer] and self._leftovers:  # a copy starts: room for all of it
                self._make_room(left)
            step = left if left < budget else budget
            budget -= step
            self.queued_bytes -= step
            self.bytes_moved += step
            copied.append(step)
            if step >= left:
                queue.popleft()
                if expert in self._wanted_sets[layer]:
                    resident[layer].add(expert)
                    self.held_bytes += self._expert_bytes[layer]
                    self.loads_completed += 1
            else:
                queue[0] = (layer, expert, left - step)
        if not queue:  # what the subtractions leave is rounding: nothing is queued
            self.queued_bytes = 0.0
        total = sum(copied, 0.0)
        if self.allowance_bytes != math.inf:
            self.allowance_bytes = max(0.0, self.allowance_bytes - total)
        return total

    def adopt_staged(self, layer: int, expert: int) -> bool:
        """An on-demand (miss fallback) copy of ``expert`` reached the GPU: keep it if the plan wants it."""
        resident = self.resident_sets[layer]
        if expert in self._wanted_sets[layer] and expert not in resident:
            if self._leftovers:
                self._make_room(self._expert_bytes[layer])
            resident.add(expert)
            self.held_bytes += self._expert_bytes[layer]
            self.loads_completed += 1
            self.adopted += 1
            return True
        return False

    def adopt_prefill_copies(self, layer: int, copied: list[tuple[int, int]]) -> int:
        """Before the first plan, the prefill of ``layer`` copied ``copied`` (``(expert, tokens)`` pairs) to the GPU to
        run them there: keep the ones with the most tokens as resident (and planned), within this layer's share of
        the residency cap (the cap over the layers), instead of letting the copies go. The first decode step's plan
        then starts from them (its hysteresis keeps them unless clearly beaten). Returns how many were kept."""
        if self._planned or not copied:
            return 0
        size = self._expert_bytes[layer]
        share = self.config.residency_cap_bytes / len(self._expert_bytes)
        resident, wanted = self.resident_sets[layer], self._wanted_sets[layer]
        kept = 0
        for expert, _ in sorted(copied, key=lambda item: -item[1]):
            if (len(resident) + 1) * size > share:
                break
            if expert not in resident:
                resident.add(expert)
                wanted.add(expert)
                if not self._lists:
                    self._wanted_mask[layer, expert] = True
                self.held_bytes += size
                self.loads_completed += 1
                self.adopted += 1
                kept += 1
        return kept

    # -- planning ---------------------------------------------------------------------------------------
    def _replan(self, first: bool) -> None:
        """A re-plan: (after the first) the change detector's resets and the decay, on the score array (list-kept
        scores are copied into it and back: the same arithmetic either way), then the plan."""
        config = self.config
        scores = np.array(self._score_rows, dtype=np.float64).reshape(self.valid.shape) if self._lists else self.scores
        if not first:
            if config.change_z > 0:
                self._forget_before_changes(scores)
            if config.decay != 1.0:
                scores *= config.decay
                for snapshot in self._history:  # so that a snapshot still splits the scores into before and after
                    snapshot *= config.decay
        if config.change_z > 0:
            self._history.append(scores.copy())
            limit = len(self._history)
            self._ages = [min(age + 1, limit) for age in self._ages]
        self.scores = scores
        if self._lists:
            self._score_rows = scores.tolist()
        self._plan()

    def _forget_before_changes(self, scores: np.ndarray) -> None:
        """The change detector. Per layer, the share of the last interval's selections taken by the experts the
        counts before it favoured (as many as the plan holds in the layer, at least one) is recorded (out of sample:
        they were chosen before it), and summed over the layers. The share over the last ``w`` intervals (each ``w``
        of ``change_windows``) is tested against the share over the intervals before them since the last detected
        change (:func:`share_drop_z`), first over all layers (a domain shift moves every layer at once: their
        evidence adds up), then per layer; on a detection (the window with the largest statistic beyond
        ``change_z``), the layers concerned forget what came before the window (:meth:`_forget`)."""
        history, ages = self._history, self._ages
        kept_all, total_all = 0.0, 0.0
        for layer in range(scores.shape[0]):
            width = self._widths[layer]
            previous = history[-1][layer, :width]
            last = np.maximum(scores[layer, :width] - previous, 0.0)
            # a layer holding none competes for the cap with its favourite: at least one
            favoured = np.argsort(-previous, kind="stable")[: max(1, len(self._wanted_sets[layer]))]
            kept, total = float(last[favoured].sum()), float(last.sum())
            self._window_shares[layer].append((kept, total))
            kept_all += kept
            total_all += total
        self._all_shares.append((kept_all, total_all))
        window = self._changed_window(self._all_shares, len(history))
        if window:
            for layer in range(scores.shape[0]):
                if min(window, ages[layer]):  # a layer that changed since forgets back to its own change at most
                    self._forget(scores, layer, min(window, ages[layer]))
            self._all_shares.clear()
            return
        for layer in range(scores.shape[0]):
            window = self._changed_window(self._window_shares[layer], ages[layer])
            if window:
                self._forget(scores, layer, window)

    def _changed_window(self, records: list[tuple[float, float]], age: int) -> int:
        """The window (of ``change_windows``, within ``age`` snapshots) whose share of ``records`` (``(kept,
        total)`` per interval, oldest first) falls most below the share of the records before it, beyond
        ``change_z`` standard deviations; 0 for none."""
        best_window, best_z = 0, self.config.change_z
        for window in self.config.change_windows:
            if window >= len(records) or window > age:
                continue
            kept_before = math.fsum([kept for kept, _ in records[:-window]])
            total_before = math.fsum([total for _, total in records[:-window]])
            kept_after = math.fsum([kept for kept, _ in records[-window:]])
            total_after = math.fsum([total for _, total in records[-window:]])
            statistic = share_drop_z(kept_before, total_before, kept_after, total_after)
            if statistic > best_z:
                best_window, best_z = window, statistic
        return best_window

    def _forget(self, scores: np.ndarray, layer: int, window: int) -> None:
        """``layer`` changed ``window`` intervals ago: its scores and its newer snapshots lose the counts up to then."""
        history = self._history
        base = history[-window][layer].copy()
        scores[layer] = np.maximum(scores[layer] - base, 0.0)
        for back in range(1, window + 1):
            history[-back][layer] = np.maximum(history[-back][layer] - base, 0.0)
        self._ages[layer] = window - 1  # the window's snapshots (the oldest now empty) stay comparable
        self._window_shares[layer].clear()  # the plan changes: later intervals are compared with each other only
        self.changes_detected += 1

    def _plan(self) -> None:
        """Choose the resident set: best rates per byte within the cap; keep residents unless clearly beaten."""
        self._planned = True
        self.replans += 1
        wanted = self._choose_from_lists() if self._lists else self._choose_from_arrays()
        self._adopt(wanted)

    def _layer_masses(self) -> list[float]:
        """Per layer, the sum of its scores (1.0 for none): a score over it is the expert's share of the layer's
        selections, comparable across layers whose counts start at different times (after detected changes).
        Summed exactly, so that the list-kept and array-kept scores divide by the same values; all 1.0 when every
        layer's sum is the same (every layer counted the same selections: the usual case without detected changes)."""
        masses = [math.fsum(row) for row in self.scores.tolist()]
        if all(mass == masses[0] for mass in masses):  # no order to change (and none of a tie's rounding to risk)
            return [1.0] * len(masses)
        return [mass if mass > 0 else 1.0 for mass in masses]

    def _choose_from_arrays(self) -> list[set[int]]:
        """The new plan, per layer: every (layer, expert) ranked by score per byte (wanted ones times the swap margin,
        the hysteresis), in a stable order; taken in rank order while their sizes add up within the cap, those
        with a positive score."""
        masses = np.array(self._layer_masses())
        per_byte = np.where(self.valid, self.scores / masses[:, None] / self.expert_bytes[:, None], -np.inf)
        ranked = np.where(self._wanted_mask, per_byte * self.config.swap_margin, per_byte)
        order = np.argsort(-ranked, axis=None, kind="stable")
        sizes = np.broadcast_to(self.expert_bytes[:, None], self.valid.shape).ravel()[order]
        fits = (
            (np.cumsum(sizes) <= self.config.residency_cap_bytes)
            & (self.scores.ravel()[order] > 0)
            & np.isfinite(ranked.ravel()[order])
        )
        chosen = np.zeros(self.valid.size, dtype=bool)
        chosen[order[fits]] = True
        self._wanted_mask = chosen.reshape(self.valid.shape)
        return _per_layer_sets(self._wanted_mask)

    def _choose_from_lists(self) -> list[set[int]]:
        """What :meth:`_choose_from_arrays` chooses, from the list-kept scores: the same divisions and products,
        the same stable order (cells past a layer's experts rank last there and are never taken, so they are left
        out here), and the sizes added up in rank order as ``cumsum`` adds them."""
        margin = self.config.swap_margin
        masses = self._layer_masses()
        cells: list[tuple[int, int]] = []  # (layer, expert) of each valid cell, by layer then expert
        ranked: list[float] = []
        for layer in range(len(self._score_rows)):
            scores = self._score_rows[layer]
            size = self._expert_bytes[layer]
            mass = masses[layer]
            planned = self._wanted_sets[layer]
            for expert in range(self._widths[layer]):
                per_byte = scores[expert] / mass / size
                cells.append((layer, expert))
                ranked.append(per_byte * margin if expert in planned else per_byte)
        keys = [-value for value in ranked]  # numpy sorts the negated values: -0.0 and 0.0 tie there as here
        cap = self.config.residency_cap_bytes
        wanted: list[set[int]] = [set() for _ in self._score_rows]
        total = 0.0
        for i in sorted(range(len(keys)), key=keys.__getitem__):
            layer, expert = cells[i]
            total += self._expert_bytes[layer]
            if total > cap:  # sizes are not negative: no later cell fits either
                break
            if self._score_rows[layer][expert] > 0 and math.isfinite(ranked[i]):
                wanted[layer].add(expert)
        return wanted

    def _adopt(self, wanted: list[set[int]]) -> None:
        """Make ``wanted`` (per layer) the plan: residents it drops are evicted; the queued copies it still wants
        keep their order, then its other missing experts follow in layer order (decode needs layer 0 first)."""
        if self.config.lazy_eviction:
            self._keep_leftovers(wanted)
            resident_sets = self.resident_sets
        else:
            resident_sets = []
            for layer in range(len(wanted)):
                resident = self.resident_sets[layer]
                self.evictions += len(resident - wanted[layer])
                resident_sets.append(resident & wanted[layer])
            self.resident_sets = resident_sets
        sizes = self._expert_bytes
        self.held_bytes = sum([len(resident_sets[layer]) * sizes[layer] for layer in range(len(wanted))], 0.0)
        self._wanted_sets = wanted
        kept = deque([entry for entry in self._queue if entry[1] in wanted[entry[0]]])
        queued_bytes = float(sum([left for _, _, left in kept]))
        queued: list[set[int]] = [set() for _ in wanted]
        for layer, expert, _ in kept:
            queued[layer].add(expert)
        missing_bytes: list[float] = []
        for layer in range(len(wanted)):
            for expert in sorted(wanted[layer] - resident_sets[layer] - queued[layer]):
                kept.append((layer, expert, self._expert_bytes[layer]))
                missing_bytes.append(self._expert_bytes[layer])
        self._queue = kept
        self.queued_bytes = sum(missing_bytes, queued_bytes)

    def _keep_leftovers(self, wanted: list[set[int]]) -> None:
        """Lazy eviction: the residents ``wanted`` drops stay, ranked most valuable first by score per byte at this
        re-plan (ties: lower layer, then lower expert), for :meth:`_make_room` to evict from the end."""
        scores, sizes = self.scores, self._expert_bytes
        dropped = [
            (-float(scores[layer, expert]) / sizes[layer], layer, expert)
            for layer in range(len(wanted))
            for expert in self.resident_sets[layer] - wanted[layer]
        ]
        dropped.sort()
        self._leftovers = [(layer, expert) for _, layer, expert in dropped]

    def _make_room(self, size: float) -> None:
        """Evict leftovers, least valuable first, until ``size`` more bytes fit the cap (or none is left)."""
        leftovers, cap = self._leftovers, self.config.residency_cap_bytes
        while leftovers and self.held_bytes + size > cap:
            layer, expert = leftovers.pop()
            resident = self.resident_sets[layer]
            if expert in resident and expert not in self._wanted_sets[layer]:
                resident.discard(expert)
                self.held_bytes -= self._expert_bytes[layer]
                self.evictions += 1

    def stats(self) -> dict[str, float]:
        return self.stats_of(self.stats_values())

    def stats_values(self) -> tuple[int, int, float, int, int, int, int, int]:
        """What :meth:`stats` reports, as plain values of this moment (:meth:`stats_of` names them)."""
        resident = 0
        for experts in self.resident_sets:
            resident += len(experts)
        return (
            self.hits,
            self.misses,
            self.bytes_moved,
            self.loads_completed,
            self.evictions,
            self.replans,
            self.adopted,
            resident,
        )

    @staticmethod
    def stats_of(values: tuple[int, int, float, int, int, int, int, int]) -> dict[str, float]:
        hits, misses, bytes_moved, loads_completed, evictions, replans, adopted, resident = values
        return {
            **hit_stats("prefetch", hits, misses, bytes_moved),
            "prefetch_loads_completed": loads_completed,
            "prefetch_evictions": evictions,
            "prefetch_replans": replans,
            "prefetch_adopted_from_misses": adopted,
            "resident_experts": resident,
        }


def share_drop_z(kept_before: float, total_before: float, kept_after: float, total_after: float) -> float:
    """How far the share ``kept_after / total_after`` falls below ``kept_before / total_before``: the one-sided
    two-proportion z statistic (0.0 when either total is 0 or the pooled share is 0 or 1)."""
    if total_before <= 0 or total_after <= 0:
        return 0.0
    pooled = (kept_before + kept_after) / (total_before + total_after)
    if not 0.0 < pooled < 1.0:
        return 0.0
    spread = math.sqrt(pooled * (1.0 - pooled) * (1.0 / total_before + 1.0 / total_after))
    return (kept_before / total_before - kept_after / total_after) / spread


def _layer_indices(layers: slice | Sequence[int] | np.ndarray, num_layers: int) -> Sequence[int]:
    """The layer indices an :meth:`ExpertPrefetcher.add_scores` selector names (a slice as a range; no copy)."""
    if isinstance(layers, slice):
        return range(*layers.indices(num_layers))
    if isinstance(layers, np.ndarray):
        return layers.tolist()
    return layers


def _per_layer_sets(mask: np.ndarray) -> list[set[int]]:
    """The true entries of a layers x experts boolean array, as one set of experts per layer."""
    layers, experts = np.nonzero(mask)  # by layer, then by expert
    expert_list = experts.tolist()
    sets = []
    start = 0
    for end in np.searchsorted(layers, np.arange(1, mask.shape[0] + 1)).tolist():
        sets.append(set(expert_list[start:end]))
        start = end
    return sets


class ExpertLRUCache:
    """GPU-resident experts of the on-demand offload baseline: least recently used out when over capacity."""

    def __init__(self, capacity_bytes: float) -> None:
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[tuple[int, int], float] = OrderedDict()
        self._by_layer: dict[int, set[int]] = {}
        self._used_bytes = 0.0
        self.hits = 0
        self.misses = 0
        self.bytes_moved = 0.0

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self._entries

    def use(self, key: tuple[int, int], size_bytes: float) -> bool:
        """Touch ``key``; returns whether it was resident (a miss loads it, counting the bytes)."""
        hits = self.hits
        self.use_all([key], size_bytes)
        return self.hits > hits

    def use_all(self, keys: list[tuple[int, int]], size_bytes: float) -> None:
        """Touch each of ``keys`` in turn (``size_bytes`` each): a resident one becomes the most recently used, a
        missing one is loaded (counting its bytes), the least recently used going out while over capacity."""
        entries, by_layer, capacity = self._entries, self._by_layer, self.capacity_bytes
        hits = 0
        for key in keys:
            if key in entries:
                entries.move_to_end(key)
                hits += 1
                continue
            self.misses += 1
            self.bytes_moved += size_bytes
            if size_bytes > capacity:
                continue
            entries[key] = size_bytes
            cached = by_layer.get(key[0])
            if cached is None:
                cached = by_layer[key[0]] = set()
            cached.add(key[1])
            used = self._used_bytes + size_bytes
            while used > capacity:
                (layer, expert), freed = entries.popitem(last=False)
                by_layer[layer].discard(expert)
                used -= freed
            self._used_bytes = used
        self.hits += hits

    def resize(self, capacity_bytes: float) -> None:
        """Make the capacity ``capacity_bytes``, the least recently used going out while over it."""
        self.capacity_bytes = capacity_bytes
        used = self._used_bytes
        while used > capacity_bytes and self._entries:
            (layer, expert), freed = self._entries.popitem(last=False)
            self._by_layer[layer].discard(expert)
            used -= freed
        self._used_bytes = used if self._entries else 0.0

    def experts_of(self, layer: int) -> set[int] | frozenset[int]:
        """The cached experts of ``layer`` (keys are ``(layer, expert)``)."""
        return self._by_layer.get(layer, _NO_EXPERTS)

    def stats(self) -> dict[str, float]:
        return self.stats_of(self.stats_values())

    def stats_values(self) -> tuple[int, int, float]:
        """What :meth:`stats` reports, as plain values of this moment (:meth:`stats_of` names them)."""
        return (self.hits, self.misses, self.bytes_moved)

    @staticmethod
    def stats_of(values: tuple[int, int, float]) -> dict[str, float]:
        return hit_stats("cache", values[0], values[1], values[2])


def hit_stats(prefix: str, hits: int, misses: int, bytes_moved: float) -> dict[str, float]:
    """Hits, misses, hit rate and bytes moved, keyed ``{prefix}_hits`` etc."""
    selections = hits + misses
    return {
        f"{prefix}_hits": hits,
        f"{prefix}_misses": misses,
        f"{prefix}_hit_rate": hits / selections if selections else 0.0,
        f"{prefix}_bytes_moved": bytes_moved,
    }
