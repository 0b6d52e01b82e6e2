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

import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class SourceRange:
    """One expert tensor of a block in its data file: ``[offset, offset + length)`` of ``path``, ``experts`` windows
    of equal size."""

    path: Path
    offset: int
    length: int
    experts: int

    def __post_init__(self) -> None:
        if self.offset < 0 or self.length < 0 or self.experts < 1 or self.length % self.experts:
            raise ValueError(f"inconsistent source range {self}")

    def window(self, expert: int) -> tuple[int, int]:
        per = self.length // self.experts
        return self.offset + expert * per, self.offset + (expert + 1) * per


def _mapped_base(view: np.ndarray) -> np.memmap | None:
    base = view.base
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    return base if base is not None and base.filename is not None else None


def byte_intervals(view: np.ndarray) -> tuple[Path, np.ndarray, np.ndarray] | None:
    """The file and the ``(starts, lengths)`` of the byte runs ``view`` covers in it, or None when ``view`` is not a
    view of a memory-mapped file (a copy, a synthesized array)."""
    base = _mapped_base(view)
    if base is None or not view.nbytes:
        return None
    start = view.__array_interface__["data"][0] - base.__array_interface__["data"][0] + int(base.offset)
    item = view.dtype.itemsize
    shape, strides = list(view.shape), list(view.strides)
    run = item
    while shape and strides[-1] == run:  # trailing axes laid out contiguously: one run
        run *= shape.pop()
        strides.pop()
    starts = np.array([start], dtype=np.int64)
    for extent, stride in zip(shape, strides, strict=True):
        starts = (starts[:, None] + np.arange(extent, dtype=np.int64) * stride).reshape(-1)
    return Path(base.filename), starts, np.full(starts.shape, run, dtype=np.int64)


class ShardAudit:
    """Records the byte runs of one block's shards (:meth:`record`, once per shard tensor) and judges them
    (:meth:`holds`). Safe to record from several threads."""

    def __init__(self, block: str, sources: dict[str, SourceRange], tensors: int) -> None:
        self.block = block
        self.sources = sources
        self.tensors = tensors  # how many shard tensors the block has: each must be recorded
        self._runs: dict[str, list[tuple[Path, np.ndarray, np.ndarray]]] = {}
        self._failure = ""
        self._lock = threading.Lock()

    def record(self, tensor: str, expert: int, parts) -> None:
        """``parts`` (an array or a tuple of arrays) produced for shard tensor ``tensor`` of ``expert``; a tensor
        produced again (written twice) is recorded once."""
        parts = (parts,) if isinstance(parts, np.ndarray) else tuple(parts)
        runs = []
        for part in parts:
            found = byte_intervals(part)
            if found is None:
                continue
            path, starts, lengths = found
            if not any(self._inside(source, expert, path, starts, lengths) for source in self.sources.values()):
                self._fail(f"{tensor}: bytes outside expert {expert}'s windows of {self.block}'s own weights")
                return
            runs.append(found)
        with self._lock:
            self._runs.setdefault(tensor, runs)

    @staticmethod
    def _inside(source: SourceRange, expert: int, path: Path, starts: np.ndarray, lengths: np.ndarray) -> bool:
        if Path(path) != source.path:
            return False
        low, high = source.window(expert)
        return bool(starts.min() >= low and (starts + lengths).max() <= high)

    def _fail(self, reason: str) -> None:
        with self._lock:
            self._failure = self._failure or reason

    def holds(self) -> str:
        """ "" when every shard was recorded and their views tile every source exactly; else why not."""
        if self._failure:
            return self._failure
        if len(self._runs) != self.tensors:
            return f"{self.tensors - len(self._runs)} of {self.tensors} shard tensors of {self.block} never produced"
        by_file: dict[Path, list[tuple[np.ndarray, np.ndarray]]] = {}
        for runs in self._runs.values():
            for path, starts, lengths in runs:
                by_file.setdefault(path, []).append((starts, lengths))
        expected: dict[Path, list[tuple[int, int]]] = {}
        for source in self.sources.values():
            expected.setdefault(source.path, []).append((source.offset, source.length))
        for path, ranges in expected.items():  # (a recorded run lies inside a source: see record)
            pieces = by_file.get(path, [])
            starts = np.concatenate([p[0] for p in pieces]) if pieces else np.zeros(0, np.int64)
            lengths = np.concatenate([p[1] for p in pieces]) if pieces else np.zeros(0, np.int64)
            if _merged(starts, lengths) != _merged(*map(np.array, zip(*ranges, strict=True))):
                return f"{self.block}: its shards do not tile its weights in {path.name} byte for byte"
        return ""


def _merged(starts: np.ndarray, lengths: np.ndarray) -> list[tuple[int, int]] | None:
    """The runs merged into maximal ``(start, end)`` intervals, or None when two of them overlap."""
    starts, lengths = np.asarray(starts, np.int64), np.asarray(lengths, np.int64)
    keep = lengths > 0
    starts, lengths = starts[keep], lengths[keep]
    if not starts.size:
        return []
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], starts[order] + lengths[order]
    if np.any(ends[:-1] > starts[1:]):
        return None
    breaks = np.flatnonzero(ends[:-1] != starts[1:])
    firsts = np.concatenate([[0], breaks + 1])
    lasts = np.concatenate([breaks, [starts.size - 1]])
    return list(zip(starts[firsts].tolist(), ends[lasts].tolist(), strict=True))
