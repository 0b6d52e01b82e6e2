"""PNG plots of a bench run: latency bars, one MoE layer's Gantt timeline per model, utilisation, skew sweep.

Needs matplotlib (the ``plot`` extra); :func:`make_plots` raises ImportError without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hw_model.bench import GANTT_POLICIES, OURS_POLICY, main_table
from hw_model.figures import save_png
from hw_model.models import MODELS
from hw_model.policies import POLICIES


def make_plots(
    records: Sequence[dict[str, Any]], gantt: dict[str, dict], out_dir: Path, default_units: int
) -> list[Path]:
    """Write the PNG plots; raises ImportError when matplotlib (the ``plot`` extra) is missing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    rows = main_table(records)
    models = [m for m in MODELS if any(r["model"] == m for r in rows)]
    policies = [p for p in POLICIES if any(r["policy"] == p for r in rows)]
    colours = dict(zip(POLICIES, plt.get_cmap("tab20").colors, strict=False))

    def save(fig: Any, name: str) -> None:
        path = out_dir / name
        written.append(save_png(fig, path, dpi=110, bbox_inches="tight"))

    # 1. latency bars
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(4.2 * max(1, len(models)), 4), squeeze=False)
    for ax, model in zip(axes[0], models, strict=False):
        units_list = sorted({r["ndp_units"] for r in rows if r["model"] == model})
        width = 0.8 / max(1, len(policies))
        for i, policy in enumerate(policies):
            cells = [
                next((r for r in rows if r["model"] == model and r["ndp_units"] == u and r["policy"] == policy), None)
                for u in units_list
            ]
            # a configuration that does not fit the DIMMs has no bar (its latency would be a fiction)
            values = [c["latency_s"] if c is not None and c.get("feasible", True) else np.nan for c in cells]
            ax.bar(np.arange(len(units_list)) + i * width, values, width, label=policy, color=colours[policy])
        ax.set_xticks(np.arange(len(units_list)) + 0.4 - width / 2)
        ax.set_xticklabels(
            [
                f"{u} NDP"
                if any(r.get("feasible", True) for r in rows if r["model"] == model and r["ndp_units"] == u)
                else f"{u} NDP\n(does not fit)"
                for u in units_list
            ]
        )
        ax.set_yscale("log")
        ax.set_title(model)
        ax.set_ylabel("end-to-end latency, s (log)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=min(len(labels), 6), bbox_to_anchor=(0.5, -0.12))
    fig.suptitle("512 prompt + 512 generated tokens, batch 1", y=1.03)
    save(fig, "latency_bars.png")

    # 2. Gantt timelines of one MoE layer (prefill and a mid-stream decode step), one time axis per phase
    from hw_model.gantt import gantt_figure

    for model, per_policy in gantt.items():
        title = f"{model}, {default_units} NDP units: one MoE layer's timeline"
        save(gantt_figure(per_policy, title, rows=[p for p in GANTT_POLICIES if p in per_policy]), f"gantt_{model}.png")

    # 3. utilisation at the default NDP count
    util = [r for r in rows if r["ndp_units"] == default_units]
    if util:
        fig, axes = plt.subplots(1, max(1, len(models)), figsize=(4.2 * max(1, len(models)), 3.6), squeeze=False)
        for ax, model in zip(axes[0], models, strict=False):
            mine = sorted((r for r in util if r["model"] == model), key=lambda r: POLICIES.index(r["policy"]))
            x = np.arange(len(mine))
            for k, (key, colour) in enumerate((("gpu", "tab:green"), ("pcie", "tab:orange"), ("ndp_mean", "tab:blue"))):
                ax.bar(x + k * 0.27, [r["utilisation"][key] for r in mine], 0.27, label=key, color=colour)
            ax.set_xticks(x + 0.27)
            ax.set_xticklabels([r["policy"] for r in mine], rotation=60, ha="right", fontsize=7)
            ax.set_ylim(0, 1)
            ax.set_title(model)
        axes[0][0].set_ylabel(f"busy fraction ({default_units} NDP units)")
        axes[0][-1].legend(fontsize=7)
        save(fig, "utilisation.png")

    # 4. skew sweep
    skew = [r for r in records if r["section"] in ("main", "skew") and r["policy"] == OURS_POLICY]
    skew = [r for r in skew if r["ndp_units"] == default_units and r["speedup_vs_best_baseline"]]
    if len({r["skew_level"] for r in skew}) > 1:
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for model in models:
            mine = sorted((r for r in skew if r["model"] == model), key=lambda r: r["skew"])
            ax.plot([r["skew"] for r in mine], [r["speedup_vs_best_baseline"] for r in mine], marker="o", label=model)
        ax.set_xlabel("Zipf skew of expert popularity")
        ax.set_ylabel("speedup of tp+lb+prefetch over the strongest baseline")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.legend(fontsize=7)
        save(fig, "skew_sweep.png")
    return written
