"""Every resource limit of ndp-ep, in one place (docs/reliability.md, "Resource limits").

Each limit is checked before the work it bounds starts, and each error that enforces one names it
(``... (limit: MAX_GRID_POINTS = 100,000, ndp_io/limits.py)``, see :func:`limit_note`), so a user who needs
more knows what to change. ``ndp_io`` imports only the standard library, so every package reads these.
"""

from __future__ import annotations

import os

# parsing files ndp-ep reads (genai_config.json, hardware and grid TOML, trace JSON)
MAX_PARSE_DEPTH = 32  # nesting of objects/arrays/tables; real files nest at most 5 deep
MAX_CONFIG_FILE_BYTES = 64 << 20  # a TOML or JSON configuration file (a hardware file is a few KB)
MAX_NAME_CHARS = 256  # a hardware system's ``name`` and other names shown in reports and passed to the runtime
MAX_DESCRIPTION_CHARS = 4096  # a hardware system's ``description``
MAX_SESSION_KEY_CHARS = 256  # ``InferenceSession(session_key=...)``
MAX_CSV_FIELD_BYTES = 128 << 10  # one field of a validation CSV
MAX_CSV_INTEGER_DIGITS = 30  # an integer field of a validation CSV (sizes and counts)
MAX_KIND_NAME_CHARS = 64  # a kernel kind name in a validation CSV
MAX_PATH_BYTES = 4096  # a path given on the command line (Linux PATH_MAX)

# work a command starts
MAX_WORKERS_HARD = 256  # worker processes of ``sweep --jobs`` / ``bench --jobs``, whatever is asked
MAX_GRID_POINTS = 1_000_000  # points of a sweep grid (the product of its axis lengths), refused before expansion;
# points are streamed (memory does not grow with them), so what bounds a grid is disk and time: each point's record
# takes ~2.1 KB in the sweep's spool and ~2.2 KB in sweep.json (10^6 points: ~4.3 GB; 10^7 would be ~43 GB), and a
# point simulates in milliseconds to seconds (10^6 points: hours on a few workers)
MAX_FIGURE_POINTS = 100_000  # points of a sweep drawn in pareto.png (a dot per configuration, all in memory);
# a larger sweep writes its tables and fronts without the figure

# data read from files
MAX_TRACE_BYTES = 1 << 30  # a routing trace's arrays once inflated (``.npz`` members are checked before reading)

_NAMES = {
    value_name: value
    for value_name, value in globals().items()
    if value_name.startswith("MAX_") and isinstance(value, int)
}


def limit_note(name: str) -> str:
    """``"(limit: NAME = value, ndp_io/limits.py)"``: the suffix of every error that enforces a limit."""
    return f"(limit: {name} = {_NAMES[name]:,}, ndp_io/limits.py)"


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask where the platform has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
