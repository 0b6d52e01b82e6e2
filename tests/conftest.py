"""Shared fixtures: repository paths and running the CLI in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def _run_cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "ndp_ep", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


@pytest.fixture
def cli():
    """``cli("convert", ...)`` runs ``ndp-ep convert ...`` and returns the CompletedProcess."""
    return _run_cli


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture
def samples_dir() -> Path:
    return REPO_ROOT / "sample_models"


@pytest.fixture
def shared_dir() -> Path:
    path = REPO_ROOT.parent / "shared"
    if not path.is_dir():
        pytest.skip(f"../shared is not beside the repository ({path})")
    return path
