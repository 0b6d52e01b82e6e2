"""How much memory an allocation may take: the bound every size read from a file or a flag is checked against."""

from __future__ import annotations

import os

FALLBACK_AVAILABLE_BYTES = 4 << 30


def available_memory_bytes() -> int:
    """Memory the system can give this process now (``MemAvailable`` on Linux; physical free pages elsewhere)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return FALLBACK_AVAILABLE_BYTES
