"""Gantt charts of simulated MoE-layer timelines, comparable across panels.

A figure is a grid of panels, one row per policy and one column per phase (``prefill``, ``decode``), each
showing the busy intervals of every resource (GPU, PCIe h2d, PCIe d2h, each NDP unit, DIMM-link). All panels
of one column share one time axis (same limits, same unit), so policies compare at a glance; prefill and
decode keep their own axes, as a decode step is ~100x shorter than a prefill layer. Every panel lists the same
resources in the same order, marks its layer's end with a dashed line and states its total in its title; one legend
names the resource colours (PCIe h2d spans labelled ``prefetch`` get their own hatch).

Events are plain ``(resource, start_s, end_s, label)`` tuples, as ``hw_model.timeline.TimelineEvent`` and
the bench's kept timelines are. Needs matplotlib (the ``plot`` extra); importing this module does not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hw_model.chrome_trace import resource_group, resource_sort_key
from hw_model.errors import WorkloadError
from hw_model.figures import save_png

Event = tuple[str, float, float, str]
PHASE_ORDER = ("prefill", "decode")
CATEGORY_STYLE: Mapping[str, tuple[str, str]] = {  # category -> (colour, legend label)
    "gpu": ("tab:green", "GPU compute"),
    "pcie_h2d": ("tab:orange", "PCIe host→GPU (weights, NDP outputs)"),
    "pcie_d2h": ("tab:red", "PCIe GPU→host (hidden states)"),
    "ndp": ("tab:blue", "NDP unit"),
    "ndp_link": ("tab:purple", "DIMM-link (partial-sum reduction)"),
    "other": ("tab:gray", "other"),
}
PREFETCH_LABEL = "prefetch"


def _time_unit(seconds: float) -> tuple[float, str]:
    """A scale and unit name that show ``seconds`` as a number between 1 and 1000 where possible."""
    if seconds >= 1.0:
        return 1.0, "s"
    if seconds >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def panel_total_s(events: Sequence[Event]) -> float:
    """A panel's total: the end of its last event (the layer ends when the GPU has combined every output)."""
    return max((end for _, _, end, _ in events), default=0.0)


def gantt_figure(
    panels: Mapping[str, Mapping[str, Sequence[Event]]],
    title: str = "",
    rows: Sequence[str] | None = None,
) -> Any:
    """A matplotlib Figure of ``panels`` = ``{row (policy): {phase: events}}``; ``rows`` picks and orders the
    rows (default: all, in the mapping's order). Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    row_names = [r for r in (rows if rows is not None else list(panels)) if r in panels]
    if not row_names:
        raise WorkloadError("gantt_figure needs at least one row of events")
    phases = [p for p in PHASE_ORDER if any(p in panels[r] for r in row_names)]
    phases += sorted({p for r in row_names for p in panels[r]} - set(phases))
    fig, axes = plt.subplots(
        len(row_names),
        len(phases),
        figsize=(7 * len(phases), 0.9 + 2.1 * len(row_names)),
        squeeze=False,
        sharex="col",
    )
    used: set[str] = set()
    prefetch_seen = False
    for col, phase in enumerate(phases):
        column = [list(panels[r].get(phase, ())) for r in row_names]
        resources = sorted({e[0] for events in column for e in events}, key=resource_sort_key)
        longest = max((panel_total_s(events) for events in column), default=0.0)
        scale, unit = _time_unit(longest)
        for row, (name, events) in enumerate(zip(row_names, column, strict=True)):
            ax = axes[row][col]
            for y, resource in enumerate(resources):
                category = resource_group(resource).category
                mine = [e for e in events if e[0] == resource]
                if not mine:
                    continue
                used.add(category)
                colour = CATEGORY_STYLE.get(category, CATEGORY_STYLE["other"])[0]
                plain = [(s * scale, (e - s) * scale) for _, s, e, label in mine if label != PREFETCH_LABEL]
                fetched = [(s * scale, (e - s) * scale) for _, s, e, label in mine if label == PREFETCH_LABEL]
                ax.broken_barh(plain, (y - 0.4, 0.8), color=colour)
                if fetched:
                    prefetch_seen = True
                    ax.broken_barh(fetched, (y - 0.4, 0.8), facecolor="white", edgecolor=colour, hatch="///")
            total = panel_total_s(events)
            ax.axvline(total * scale, color="black", lw=0.8, ls="--")
            ax.set_yticks(range(len(resources)))
            ax.set_yticklabels([resource_group(r).thread for r in resources], fontsize=7)
            ax.set_ylim(len(resources) - 0.5, -0.5)
            ax.set_xlim(0, longest * scale * 1.02 if longest > 0 else 1)
            ax.set_title(f"{name}: {phase}, total {total * scale:.3g} {unit}", fontsize=9)
            if row == len(row_names) - 1:
                ax.set_xlabel(f"time in the layer, {unit}")
    handles = [Patch(color=CATEGORY_STYLE[c][0], label=CATEGORY_STYLE[c][1]) for c in CATEGORY_STYLE if c in used]
    if prefetch_seen:
        handles.append(Patch(facecolor="white", edgecolor="tab:orange", hatch="///", label="PCIe prefetch"))
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.35 / fig.get_figheight(), 1, 1))
    fig.legend(handles=handles, loc="lower center", ncol=min(3, len(handles)), fontsize=8, frameon=False)
    return fig


def write_gantt(
    path: str | Path,
    panels: Mapping[str, Mapping[str, Sequence[Event]]],
    title: str = "",
    rows: Sequence[str] | None = None,
) -> Path:
    """Save :func:`gantt_figure` as a PNG, atomically; returns the path. Raises ImportError without matplotlib."""

    fig = gantt_figure(panels, title, rows)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_png(fig, path, dpi=110, bbox_inches="tight")


__all__ = ["CATEGORY_STYLE", "PHASE_ORDER", "gantt_figure", "panel_total_s", "write_gantt"]
