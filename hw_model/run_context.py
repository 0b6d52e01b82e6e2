"""What a policy reads about one run: :class:`RunContext` (the system, the layers, memory budgets, the tuning
knobs) and :class:`ExpertCosts` (memoised per-expert costs on the system).

Below both :mod:`hw_model.layout` and :mod:`hw_model.policies`, which read them, so that neither imports the other
for them (the policies lay their invocations out with :class:`~hw_model.layout.InvocationLayout`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hw_model.cost import ExpertShard
from hw_model.errors import WorkloadError
from hw_model.hardware import SystemSpec
from hw_model.tuning import SimulatorTuning
from hw_model.workload import ExpertShape, MoELayerShape

__all__ = ["ExpertCosts", "RunContext"]


class ExpertCosts:
    """Memoised per-expert costs on one system (tokens -> seconds), shared by every policy.

    Copies: a copy of an expert reads ``sources`` DIMMs in parallel, each capped at its channel's host-read
    bandwidth, and all of it crosses PCIe: ``latency + bytes / min(PCIe, sources x channel)``. Each source
    DIMM loses ``bytes / sources`` of DRAM streaming time (:meth:`copy_read_s`) to the copy.
    """

    def __init__(self, system: SystemSpec) -> None:
        self.system = system
        self._memo: dict[tuple, float] = {}
        self._shapes: dict[int, ExpertShape] = {}  # keeps the shapes keyed by id() alive
        self._pairs: dict[tuple, tuple[float, float]] = {}  # ndp_pair: keys also in _memo (shapes kept alive)
        self._shards: dict[tuple, ExpertShard] = {}  # (id(expert), device kind, shards) -> its terms (see ndp_s)
        # _split_part_costs: (id(expert), tokens, k, units, sources) -> its four terms (shape kept in _shapes)
        self.split_parts: dict[tuple, tuple[float, float, float, float]] = {}

    def _store(self, key: tuple, expert: ExpertShape, value: float) -> float:
        self._shapes[id(expert)] = expert
        self._memo[key] = value
        return value

    def _shard(self, expert: ExpertShape, kind: int, shards: float) -> ExpertShard:
        """:func:`~hw_model.cost.expert_shard_time_s`'s shard of ``expert`` on the NDP unit (``kind`` 0) or the GPU
        (1), kept per shard count: its token-independent terms are computed once, not per token count."""
        key = (id(expert), kind, shards)
        shard = self._shards.get(key)
        if shard is None:
            self._shapes[id(expert)] = expert
            device = self.system.ndp_unit if kind == 0 else self.system.gpu
            shard = self._shards[key] = ExpertShard(device, expert, shards)
        return shard

    # each accessor looks the memo up first and computes only on a miss (the hot path of every invocation)
    def ndp_s(self, expert: ExpertShape, tokens: int, shards: float) -> float:
        key = (id(expert), 0, tokens, shards)
        value = self._memo.get(key)
        if value is None:
            value = self._store(key, expert, self._shard(expert, 0, shards).time_s(tokens))
        return value

    def ndp_dram_s(self, expert: ExpertShape, tokens: int, shards: float) -> float:
        """DRAM streaming time of one NDP shard: its weight and activation bytes at the unit's bandwidth."""
        key = (id(expert), 3, tokens, shards)
        value = self._memo.get(key)
        if value is None:
            streamed = expert.weight_bytes(shards) + expert.activation_bytes(tokens, shards)
            value = self._store(key, expert, streamed / self.system.ndp_unit.achievable_bandwidth_bytes_per_s)
        return value

    def ndp_pair(self, expert: ExpertShape, tokens: int, shards: float) -> tuple[float, float]:
        """``(ndp_s, ndp_dram_s)`` of one shard in one look-up."""
        key = (id(expert), 5, tokens, shards)
        value = self._pairs.get(key)
        if value is None:
            value = self._pairs[key] = (self.ndp_s(expert, tokens, shards), self.ndp_dram_s(expert, tokens, shards))
        return value

    def gpu_s(self, expert: ExpertShape, tokens: int) -> float:
        key = (id(expert), 1, tokens, 1)
        value = self._memo.get(key)
        if value is None:
            value = self._store(key, expert, self._shard(expert, 1, 1).time_s(tokens))
        return value

    def beyond_ndp_ridge(self, expert: ExpertShape, tokens: int) -> bool:
        """Whether ``expert`` over ``tokens`` tokens has more FLOPs per weight byte than the NDP unit's ridge point
        (its achievable FLOP/s over its bandwidth): compute-bound on NDP."""
        key = (id(expert), 7, tokens, 0)
        value = self._memo.get(key)
        if value is None:
            unit = self.system.ndp_unit
            ridge = unit.achievable_flops_per_s(expert.dtype) / unit.achievable_bandwidth_bytes_per_s
            value = self._store(key, expert, expert.flops(tokens) / expert.weight_bytes() > ridge)
        return bool(value)

    def copy_bandwidth(self, sources: int) -> float:
        """Bytes/s of a weight copy reading ``sources`` DIMMs in parallel (0 sources: PCIe only)."""
        pcie = self.system.host_link.bandwidth_bytes_per_s
        if sources <= 0:
            return pcie
        return min(pcie, sources * self.system.ndp_unit.host_read_bandwidth_bytes_per_s)

    def transfer_s(self, expert: ExpertShape, sources: int = 1) -> float:
        key = (id(expert), 2, sources, 0)
        value = self._memo.get(key)
        if value is None:
            seconds = self.system.host_link.latency_s + expert.weight_bytes() / self.copy_bandwidth(sources)
            value = self._store(key, expert, seconds)
        return value

    def copy_read_s(self, expert: ExpertShape, sources: int) -> float:
        """DRAM time one source DIMM gives up to a copy of ``expert`` read from ``sources`` DIMMs."""
        if sources <= 0:
            return 0.0
        key = (id(expert), 4, sources, 0)
        value = self._memo.get(key)
        if value is None:
            unit = self.system.ndp_unit
            value = self._store(key, expert, expert.weight_bytes() / sources / unit.achievable_bandwidth_bytes_per_s)
        return value


@dataclass(frozen=True)
class RunContext:
    """What a policy may read about the run: the system, costs and memory budgets (one GPU memory pool), how
    many DIMMs one expert's copy reads in parallel under the policy's weight layout (:meth:`Policy.copy_sources`),
    whether its NDP work is tensor-parallel, and the run's tuning knobs."""

    system: SystemSpec
    layers: tuple[MoELayerShape, ...]
    costs: ExpertCosts
    residency_cap_bytes: float
    staging_cap_bytes: float
    copy_sources: int
    tensor_parallel: bool  # the policy's NDP work is sliced over every unit (:attr:`Policy.tensor_parallel`)
    tuning: SimulatorTuning  # the run's settings (:class:`hw_model.settings.SimulationSettings`), as policies read them
    # per layer, a small id shared by the layers whose placement decisions and layouts coincide for equal
    # decisions: equal expert shape (by value, so every layer of a model shares one) and top_k (it sets the
    # activation copy); the memo keys of layouts and packer decisions start with it
    layer_classes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    # per layer, the bytes of one stored expert (``layer.expert.weight_bytes()``)
    expert_bytes: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        classes: dict[tuple[ExpertShape, int], int] = {}
        layer_classes = tuple(classes.setdefault((lay.expert, lay.top_k), len(classes)) for lay in self.layers)
        object.__setattr__(self, "layer_classes", layer_classes)  # derived fields of a frozen dataclass
        object.__setattr__(self, "expert_bytes", tuple(layer.expert.weight_bytes() for layer in self.layers))
        if self.residency_cap_bytes < 0 or self.staging_cap_bytes < 0:
            raise WorkloadError("residency and staging caps must be non-negative")
