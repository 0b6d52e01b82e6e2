"""What a run leaves for its report: values kept per run tag until the report takes them (the slots capture's and
pre-gating's)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

MAX_PENDING_RUNS = 4096


class PendingRuns:
    """Values kept per run tag until the run's report takes them, at most :data:`MAX_PENDING_RUNS` (the oldest are
    dropped, and counted); thread-safe: runs put, reports take."""

    def __init__(self) -> None:
        self._runs: OrderedDict[int, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.dropped = 0

    def put(self, tag: int, value: Any) -> None:
        with self._lock:
            self._runs[tag] = value
            while len(self._runs) > MAX_PENDING_RUNS:
                self._runs.popitem(last=False)
                self.dropped += 1

    def take(self, tag: int) -> Any:
        """The value of the run tagged ``tag`` (removed), or None."""
        with self._lock:
            return self._runs.pop(tag, None)
