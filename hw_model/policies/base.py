"""The policy framework: the :class:`Policy` protocol, its per-run :class:`PolicyState`, and the registry
(:func:`register`, :func:`get_policy`, :func:`policy_names`) the simulator and ``bench`` find policies through."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from mypy_extensions import mypyc_attr

from hw_model.errors import SettingsError
from hw_model.layout import InvocationLayout, LayoutState
from hw_model.policies.drift import DriftTracker
from hw_model.prefetch import ExpertLRUCache, ExpertPrefetcher
from hw_model.run_context import RunContext

ROLES = ("baseline", "ours", "extension", "ablation", "bound")
LAYOUTS = ("sliced", "whole", "host", "dual")


@dataclass
class PolicyState(LayoutState):
    """Mutable per-run state of a policy: residency (prefetcher / LRU), cached plans, counters (and the layouts'
    memos, :class:`~hw_model.layout.LayoutState`)."""

    prefetcher: ExpertPrefetcher | None = None
    lru: ExpertLRUCache | None = None
    histograms: dict[str, DriftTracker] = field(default_factory=dict)  # per phase
    pack_memo: dict[tuple, Any] = field(default_factory=dict)  # packer and balancing-rule decisions
    recomputations: int = 0
    reuses: int = 0
    decode_recomputations: int = 0
    decision_times_s: list[float] = field(default_factory=list)
    staged_ahead: dict[int, set[int]] = field(default_factory=dict)


@mypyc_attr(allow_interpreted_subclasses=True)  # a policy defined outside hw_model works compiled too
class Policy(ABC):
    """The protocol every policy implements (see the module docstring)."""

    name: ClassVar[str]
    role: ClassVar[str]
    description: ClassVar[str]
    source: ClassVar[str] = ""
    needs_ndp: ClassVar[bool] = True
    tensor_parallel: ClassVar[bool] = False
    layout: ClassVar[str] = "whole"
    keeps_residents: ClassVar[bool] = False
    lookahead: ClassVar[bool] = False

    def new_state(self, ctx: RunContext) -> PolicyState:
        """Fresh per-run state (called once per simulator)."""
        return PolicyState()

    def begin_step(
        self, ctx: RunContext, state: PolicyState, layers: Sequence[int], counts: np.ndarray, phase: str
    ) -> None:
        """Called before the invocations of ``layers`` (in that order, ``counts[i]`` for ``layers[i]``): work
        a policy can do for all of them at once. Default: nothing."""
        return None

    @abstractmethod
    def place(self, ctx: RunContext, state: PolicyState, out: InvocationLayout, phase: str) -> None:
        """Place one invocation's active experts (``out.active``, with ``out.active_tokens`` tokens each): record
        a decision for each on ``out`` and finish it (:meth:`InvocationLayout.finish`)."""

    def copy_sources(self, units: int) -> int:
        """How many DIMMs one expert's copy reads in parallel under this policy's weight layout."""
        if units == 0:
            return 0
        return 1 if self.layout == "whole" else units


_REGISTRY: dict[str, Policy] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Validate a policy's declaration and add an instance to the registry (usable as a class decorator)."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__name__} must declare a non-empty name")
    if name in _REGISTRY:
        raise TypeError(f"policy {name!r} registered twice")
    if getattr(cls, "role", None) not in ROLES:
        raise TypeError(f"policy {name!r}: role must be one of {ROLES}")
    if cls.layout not in LAYOUTS:
        raise TypeError(f"policy {name!r}: layout must be one of {LAYOUTS}")
    _REGISTRY[name] = cls()
    return cls


def get_policy(name: str) -> Policy:
    """The registered policy ``name``; unknown names raise :class:`SettingsError` listing the known ones (the one
    check of a policy's name, which :class:`hw_model.settings.SimulationSettings` makes)."""
    policy = _REGISTRY.get(name)
    if policy is None:
        raise SettingsError(f"unknown policy {name!r} (known: {', '.join(_REGISTRY)})", "policy")
    return policy


def policy_names(role: str | None = None) -> tuple[str, ...]:
    """Registered policy names in registration order, optionally only those of one ``role``."""
    return tuple(name for name, p in _REGISTRY.items() if role is None or p.role == role)
