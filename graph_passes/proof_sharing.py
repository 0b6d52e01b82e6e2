"""One numeric proof per block signature: the first block of each signature is checked (on its sampled experts
when large), every later block with that signature is covered by that check.

A covered block takes the reading its signature's check chose, at the same position among its own readings (its
readings are the same plans up to names: :func:`graph_passes.signature.block_signature`), and is reported with
``proven_by`` naming the checked block. What this relies on, and what stands in for the covered block's own
check, is in :mod:`graph_passes.signature` (the rewrite is a data-independent function of the signature) and
:mod:`graph_passes.shard_audit` (its shards must be exact byte views of its own weights; the caller audits them
while writing and commits nothing when one does not hold). A block is covered only when its shards can be
audited so (:func:`graph_passes.rewrite.shards_are_views`); a block whose signature's check did not prove a
reading numerically (skipped, structural only) gets its own check.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import onnx

from graph_passes.graph_index import GraphIndex
from graph_passes.plan import MoECandidate
from graph_passes.region import isolated_region
from graph_passes.signature import block_signature, expert_tensors
from graph_passes.weights import WeightStore

# a graph_passes.verify.Verdict (not imported: verify asks this module, see choose_readings there)
Verdict = TypeVar("Verdict", bound=Any)


def representatives(
    model: onnx.ModelProto, index: GraphIndex, candidates: list[MoECandidate], store: WeightStore
) -> dict[int, int]:
    """``{position: position of the first candidate with its signature}`` for every candidate an earlier one covers
    (those whose shards can be audited and whose region can be isolated)."""
    from graph_passes.rewrite import shards_are_views

    first_of: dict[str, int] = {}
    covered: dict[int, int] = {}
    for position, candidate in enumerate(candidates):
        if not all(shards_are_views(reading, store) for reading in candidate.readings):
            continue
        region = isolated_region(model, index, candidate.readings[0])
        if region is None:
            continue
        large = set().union(*(expert_tensors(r) for r in candidate.readings))
        signature = block_signature(region, candidate, large)
        if signature in first_of:
            covered[position] = first_of[signature]
        else:
            first_of[signature] = position
    return covered


class _Once:
    """A check run at most once, whoever asks first (the checked block's own pending check, or a covered one's)."""

    def __init__(self, check: Callable[[], Any]) -> None:
        self._check = check
        self._lock = threading.Lock()
        self._outcome: Any = None

    def __call__(self) -> Any:
        with self._lock:
            if self._outcome is None:
                self._outcome = self._check()
            return self._outcome


def covered_verdict(
    first: MoECandidate, first_verdict: Verdict, candidate: MoECandidate, own: Callable[[], Verdict]
) -> tuple[Verdict, Verdict]:
    """``first``'s verdict (its pending check made shareable) and ``candidate``'s, covered by ``first``'s check:
    speculative when that check is still pending; ``own()`` (``candidate``'s own check) when that check proves no
    reading numerically."""
    if first_verdict.deferred is None:
        return first_verdict, _derived(first, first_verdict, candidate, own)
    shared = first_verdict.deferred if isinstance(first_verdict.deferred, _Once) else _Once(first_verdict.deferred)
    first_verdict = dataclasses.replace(first_verdict, deferred=shared)
    position = first.readings.index(first_verdict.plan)
    speculative = dataclasses.replace(
        first_verdict,
        plan=candidate.readings[position],
        proven_by=first.name,
        deferred=lambda: _derived(first, shared(), candidate, own),
    )
    return first_verdict, speculative


def _derived(first: MoECandidate, outcome: Verdict, candidate: MoECandidate, own: Callable[[], Verdict]) -> Verdict:
    if outcome.plan is None or not outcome.checked_numerically or outcome.proven_by:
        return own()
    reading = candidate.readings[first.readings.index(outcome.plan)]
    note = f"covered by the numeric check of {first.name} (same signature); its shards audited as its own bytes"
    return dataclasses.replace(
        outcome, plan=reading, max_abs_error=None, note=note, proven_by=first.name, deferred=None
    )
