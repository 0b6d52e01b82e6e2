"""The per-block check that stands in for a numeric proof shared with another block: its shards are exact byte
views of its own weights.

A block covered by another block's proof (same signature, see :mod:`graph_passes.signature`) was rewritten by the
same plan, so its shards are the same data-independent function of its weights; what is left to check is that the
function was applied to *its* bytes. :class:`ShardAudit` watches the block's shards as the writer produces them
(no second read: a shard is a view of the source's file pages, and only the view's addresses are looked at) and
:meth:`ShardAudit.holds` says whether

* every shard part is a view of the mapped data file of one of the block's own expert tensors, inside the window
  of the expert the shard belongs to, and
* those views tile every such tensor exactly: each byte of it in exactly one shard, none left out, none twice.

A part that is not a view (a copy, synthesized default zero points) is not counted, so a tensor whose bytes reach
the shards through copies fails the second condition: the audit fails closed, and the caller proves the block on
its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class SourceRange:
    """One expert tensor of a block in its data file: ``[offset, offset + length)`` of ``path``, ``experts`` windows
    of equal size."""

    path: str
    offset: int
    length: int
    experts: int

    def __post_init__(self) -> None:
        if self.offset < 0 or self.length < 0 or self.experts < 1 or self.length % self.experts:
            raise ValueError(f"inconsistent source range {self}")

    def window(self, expert: int) -> tuple[int, int]:
        per = self.length // self.experts
        return self.offset + expert * per, self.offset + (expert + 1) * per


# ``count`` runs of ``length`` bytes, ``stride`` bytes apart, the first at ``start`` (file offsets)
Runs = tuple[int, int, int, int]


def _mapped_base(view: np.ndarray) -> np.memmap | None:
    base = view.base
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    return base if base is not None and base.filename is not None else None


def byte_runs(
    view: np.ndarray, describe: Callable[[np.memmap], tuple[int, str]] | None = None
) -> tuple[str, list[Runs]] | None:
    """The file and the byte runs ``view`` covers in it (one :data:`Runs` per index of its axes but the last two
    non-contiguous ones: one for a row block or a column block), or None when ``view`` is not a view of a
    memory-mapped file (a copy, a synthesized array). ``describe``: the address of a mapping's first byte and
    its file's path (a caller's memo)."""
    base = _mapped_base(view)
    if base is None or not view.nbytes:
        return None
    address, path = describe(base) if describe is not None else _described(base)
    start = _address(view) - address + int(base.offset)
    shape, strides = list(view.shape), list(view.strides)
    length = view.dtype.itemsize
    while shape and strides[-1] == length:  # trailing axes laid out contiguously: one run
        length *= shape.pop()
        strides.pop()
    while shape and shape[-1] == 1:
        shape.pop()
        strides.pop()
    if not shape:
        return path, [(start, 1, length, length)]
    count, stride = shape.pop(), strides.pop()
    if not shape:
        return path, [(start, count, stride, length)]
    firsts = [start]
    for extent, step in zip(shape, strides, strict=True):  # axes above the runs' (a 3-D view): rare, few
        firsts = [first + i * step for first in firsts for i in range(extent)]
    return path, [(first, count, stride, length) for first in firsts]


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def _described(base: np.memmap) -> tuple[int, str]:
    return _address(base), os.fspath(base.filename)


class ShardAudit:
    """Records the byte runs of one block's shards (:meth:`record`, once per shard tensor) and judges them
    (:meth:`holds`). Safe to record from several threads."""

    def __init__(self, block: str, sources: dict[str, SourceRange], tensors: int) -> None:
        self.block = block
        self.sources = sources
        self.tensors = tensors  # how many shard tensors the block has: each must be recorded
        self._runs: dict[str, list[tuple[str, int, list[Runs]]]] = {}
        self._lock = threading.Lock()
        # the last mapping seen (one expert's window), its address and its file's path
        self._base: tuple[np.memmap, int, str] | None = None

    def record(self, tensor: str, expert: int, parts) -> None:
        """``parts`` (an array or a tuple of arrays) produced for shard tensor ``tensor`` of ``expert``; a tensor
        produced again (written twice) is recorded once. Only addresses are read here (the writer's loop): the
        runs are judged by :meth:`holds`."""
        parts = (parts,) if isinstance(parts, np.ndarray) else parts
        runs = []
        for part in parts:
            found = byte_runs(part, self._describe)
            if found is not None:
                runs.append((found[0], expert, found[1]))
        with self._lock:
            self._runs.setdefault(tensor, runs)

    def _describe(self, base: np.memmap) -> tuple[int, str]:
        memo = self._base  # read once: another thread may replace it
        if memo is None or memo[0] is not base:
            memo = self._base = (base, *_described(base))
        return memo[1], memo[2]

    def holds(self) -> str:
        """ "" when every shard was recorded, every run lies in its expert's window of one of the block's tensors
        and the runs tile every such tensor exactly; else why not."""
        self._base = None
        if len(self._runs) != self.tensors:
            return f"{self.tensors - len(self._runs)} of {self.tensors} shard tensors of {self.block} never produced"
        by_file: dict[str, list[tuple[int, list[Runs]]]] = {}
        for recorded in self._runs.values():
            for path, expert, runs in recorded:
                by_file.setdefault(path, []).append((expert, runs))
        expected: dict[str, list[SourceRange]] = {}
        for source in self.sources.values():
            expected.setdefault(source.path, []).append(source)
        if set(by_file) - set(expected):
            return f"{self.block}: its shards read a file none of its weights is in"
        for path, sources in expected.items():
            recorded = by_file.get(path, [])
            if not _inside_windows(recorded, sources):
                return f"{self.block}: a shard reads bytes outside its expert's windows of the block's own weights"
            runs = [run for _, found in recorded for run in found]
            ranges = [(source.offset, 1, source.length, source.length) for source in sources]
            if _merged(runs) != _merged(ranges):
                return f"{self.block}: its shards do not tile its weights in {Path(path).name} byte for byte"
        return ""


def _inside_windows(recorded: list[tuple[int, list[Runs]]], sources: list[SourceRange]) -> bool:
    """Whether every run (of the expert it is recorded for) lies within that expert's window of one source."""
    if not recorded:
        return True
    rows = [(expert, *run) for expert, runs in recorded for run in runs]
    expert, start, count, stride, length = np.array(rows, dtype=np.int64).reshape(-1, 5).T
    last = start + (count - 1) * stride
    low, high = np.minimum(start, last), np.maximum(start, last) + length
    sources = sorted(sources, key=lambda source: source.offset)
    offsets = np.array([source.offset for source in sources], dtype=np.int64)
    per = np.array([source.length // source.experts for source in sources], dtype=np.int64)
    experts = np.array([source.experts for source in sources], dtype=np.int64)
    which = np.searchsorted(offsets, low, side="right") - 1
    if np.any(which < 0):
        return False
    window = offsets[which] + expert * per[which]
    return bool(np.all((expert < experts[which]) & (low >= window) & (high <= window + per[which])))


def _collapsed(runs: list[Runs]) -> tuple[list[tuple[int, int]], list[Runs]]:
    """``runs`` as contiguous ``(start, end)`` intervals where they join up — the column blocks of one matrix (runs
    of equal count and stride side by side) fill its rows, so together they are one interval — and the runs that
    do not join up (expanded by the caller)."""
    intervals: list[tuple[int, int]] = []
    rest: list[Runs] = []
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for start, count, stride, length in runs:
        if count == 1 or stride == length:
            intervals.append((start, start + count * length))
        elif stride > length > 0:
            groups.setdefault((count, stride), []).append((start, length))
        else:
            rest.append((start, count, stride, length))
    for (count, stride), pieces in groups.items():
        pieces.sort()
        joined = [list(pieces[0])]
        for start, length in pieces[1:]:
            last = joined[-1]
            if start == last[0] + last[1] and last[1] + length <= stride:
                last[1] += length
            else:
                joined.append([start, length])
        for start, length in joined:
            if length == stride:
                intervals.append((start, start + count * stride))
            else:
                rest.append((start, count, stride, length))
    return intervals, rest


def _merged(runs: list[Runs]) -> list[tuple[int, int]] | None:
    """The runs merged into maximal ``(start, end)`` intervals, or None when two of them overlap."""
    intervals, rest = _collapsed(runs)
    if rest:
        described = np.array(rest, dtype=np.int64).reshape(-1, 4)
        firsts, counts, strides, lengths = described.T
        index = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        starts = np.repeat(firsts, counts) + index * np.repeat(strides, counts)
        intervals.extend(zip(starts.tolist(), (starts + np.repeat(lengths, counts)).tolist(), strict=True))
    merged: list[tuple[int, int]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start < merged[-1][1]:
            return None
        if merged and start == merged[-1][1]:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged
