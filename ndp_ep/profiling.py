"""The simulated GPU / NDP / PCIe spans in ONNX Runtime's own profile: one Perfetto file showing both.

ONNX Runtime's profiler (``SessionOptions.enable_profiling``) writes a JSON array of trace events when the session's
``end_profiling()`` is called, one ``model_run`` span (category ``Session``) per run with the run's measured CPU
nodes inside it. :func:`add_simulated_tracks` appends each reported run's simulated timeline
(:meth:`ndp_ep.report.RunReport.chrome_trace`: the MoE layers, GPU, PCIe, NDP and DIMM-link tracks) to that file,
each run's spans starting where ONNX Runtime's ``model_run`` of that run starts, under processes named
``simulated: ...`` (process ids from :data:`SIMULATED_PID_BASE`, apart from ONNX Runtime's), and rewrites the file
atomically. ``ndp_ep.InferenceSession.end_profiling()`` does it itself; for a plain ONNX Runtime session created
with :func:`ndp_ep.session_options`, call ``add_simulated_tracks(sess.end_profiling(), sess)``.

The simulated spans are on the simulated hardware's time scale, not the CPU's: a run's simulated timeline may be
shorter or longer than its measured ``model_run`` span. Runs are paired with ``model_run`` spans newest first (the
session keeps its newest ``report_ring`` reports).

ONNX Runtime 1.25 added profiling hooks for plugin providers (``OrtEp::CreateProfiler``, ``OrtEpProfilerImpl``,
``OrtEpApi::CreateProfilingEvent``): events the library would return at ``EndProfiling``. The library targets
ONNX Runtime's API 23 (one build for 1.23 and later), and the simulated spans are only known once Python builds the
reports, so the merge here is the route for every version; ``ndp-ep run --trace FILE`` writes the simulated
timeline alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SIMULATED_PID_BASE = 1 << 30
RUN_EVENT = "model_run"


def add_simulated_tracks(profile_path: str | Path, session_or_reports: Any) -> Path:
    """Append the simulated tracks of ``session_or_reports`` (a session with the provider, or a list of
    :class:`ndp_ep.report.RunReport`) to ONNX Runtime's profile at ``profile_path``; returns the path."""
    from ndp_ep.errors import NdpEpError
    from ndp_io import write_text

    path = Path(profile_path)
    reports = session_or_reports
    if not isinstance(reports, list | tuple):
        from ndp_ep.reporter import reporter_for

        reports = reporter_for(session_or_reports).reports
    try:
        events = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise NdpEpError(f"{path}: not an ONNX Runtime profile ({type(exc).__name__})") from None
    if not isinstance(events, list):
        raise NdpEpError(f"{path}: not an ONNX Runtime profile (not a JSON array of events)")
    runs = sorted(
        (e for e in events if isinstance(e, dict) and e.get("name") == RUN_EVENT and e.get("cat") == "Session"),
        key=lambda e: e.get("ts", 0),
    )
    pairs = list(zip(runs[::-1], list(reports)[::-1], strict=False))[::-1]
    events.extend(simulated_events(pairs))
    write_text(path, json.dumps(events))
    return path


def simulated_events(pairs: list[tuple[dict[str, Any], Any]]) -> list[dict[str, Any]]:
    """The trace events of each ``(model_run event, report)`` pair, shifted to the run's start."""
    out: list[dict[str, Any]] = []
    named: set[tuple[int, int, str]] = set()  # (pid, tid, metadata name) already written
    for run, report in pairs:
        start = float(run.get("ts", 0))
        for event in report.chrome_trace()["traceEvents"]:
            moved = dict(event)
            moved["pid"] = SIMULATED_PID_BASE + int(event.get("pid", 0))
            if event.get("ph") == "M":
                key = (moved["pid"], int(event.get("tid", 0)), str(event["name"]))
                if key in named:
                    continue
                named.add(key)
                if event["name"] == "process_name":
                    moved["args"] = {"name": f"simulated: {event['args']['name']}"}
                out.append(moved)
                continue
            if "ts" in moved:
                moved["ts"] = start + float(moved["ts"])
            moved.setdefault("args", {})
            moved["args"] = {**moved["args"], "simulated": True, "ort_run_ts": start}
            out.append(moved)
    return out
