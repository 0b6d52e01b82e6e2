"""Writing matplotlib figures: one helper, so every plot is written atomically and its figure always closed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ndp_io import atomic_write


def save_png(fig: Any, path: str | Path, **savefig_options: Any) -> Path:
    """Write ``fig`` to ``path`` as PNG through :func:`ndp_io.atomic_write` and close it; returns the path."""
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        with atomic_write(path) as handle:
            fig.savefig(handle, format="png", **savefig_options)
    finally:
        plt.close(fig)
    return path
