"""Gantt figures: one time axis per phase column, same resources per panel, a legend, a total per panel."""

from __future__ import annotations

import pytest

from hw_model.errors import WorkloadError
from hw_model.gantt import gantt_figure, panel_total_s, write_gantt

PANELS = {
    "slow": {
        "prefill": [("gpu", 0.0, 0.004, "e0"), ("ndp0", 0.001, 0.006, "e1"), ("pcie", 0.0, 0.002, "prefetch")],
        "decode": [("ndp1", 0.0, 300e-6, "e1"), ("gpu", 300e-6, 350e-6, "combine")],
    },
    "fast": {
        "prefill": [("gpu", 0.0, 0.002, "e0"), ("ndp_link", 0.002, 0.0025, "reduce partial sums")],
        "decode": [("gpu", 0.0, 100e-6, "e0"), ("pcie_d2h", 0.0, 10e-6, "hidden states to NDP")],
    },
}


@pytest.fixture
def figure():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    fig = gantt_figure(PANELS, "title", rows=["fast", "slow"])
    yield fig
    plt.close(fig)


def test_panels_of_one_phase_share_one_time_axis_scaled_to_the_longest(figure):
    axes = figure.axes
    (fast_prefill, fast_decode), (slow_prefill, slow_decode) = axes[0:2], axes[2:4]
    # prefill: longest total 6 ms, shown in ms; decode: longest 350 µs, shown in µs (x 1.02 margin)
    assert fast_prefill.get_xlim() == slow_prefill.get_xlim() == pytest.approx((0, 6 * 1.02))
    assert fast_decode.get_xlim() == slow_decode.get_xlim() == pytest.approx((0, 350 * 1.02))
    assert slow_prefill.get_xlabel() == "time in the layer, ms"
    assert slow_decode.get_xlabel() == "time in the layer, µs"


def test_every_panel_of_a_column_lists_the_same_resources_and_states_its_total(figure):
    fast_prefill, fast_decode, slow_prefill, slow_decode = figure.axes
    labels = [t.get_text() for t in fast_prefill.get_yticklabels()]
    assert labels == [t.get_text() for t in slow_prefill.get_yticklabels()]
    assert labels == ["gpu", "pcie h2d", "ndp unit 0", "dimm-link"]
    assert [t.get_text() for t in slow_decode.get_yticklabels()] == ["gpu", "pcie d2h", "ndp unit 1"]
    assert fast_prefill.get_title() == "fast: prefill, total 2.5 ms"
    assert slow_prefill.get_title() == "slow: prefill, total 6 ms"
    assert fast_decode.get_title() == "fast: decode, total 100 µs"
    assert slow_decode.get_title() == "slow: decode, total 350 µs"


def test_the_legend_names_each_resource_kind_drawn(figure):
    (legend,) = figure.legends
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts == [
        "GPU compute",
        "PCIe host→GPU (weights, NDP outputs)",
        "PCIe GPU→host (hidden states)",
        "NDP unit",
        "DIMM-link (partial-sum reduction)",
        "PCIe prefetch",
    ]


def test_panel_total_is_the_last_event_end():
    assert panel_total_s(PANELS["slow"]["prefill"]) == 0.006
    assert panel_total_s([]) == 0.0


def test_write_gantt_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = write_gantt(tmp_path / "g.png", PANELS)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_rows_is_a_typed_error():
    pytest.importorskip("matplotlib")
    with pytest.raises(WorkloadError):
        gantt_figure(PANELS, rows=["absent"])
