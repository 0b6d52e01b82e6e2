"""A sweep's records streamed: speedups per group of neighbouring points (:func:`with_speedups`) and a table spooled
to a temporary file (:class:`RecordTable`), so that memory does not grow with the number of points.

Records arrive in point order. The points of one configuration that differ only in policy are neighbours
(:func:`hw_model.sweep.grid.iter_points`), so each record's speedup against the baseline policy is known once its
group is complete. The table's columns are the union of every record's keys (first-seen order, the measured wall
time last, as :func:`hw_model.sweep.pareto.rectangular`), known only at the end; each record is therefore written
to the spool as it comes (one JSON line) and read back, completed with None, whenever the table is iterated.
"""

from __future__ import annotations

import itertools
import json
import weakref
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hw_model.sweep.grid import WALL_KEY, SweepGridError
from hw_model.sweep.pareto import _coordinate_keys, add_speedups
from ndp_io import remove_scratch_directory, scratch_directory


def with_speedups(records: Iterable[dict[str, Any]], baseline: str | None) -> Iterator[dict[str, Any]]:
    """``records`` (in point order) with ``speedup_vs_baseline`` set, as :func:`add_speedups` on all of them, one
    group of records that differ only in policy held at a time."""
    group: list[dict[str, Any]] = []
    group_key: tuple | None = None
    for record in records:
        key = tuple((k, record.get(k)) for k in sorted(_coordinate_keys(record)) if k != "policy")
        if group and key != group_key:
            add_speedups(group, baseline)
            yield from group
            group = []
        group_key = key
        group.append(record)
    add_speedups(group, baseline)
    yield from group


class RecordTable:
    """The records of a sweep in point order, held in a temporary file rather than in memory: :meth:`append` one
    at a time (each point's index must be the next one), then iterate as often as needed; each row has every
    column of the table (None where its record had none). ``len`` is the number of records. The file goes when
    the table does."""

    def __init__(self) -> None:
        # removed by close(), the finaliser, or a signal while run_sweep's remove_on_signal is active (ndp_io)
        self._dir = scratch_directory("ndp-sweep-records-")
        self._path = self._dir / "records.jsonl"
        self._writer: Any = open(self._path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close() or the finaliser
        self._finalizer = weakref.finalize(self, _discard, self._writer, self._dir)
        self._columns: dict[str, None] = {}
        self._count = 0

    def append(self, record: Mapping[str, Any]) -> None:
        if record.get("point") != self._count:
            got = record.get("point")
            raise SweepGridError(f"records must be in point order: expected point {self._count}, got {got}")
        self._writer.write(json.dumps(record) + "\n")
        for key in record:
            self._columns.setdefault(key, None)
        self._count += 1

    @property
    def columns(self) -> list[str]:
        """Every record's keys in first-seen order, the measured wall time last."""
        return [k for k in self._columns if k != WALL_KEY] + [k for k in self._columns if k == WALL_KEY]

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if not self._count:  # nothing appended, or closed
            return
        self._writer.flush()
        columns = self.columns
        with open(self._path, encoding="utf-8") as handle:
            for line in itertools.islice(handle, self._count):
                record = json.loads(line)
                yield {k: record.get(k) for k in columns}

    def close(self) -> None:
        """Delete the spool now (the table is empty afterwards)."""
        self._finalizer()
        self._count = 0


def _discard(writer: Any, directory: Path) -> None:
    writer.close()
    remove_scratch_directory(directory)
