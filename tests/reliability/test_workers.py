"""Worker processes are bounded and never outlive the command (issue 32, kind 3: ``--jobs N`` forked N workers
at once, with no upper bound, and they stayed behind when the parent was killed).

* ``--jobs`` above :data:`ndp_io.limits.MAX_WORKERS_HARD` is one line naming the limit, before anything runs;
* a pool never starts more workers than it has tasks (work done: the pool sizes asked for are recorded);
* a parent killed with SIGKILL or SIGTERM while its workers run leaves none of them alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ndp_ep.cli import main
from ndp_io.limits import MAX_WORKERS_HARD
from ndp_io.workers import worker_count

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", ["bench", "sweep"])
def test_jobs_beyond_the_hard_cap_are_refused_naming_it(capsys, command):
    argv = ["bench", "--quick"] if command == "bench" else ["sweep", str(REPO / "docs" / "sweep_example.toml")]
    assert main([*argv, "--jobs", str(MAX_WORKERS_HARD + 1)]) == 2
    err = capsys.readouterr().err
    assert "MAX_WORKERS_HARD" in err and len(err.strip().splitlines()) == 1


def test_worker_count_is_bounded_by_tasks_cpus_and_the_cap():
    assert worker_count(64, tasks=3) == 3
    assert worker_count(8, tasks=100) == 8  # asked explicitly: honoured up to the cap
    assert worker_count(8, tasks=100, explicit=False) <= os.cpu_count()
    with pytest.raises(ValueError, match="MAX_WORKERS_HARD"):
        worker_count(MAX_WORKERS_HARD + 1, tasks=10**6)


def test_a_bench_pool_is_never_larger_than_its_jobs(monkeypatch):
    import hw_model.bench as bench

    sizes: list[int] = []
    real = bench.ProcessPoolExecutor

    def recording(max_workers=None, **kwargs):
        sizes.append(max_workers)
        return real(max_workers=max_workers, **kwargs)

    monkeypatch.setattr(bench, "ProcessPoolExecutor", recording)
    config = bench.quick_config(bench.BenchConfig(models=("olmoe-1b-7b",), ndp_units=(4,)))
    jobs = len(bench.plan_jobs(config))
    bench.run_bench(config, jobs_in_parallel=200)
    assert sizes == [min(200, jobs)]


CHILDREN = {
    "bench": """
import os, sys, time
import hw_model.bench as bench

def sleeping(job_and_config):
    os.write(1, f"{os.getpid()}\\n".encode())  # one write: two workers never interleave
    time.sleep(120)

bench._worker = sleeping
config = bench.quick_config(bench.BenchConfig(models=("olmoe-1b-7b",), ndp_units=(4,)))
bench.run_bench(config, jobs_in_parallel=2)
""",
    "sweep": """
import os, sys, time
import hw_model.sweep as sweep
import hw_model.sweep.execution as execution

def sleeping(points):
    os.write(1, f"{os.getpid()}\\n".encode())
    time.sleep(120)

execution._run_chunk = sleeping
grid = sweep.grid_from_dict({"models": ["olmoe-1b-7b"], "policies": ["monde", "tp+lb+prefetch"]})
sweep.run_sweep(grid, jobs=2)
""",
}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=lambda s: s.name)
@pytest.mark.parametrize("command", sorted(CHILDREN))
def test_killing_the_parent_leaves_no_worker_behind(command, signum, tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILDREN[command]],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        workers = {int(child.stdout.readline()), int(child.stdout.readline())}
        assert all(_alive(pid) for pid in workers)
        child.send_signal(signum)
        child.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [pid for pid in workers if _alive(pid)]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    for pid in left:  # clean up before failing
        os.kill(pid, signal.SIGKILL)
    assert left == []
    if signum != signal.SIGKILL:  # a signal it can handle: its scratch folders (the sweep's spool) go with it
        assert list(tmp_path.iterdir()) == []


def test_a_sweep_pool_is_never_larger_than_its_chunks(tmp_path, monkeypatch):
    import hw_model.sweep.guard as guard
    from hw_model.sweep import grid_from_dict, run_sweep

    sizes: list[int] = []
    real = guard.ProcessPoolExecutor

    def recording(max_workers=None, **kwargs):
        sizes.append(max_workers)
        return real(max_workers=max_workers, **kwargs)

    monkeypatch.setattr(guard, "ProcessPoolExecutor", recording)
    grid = grid_from_dict(
        {"models": ["olmoe-1b-7b"], "policies": ["monde", "tp+lb+prefetch"], "prompt_tokens": 8, "generated_tokens": 2}
    )
    result = run_sweep(grid, jobs=200)
    assert len(result.records) == 2 and sizes == [2]  # two points: two workers, not 200
