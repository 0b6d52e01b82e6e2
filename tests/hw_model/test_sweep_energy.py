"""Energy as a Pareto axis of ``ndp-ep sweep``: configurations average their joules over seeds, and the
latency/energy front keeps exactly the configurations no other one beats on both."""

from __future__ import annotations

import pytest

from hw_model.sweep import pareto_fronts
from hw_model.sweep.pareto import configurations


def _record(point: int, policy: str, units: int, latency: float, energy: float | None, seed: int = 0) -> dict:
    return {
        "point": point,
        "model": "m",
        "trace": "synthetic",
        "skew_level": "typical",
        "hw": "paper",
        "ndp_units": units,
        "policy": policy,
        "residency_fraction": 0.75,
        "seed": seed,
        "feasible": True,
        "latency_s": latency,
        "energy_j": energy,
    }


def test_the_energy_front_keeps_the_undominated_configurations():
    records = [
        _record(0, "a", 4, 1.0, 10.0),
        _record(1, "b", 4, 2.0, 5.0),
        _record(2, "c", 4, 2.5, 6.0),  # slower and costlier than b: dominated
        _record(3, "d", 4, 0.9, 12.0, seed=0),
        _record(4, "d", 4, 1.1, 14.0, seed=1),  # d averages 1.0 s, 13 J: dominated by a
    ]
    fronts = pareto_fronts(records, ())
    (energy,) = [f for f in fronts if f["axis"] == "energy_j"]
    front = [(r["policy"], r["energy_j"], r["latency_s"]) for r in energy["front"]]
    assert front == [("b", 5.0, 2.0), ("a", 10.0, 1.0)]
    d = next(r for r in configurations(records) if r["policy"] == "d")
    assert d["energy_j"] == pytest.approx(13.0) and d["latency_s"] == pytest.approx(1.0)


def test_records_without_energy_add_no_energy_axis():
    records = [_record(0, "a", 2, 1.0, None), _record(1, "a", 4, 0.5, None)]
    assert [f["axis"] for f in pareto_fronts(records, ("ndp_units",))] == ["ndp_units"]
