"""SIGTERM and SIGHUP during ``generate`` / ``demo`` remove their scratch folders, as SIGINT does (issue 32, kind 6).

Each command runs in a child process whose slow step (the conversion) is made to wait, so the signal surely lands
while the scratch folder (which holds the converted model, its full size) exists; the child's TMPDIR is a fresh
folder, which must be empty once the child has died of the signal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GENAI = REPO / "sample_models" / "genai" / "gpt_oss_int4"

# the child: the conversion step blocks (after the scratch folder exists) until the signal arrives
CHILD = """
import sys, time
import {module} as target
def wait(*args, **kwargs):
    print("waiting", flush=True)
    time.sleep(120)
setattr(target, {name!r}, wait)
from ndp_ep.cli import program
sys.argv = ["ndp-ep", *sys.argv[1:]]
program()
"""


def _scratch_folders(tmp: Path, command: str) -> list[Path]:
    return [p for p in tmp.iterdir() if p.name.startswith(f"ndp-ep-{command}-")]


COMMANDS = {
    "demo": ("ndp_ep.convert", "convert_model", ["demo"]),
    "generate": (
        "ndp_ep.commands.generate",
        "_convert_folder",
        ["generate", str(GENAI), "--prompt-tokens", "4", "--new-tokens", "2"],
    ),
}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_signal_removes_the_scratch_folder(tmp_path, command, signum):
    if command == "generate":
        pytest.importorskip("onnxruntime_genai")
    module, name, argv = COMMANDS[command]
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(module=module, name=name), *argv],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "waiting", child.stderr.read()
        assert len(_scratch_folders(scratch, command)) == 1
        child.send_signal(signum)
        code = child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert code in (-signum, 130), child.stderr.read()  # died of it (SIGINT: exit 130 from the CLI)
    assert _scratch_folders(scratch, command) == []
