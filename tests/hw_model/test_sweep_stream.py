"""A sweep streams its points (issue 32): the grid is expanded lazily, a bounded window of chunks is in flight, the
records go to a file and the Pareto fronts are kept incrementally, so memory does not grow with the points."""

from __future__ import annotations

import io
import itertools
import json
import random
import tracemalloc

import pytest

import hw_model.sweep.execution as execution
import hw_model.sweep.guard as guard
from hw_model.sweep import grid_from_dict, iter_points, pareto_fronts, run_sweep
from hw_model.sweep.output import write_json_rows
from hw_model.sweep.pareto import FrontBuilder
from hw_model.sweep.stream import RecordTable

TINY = {"prompt_tokens": 8, "generated_tokens": 4}


def _stub_point(point):
    """A record of ~40 columns without simulating (latency from the point's coordinates: deterministic)."""
    record = point.params()
    record.update({f"metric_{i}": point.index * 1e-3 + i for i in range(28)})
    record["latency_s"] = 1.0 + ((point.index * 7919) % 13) * 0.1 / point.ndp_units
    record["feasible"] = True
    record["sim_wall_s"] = 0.0
    return record


def _grid(seeds: int, units: int = 64):
    """``2 x units x seeds`` points: two policies, NDP counts 1..units, ``seeds`` seeds."""
    return grid_from_dict(
        {"models": ["olmoe-1b-7b"], "ndp_units": list(range(1, units + 1)), "policies": ["monde", "tp"],
         "seeds": list(range(seeds)), **TINY}
    )  # fmt: skip


def test_a_million_point_grid_yields_its_first_point_without_building_the_rest(monkeypatch):
    monkeypatch.setattr(guard, "MAX_GRID_POINTS", 10**6)
    grid = _grid(seeds=10**6 // 128)  # 2 x 64 x 7,812 = 999,936 points
    tracemalloc.start()
    points = iter_points(grid)
    first = next(points)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert first.index == 0 and (first.ndp_units, first.seed, first.policy) == (1, 0, "monde")
    assert peak < 1 << 20  # a list of the grid's points would take hundreds of MB
    assert [p.index for p in itertools.islice(points, 5)] == [1, 2, 3, 4, 5]


def _peak_of_sweep(seeds: int) -> int:
    tracemalloc.start()
    result = run_sweep(_grid(seeds), jobs=1)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(result.records) == 128 * seeds
    return peak


def test_a_sweeps_peak_memory_does_not_grow_with_its_points(monkeypatch):
    monkeypatch.setattr(execution, "run_point", _stub_point)
    small, large = _peak_of_sweep(seeds=4), _peak_of_sweep(seeds=32)  # 512 and 4,096 points
    # held in memory, 4,096 records of ~40 columns take ~12 MB (the sweep before it streamed: 1.2 MB at 512
    # points, 9.4 MB at 4,096); streamed, what grows is the open configurations' lists of their seeds' points
    assert large < small + (256 << 10), (small, large)


def _numbered(chunk):
    return [{"n": n} for n in chunk]


def test_the_pool_holds_at_most_a_window_of_chunks_in_flight():
    pulled = 0

    def chunks():
        nonlocal pulled
        for i in range(40):
            pulled += 1
            yield [i]

    received = 0
    for results in guard.run_chunks(chunks(), 40, 2, _numbered, RuntimeError):
        assert results == [{"n": received}]  # chunk order
        received += 1
        assert pulled <= received + guard.IN_FLIGHT_PER_WORKER * 2
    assert received == pulled == 40


def _random_records(rng: random.Random, grid):
    """Records of ``grid``'s points in grid order with random latencies (ties, failures, infeasible points)."""
    out = []
    for point in iter_points(grid):
        record = point.params()
        roll = rng.random()
        record["latency_s"] = None if roll < 0.1 else rng.choice([1.0, 1.5, 2.0, 2.5, rng.random() * 3])
        record["feasible"] = roll > 0.2
        record["energy_j"] = rng.choice([1.0, 2.0, rng.random()])
        out.append(record)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_incremental_fronts_equal_the_fronts_of_the_whole_table(seed):
    rng = random.Random(seed)
    grid = grid_from_dict(
        {"models": ["olmoe-1b-7b", "mixtral-8x7b"], "ndp_units": [1, 2, 4], "policies": ["monde", "tp"],
         "skew": ["high", 1.25], "seeds": [0, 1, 2], "residency_fractions": [0.5, 1.0],
         "hardware": {"gpu": {"memory_capacity_bytes": [8e9, 16e9]}}, **TINY}
    )  # fmt: skip
    records = _random_records(rng, grid)
    builder = FrontBuilder(grid.varied_axes)
    for record in records:
        builder.add(record)
    assert builder.fronts() == pareto_fronts(records, grid.varied_axes)


def test_streamed_json_rows_are_the_text_of_the_whole_list():
    rows = [{"a": 1, "b": [1, 2.5, None], "c": {"d": "x\ny"}}, {"a": float("nan"), "b": [], "c": {}}]
    for given in ([], rows[:1], rows):
        handle = io.StringIO()
        write_json_rows(handle, given)
        assert handle.getvalue() == json.dumps(given, indent=1) + "\n"


def test_a_record_table_reads_back_rectangular_rows_in_point_order():
    table = RecordTable()
    table.append({"point": 0, "sim_wall_s": 0.5, "a": 1})
    table.append({"point": 1, "b": "x"})
    expected = [
        {"point": 0, "a": 1, "b": None, "sim_wall_s": 0.5},
        {"point": 1, "a": None, "b": "x", "sim_wall_s": None},
    ]
    assert list(table) == expected and list(table) == expected and len(table) == 2
    with pytest.raises(ValueError, match="point order"):
        table.append({"point": 5})
    table.close()
    assert list(table) == []


def test_a_sweep_over_the_figure_limit_writes_its_tables_without_the_figure(tmp_path, monkeypatch, capsys):
    import hw_model.sweep.output as output

    monkeypatch.setattr(execution, "run_point", _stub_point)
    monkeypatch.setattr(output, "MAX_FIGURE_POINTS", 3)
    result = run_sweep(_grid(seeds=1, units=2), jobs=1)  # 4 points
    written = output.write_sweep(result, tmp_path)
    assert [p.name for p in written] == ["sweep.json", "pareto.json", "sweep.parquet"]
    assert not (tmp_path / "pareto.png").exists() and "MAX_FIGURE_POINTS" in capsys.readouterr().err
    assert [r["point"] for r in json.loads((tmp_path / "sweep.json").read_text())] == [0, 1, 2, 3]


def test_two_skews_shown_as_one_level_are_refused():
    from hw_model.sweep import SweepGridError

    with pytest.raises(SweepGridError, match="same level"):
        grid_from_dict({"models": ["olmoe-1b-7b"], "skew": [1.25, 1.2500001], **TINY})


def test_the_in_order_window_keeps_chunk_order_and_a_bounded_window():
    # chunks finish in reverse of their submission inside the window; results still come back in chunk order
    pulled, submitted, done = [0], [], []

    def chunks():
        for i in range(10):
            pulled[0] += 1
            yield [i]

    def submit(chunk):
        submitted.append(chunk[0])
        return chunk[0]

    def result(ticket):
        done.append(ticket)
        assert len(submitted) - len(done) <= 3 - 1  # at most the window of 3 in flight, this one taken off
        return [{"chunk": ticket}]

    out = [r[0]["chunk"] for r in guard.in_order(chunks(), 3, submit, result)]
    assert out == list(range(10)) and submitted == list(range(10)) and pulled[0] == 10
