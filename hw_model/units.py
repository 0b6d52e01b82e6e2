"""Byte counts as people read them, for the messages of every package (standard library only, so ``hw_model``'s
compiled modules and ``ndp_ep``'s text can both import it)."""

from __future__ import annotations

import math


def human_bytes(count: float) -> str:
    """A byte count in the largest binary unit (B to TiB) that keeps it at least 1, to one decimal (bytes whole):
    ``human_bytes(98304) == "96.0 KiB"``."""
    value = abs(float(count))
    unit = "B"
    for larger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024.0:
            break
        value /= 1024.0
        unit = larger
    text = f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
    return "-" + text if count < 0 else text


def finite_number(value: object) -> float | None:
    """``value`` as a float when it is a real number (an int or float, not a bool) that is finite as a float;
    None otherwise, an integer beyond float range included (``math.isfinite`` raises OverflowError on one, which
    reached users as a traceback from a 400-digit TOML integer): the one test of every number read from a file."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
