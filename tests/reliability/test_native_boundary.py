"""No C++ exception crosses the provider library's boundary: every ABI entry point returns it as an ORT status.

An exception unwinding into ONNX Runtime's C callers (or ctypes) is undefined behaviour, in practice
``std::terminate`` and SIGABRT. The library's entry points catch everything (native/src/boundary.h); its fault
injection (``NDP_EP_INJECT_FAULT=<entry>:<kind>``, read once when ONNX Runtime loads the library, so each case is a
fresh process) throws at one entry point: a ``std::bad_alloc`` (an allocation failing), a ``std::runtime_error``,
or a value that is no ``std::exception`` at all. Each must reach Python as an exception naming the entry, with the
process alive to print it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "sample_models" / "moe_decoder.onnx"

CHILD = r"""
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import ndp_ep
try:
    session = ndp_ep.InferenceSession(sys.argv[2], sess_options=None)
    feeds = dict(np.load(sys.argv[3]))
    session.run(None, feeds)
    session.last_report
    session.run(None, feeds)  # a second run: its start, and the first run's routing read
    session.last_report
except Exception as exc:
    print("raised", type(exc).__name__, str(exc))
else:
    print("no error")
"""

# (entry point, what it throws): every entry point the model's life goes through, every kind at least once
CASES = [
    ("create_factories", "bad_alloc"),
    ("create_ep", "other"),
    ("get_capability", "error"),
    ("compile", "bad_alloc"),
    ("infer_shape", "other"),
    ("run_start", "error"),
    ("compute", "other"),
    ("compute_task", "bad_alloc"),
    ("routing_take", "error"),
]


def _run_child(fault: str) -> subprocess.CompletedProcess:
    env = {**__import__("os").environ, "NDP_EP_INJECT_FAULT": fault, "OMP_NUM_THREADS": "1"}
    feeds = ROOT / "sample_models" / "moe_decoder.inputs.npz"
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), str(MODEL), str(feeds)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(("entry", "kind"), CASES, ids=[f"{e}-{k}" for e, k in CASES])
def test_an_exception_inside_the_library_reaches_python_as_an_exception(entry, kind):
    done = _run_child(f"{entry}:{kind}")
    assert done.returncode == 0, f"the process died ({done.returncode}): {done.stderr[-2000:]}"
    assert "terminate called" not in done.stderr
    out = done.stdout.strip()
    assert out.startswith("raised "), out
    if entry == "create_factories":  # no factory: the library cannot be registered, said so
        assert "create_factories" in out and "out of memory" in out
    elif entry in ("get_capability", "infer_shape"):  # ONNX Runtime takes their failure as "no claim" / "no
        assert "ShardedMoEExperts" in out  # type" and fails the session on the node it then cannot place or type
    elif entry.startswith("routing_"):  # ctypes calls: the library's failure code, turned into an NdpEpError
        assert out.startswith("raised NdpEpError") and "failed while reading the routing" in out
    elif entry != "compute_task":  # the status carries the entry point and what was thrown
        expected = {"bad_alloc": "out of memory", "other": "an unknown C++ exception", "error": "injected fault"}
        assert f"ndp-ep: {entry}: {expected[kind]}" in out, out


def test_without_a_fault_the_same_child_runs_clean():
    # the harness itself: the child gets through both runs and both reports when nothing is injected
    done = _run_child("")
    assert done.returncode == 0 and done.stdout.strip() == "no error", done.stdout + done.stderr[-2000:]


@pytest.mark.parametrize("capacity", ["99999999999999999999999", "-1", "0", "1e9", "12abc", " 7", "\u00b2", "9" * 4000])
def test_hostile_option_values_the_library_parses_are_refused_or_taken_never_a_crash(capacity):
    import onnxruntime as ort

    import ndp_ep

    options = ort.SessionOptions()
    options.log_severity_level = 3
    ndp_ep.session_options(options)
    options.add_session_config_entry("ep.ndpexecutionprovider.routing_capacity", capacity)
    try:
        ort.InferenceSession(str(MODEL), options)
    except Exception as exc:  # ONNX Runtime's error types: the library's message inside
        assert "routing_capacity must be a positive integer" in str(exc) or "config" in str(exc).lower(), exc
