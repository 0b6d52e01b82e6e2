"""Heat maps of routing (``ndp-ep trace-stats --plot``): needs matplotlib (the ``plot`` extra); ImportError without.

A captured trace: one panel per MoE layer (at most :data:`MAX_PANELS`, evenly picked), experts down, steps across,
each cell the share of that step's token slots routed to the expert. A count-only file: one row per layer path,
experts across (ranked by selections within the row), each cell the expert's share of the row's selections.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from hw_model.figures import save_png
from hw_model.routing_trace import CapturedTrace

MAX_PANELS = 12


def plot_trace(trace: CapturedTrace, path: str | Path) -> Path:
    """A heat map of every step's selections per layer (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    header, steps = trace.header, trace.steps
    num_layers = len(header.layers)
    picked = np.unique(np.linspace(0, num_layers - 1, min(num_layers, MAX_PANELS)).round().astype(int)).tolist()
    fig, axes = plt.subplots(len(picked), 1, figsize=(10, 1.2 + 1.6 * len(picked)), squeeze=False)
    offsets = steps.cell_offsets
    for row, layer_index in enumerate(picked):
        layer = header.layers[layer_index]
        image = np.zeros((layer.num_experts, steps.num_steps))
        for step in range(steps.num_steps):
            tokens = int(steps.layer_tokens[step, layer_index])
            if tokens <= 0:
                continue
            cell = step * num_layers + layer_index
            lo, hi = int(offsets[cell]), int(offsets[cell + 1])
            image[steps.experts[lo:hi], step] = steps.counts[lo:hi] / (tokens * layer.top_k)
        axis = axes[row][0]
        shown = axis.imshow(image, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0.0)
        axis.set_ylabel(f"{layer.name}\nexpert", fontsize=7)
        fig.colorbar(shown, ax=axis, fraction=0.02, pad=0.01)
    axes[-1][0].set_xlabel("step (0: prefill)")
    fig.suptitle(f"expert selections: share of each step's token slots ({header.source or 'routing trace'})")
    return save_png(fig, path, dpi=110, bbox_inches="tight")


def plot_counts(layers: Mapping[str, np.ndarray], path: str | Path) -> Path:
    """A heat map of count-only layers (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(layers)
    width = max(counts.size for counts in layers.values())
    image = np.full((len(names), width), np.nan)
    for row, name in enumerate(names):
        counts = np.sort(np.asarray(layers[name], dtype=np.float64))[::-1]
        image[row, : counts.size] = counts / max(counts.sum(), 1.0)
    fig, axis = plt.subplots(figsize=(10, 1.0 + 0.25 * len(names)))
    shown = axis.imshow(image, aspect="auto", interpolation="nearest", cmap="viridis")
    axis.set_yticks(range(len(names)), names, fontsize=6)
    axis.set_xlabel("expert, ranked by selections")
    fig.colorbar(shown, ax=axis, label="share of the layer's selections")
    return save_png(fig, path, dpi=110, bbox_inches="tight")
