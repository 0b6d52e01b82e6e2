"""``ndp-ep validate``'s consistency filter is O(n log n), not O(n^2) (issue 32, kind 5: 20k rows took 86 s).

The filter must flag exactly the rows the pairwise definition flags (a brute-force reference here, written from
the module docstring), on seeded rows with many ties in size and shards; and the work it does — row attribute
reads — must grow like n log n: it read 2 n^2 before.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hw_model.validate import INCONSISTENCY_MARGIN, MeasuredRow, find_inconsistent


def _rows(count: int, seed: int, groups: int = 3) -> list[MeasuredRow]:
    rng = np.random.default_rng(seed)
    rows = []
    for line in range(count):
        median = float(rng.uniform(1e-6, 1e-4))
        spread = float(rng.uniform(0, 0.5))
        rows.append(
            MeasuredRow(
                kind="shard_graph",
                label=str(line),
                group=("shard_graph", int(rng.integers(groups))),
                size=float(rng.integers(1, 9)),  # ties in size and in shards
                shards=int(rng.choice([1, 2, 4, 8])),
                median_s=median,
                p10_s=median * (1 - spread / 2),
                p90_s=median * (1 + spread),
                line=line + 2,
            )
        )
    return rows


def _brute_force(rows: list[MeasuredRow]) -> set[int]:
    flagged = set()
    for i, row in enumerate(rows):
        for other in rows:
            more = other.size >= row.size and other.shards <= row.shards
            strictly = other.size > row.size or other.shards < row.shards
            if other.group == row.group and more and strictly and other.p90_s * (1 + INCONSISTENCY_MARGIN) < row.p10_s:
                flagged.add(i)
                break
    return flagged


@pytest.mark.parametrize("seed", range(6))
def test_the_filter_flags_what_the_pairwise_definition_flags(seed):
    rows = _rows(300, seed)
    expected = _brute_force(rows)
    assert 0 < len(expected) < len(rows)  # the case exercises both answers
    assert find_inconsistent(rows) == expected


class _Counted:
    """A row whose attribute reads are counted (the filter's work)."""

    reads = 0

    def __init__(self, row: MeasuredRow) -> None:
        object.__setattr__(self, "_row", row)

    def __getattr__(self, name: str):
        _Counted.reads += 1
        return getattr(object.__getattribute__(self, "_row"), name)


def _reads(count: int) -> int:
    rows = [_Counted(r) for r in _rows(count, seed=1, groups=1)]
    _Counted.reads = 0
    find_inconsistent(rows)  # type: ignore[arg-type]
    return _Counted.reads


def test_the_filter_does_n_log_n_work():
    small, large = _reads(1000), _reads(8000)
    # 8x the rows: n log n grows ~10x, n^2 64x
    assert large < 14 * small, (small, large)
    assert large < 60 * 8000 * math.log2(8000)
