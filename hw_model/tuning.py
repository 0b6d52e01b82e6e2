"""The simulator's tuning knobs: the part of :class:`hw_model.settings.SimulationSettings` the policies read.

A frozen dataclass of its own, below :mod:`hw_model.policies` (whose :class:`~hw_model.policies.RunContext` holds
it), so that the settings, which check a policy's name against the policies' registry, sit above the policies
without an import circle. Each field's ``metadata`` holds its ``help`` text, from which the command line builds
its option (:func:`ndp_ep.cli_args.add_tuning_args`); docs/settings.md says how to add a knob.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hw_model.errors import SettingsError
from hw_model.units import finite_number

# share of the GPU expert pool kept resident: all of it (the simulator keeps one expert's room for staging, and
# dynamic staging lets on-demand copies use what residents do not hold); docs/bench.md's budget sweep measures it
DEFAULT_RESIDENCY_FRACTION = 1.0


def setting(default: Any, help: str, **metadata: Any) -> Any:
    """A settings field: its default and the ``help`` text its command-line option shows (plus, optionally,
    ``metavar``; ``cli=False`` keeps it off the command line)."""
    return field(default=default, metadata={"help": help, **metadata})


def _number(name: str, value: object) -> float:
    number = finite_number(value)  # None for a non-number and an integer beyond float range
    if number is None:
        shown = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else "an integer beyond float range"
        raise SettingsError(f"{name} must be a finite number, got {shown}", name)
    return number


def check_fraction(name: str, value: object, *, open_low: bool = False) -> None:
    """:class:`SettingsError` naming ``name`` unless ``value`` is a number in [0, 1] ((0, 1] with ``open_low``)."""
    number = _number(name, value)
    above_low = number > 0.0 if open_low else number >= 0.0
    if not above_low or number > 1.0:
        raise SettingsError(f"{name} must be in {'(0' if open_low else '[0'}, 1], got {value!r}", name)


@dataclass(frozen=True, kw_only=True)
class SimulatorTuning:
    """How the simulator and its policies are tuned (every field has the default the paper's runs use)."""

    residency_fraction: float = setting(
        DEFAULT_RESIDENCY_FRACTION,
        "share (0-1) of the GPU expert pool that policies keeping experts resident use for them; the rest stages "
        "on-demand copies",
        metavar="F",
    )
    drift_threshold: float = setting(
        0.25,
        "L1 drift of a layer's smoothed activation histogram from the one its placement was planned on beyond "
        "which the placement is recomputed (0: every invocation)",
        metavar="F",
    )
    drift_smoothing: float = setting(
        0.1, "weight (0-1, not 0) of the newest invocation in the smoothed activation histograms", metavar="F"
    )
    prefetch_interval_tokens: int = setting(
        32, "decode steps between the prefetcher's re-plans of the resident experts", metavar="N"
    )
    prefetch_decay: float = setting(
        1.0, "decay (0-1) of the prefetcher's expert scores at each re-plan (1: plain counts)", metavar="F"
    )
    dynamic_staging: int = setting(
        1,
        "1: the packer's on-demand copies may use all of the GPU pool the prefetcher's residents do not hold (the "
        "prefill, before any is loaded, the whole pool); 0: only the fixed staging share",
        metavar="0|1",
    )
    adopt_prefill_copies: int = setting(
        1,
        "1: the experts the prefill copies to the GPU to run them stay resident (those with the most tokens, within "
        "each layer's share of the residency cap) until the first decode plan; 0: the copies go",
        metavar="0|1",
    )
    eager_prefetch: int = setting(
        0,
        "1: the prefetcher's queued copies also run while the NDP units work (the PCIe link idles then), their DRAM "
        "reads delaying the invocation (measured: no gain but on Mixtral, docs/bench.md); 0: only in the PCIe and DIMM "
        "idle time",
        metavar="0|1",
    )
    replan_on_residency: int = setting(
        1,
        "1: a reused placement is re-planned when an active expert's residency disagrees with it (resident but "
        "planned on the NDP units, or planned on the GPU but not resident); 0: reused whatever the residency",
        metavar="0|1",
    )
    power_cap_w: float = setting(
        0.0,
        "average-power cap, watts: tp+lb and ours take the fastest placement whose run-average power "
        "(hw_model/energy.py's accounting) stays within it; 0: no cap",
        metavar="W",
    )
    replan_on_copies: int = setting(
        1,
        "1: a placement is not reused for an invocation that does not select every expert its plan copied to the GPU "
        "(reused for other experts, it would copy none); 0: reused as any other",
        metavar="0|1",
    )
    balance_split: int = setting(
        1,
        "1: ours splits one expert between the GPU and the NDP units after the packer (1/k or all but 1/k of its FFN "
        "columns on the GPU, k in 2..8, the expert and k that end the layer soonest, only when that is sooner); 0: "
        "whole experts only",
        metavar="0|1",
    )
    prefetch_change_z: float = setting(
        3.0,
        "the prefetcher's change detector: when the share of a layer's (or all layers' pooled) selections over its "
        "last 1, 2, 4 or 8 re-plan intervals that the experts its earlier counts favoured take falls below their "
        "earlier share by more than this many standard deviations (one-sided two-proportion test), the layer "
        "forgets the earlier counts (0: off)",
        metavar="Z",
    )
    prefetch_lazy_eviction: int = setting(
        1,
        "1: a resident expert the prefetcher's re-plan drops stays resident (and hits) until a planned copy needs its "
        "bytes, the least valuable first; 0: it is evicted at the re-plan",
        metavar="0|1",
    )

    def __post_init__(self) -> None:
        check_fraction("residency_fraction", self.residency_fraction)
        if _number("drift_threshold", self.drift_threshold) < 0:
            problem = f"drift_threshold must be non-negative, got {self.drift_threshold!r}"
            raise SettingsError(problem, "drift_threshold")
        check_fraction("drift_smoothing", self.drift_smoothing, open_low=True)
        interval = self.prefetch_interval_tokens
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise SettingsError(
                f"prefetch_interval_tokens must be a positive integer, got {interval!r}", "prefetch_interval_tokens"
            )
        check_fraction("prefetch_decay", self.prefetch_decay)
        for name in (
            "dynamic_staging",
            "adopt_prefill_copies",
            "eager_prefetch",
            "replan_on_residency",
            "replan_on_copies",
            "balance_split",
            "prefetch_lazy_eviction",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or value not in (0, 1):
                raise SettingsError(f"{name} must be 0 or 1, got {value!r}", name)
        if _number("power_cap_w", self.power_cap_w) < 0:
            raise SettingsError(f"power_cap_w must be non-negative, got {self.power_cap_w!r}", "power_cap_w")
        if _number("prefetch_change_z", self.prefetch_change_z) < 0:
            problem = f"prefetch_change_z must be non-negative, got {self.prefetch_change_z!r}"
            raise SettingsError(problem, "prefetch_change_z")
