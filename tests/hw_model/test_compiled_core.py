"""The installed ``hw_model``, whose hot modules ``pip install .`` compiles with mypyc, against this source tree.

The rest of the suite imports the source tree (pyproject's ``pythonpath``), so these tests are where the compiled
core is checked: they run it in child interpreters started with ``-I`` (site-packages only). They skip when the
installed package is not compiled (built with ``NDP_EP_COMPILE_HW_MODEL=OFF``) or was installed from sources
other than this tree (reinstall with ``pip install .``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hw_model", "graph_passes", "ndp_ep", "ndp_io")
WORKLOAD = Path(__file__).with_name("compiled_parity_workload.py")

_PROBE = """
import importlib.util, json, sys
spec = importlib.util.find_spec("hw_model")
if spec is None:
    print(json.dumps(None))
else:
    import hw_model
    print(json.dumps({"site": str(__import__("pathlib").Path(hw_model.__file__).parents[1]),
                      "compiled": list(hw_model.compiled_modules())}))
"""


def _installed(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -I ARGS``: the installed packages only (no current directory, script directory or PYTHONPATH)."""
    return subprocess.run(
        [sys.executable, "-I", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, check=False
    )


def _source(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python ARGS`` with this tree first on the path."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout, check=False
    )


def _differing_sources(site: Path) -> list[str]:
    """The ``.py`` files of this tree's packages that the installed copy lacks or holds differently."""
    differing = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            installed = site / path.relative_to(REPO_ROOT)
            if not installed.is_file() or installed.read_bytes() != path.read_bytes():
                differing.append(str(path.relative_to(REPO_ROOT)))
    return differing


@pytest.fixture(scope="module")
def compiled_install(tmp_path_factory) -> list[str]:
    """The installed hw_model's compiled modules, once checked to be built from this tree (else the test skips)."""
    probe = _installed("-c", _PROBE, cwd=tmp_path_factory.mktemp("probe"))
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    if found is None:
        pytest.skip("ndp-ep is not installed (pip install .)")
    if not found["compiled"]:
        pytest.skip("the installed hw_model is not compiled (built with NDP_EP_COMPILE_HW_MODEL=OFF)")
    differing = _differing_sources(Path(found["site"]))
    if differing:
        pytest.skip(f"the installed package was built from other sources ({differing[0]}, ...): pip install .")
    return found["compiled"]


def test_the_hot_modules_are_the_compiled_ones(compiled_install):
    assert {"simulator", "layout", "policies", "prefetch"} <= set(compiled_install)


def test_ndp_ep_version_names_the_compiled_core(compiled_install, tmp_path):
    done = _installed("-m", "ndp_ep", "--version", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1] == f"simulator core: compiled with mypyc ({', '.join(compiled_install)})"


def test_the_compiled_core_gives_the_source_trees_results_under_every_policy(compiled_install, tmp_path):
    compiled = _installed(str(WORKLOAD), cwd=tmp_path)
    source = _source(str(WORKLOAD), cwd=tmp_path)
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    assert source.returncode == 0, source.stderr[-3000:]
    compiled_results, source_results = json.loads(compiled.stdout), json.loads(source.stdout)
    assert compiled_results.pop("compiled") == compiled_install
    assert source_results.pop("compiled") == []
    for key, expected in source_results["runs"].items():  # one policy and workload at a time: a readable failure
        assert compiled_results["runs"][key] == expected, key
    assert compiled_results == source_results


def test_ndp_ep_run_reports_the_same_on_the_compiled_core(compiled_install, tmp_path):
    model = REPO_ROOT / "sample_models" / "moe_decoder.onnx"
    feeds = REPO_ROOT / "sample_models" / "moe_decoder.inputs.npz"
    reports = []
    for run in (_installed, _source):
        done = run("-m", "ndp_ep", "run", str(model), "--inputs", str(feeds), "--json", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        reports.append(json.loads(done.stdout))  # measured wall times are not in reports: they compare whole
    assert reports[0] == reports[1]


def test_the_hw_model_tests_pass_on_the_compiled_core(compiled_install, tmp_path):
    ini = tmp_path / "pytest.ini"  # pyproject's settings without its pythonpath (which puts the tree first)
    ini.write_text("[pytest]\naddopts = -q\n")
    done = _installed(
        "-m",
        "pytest",
        str(REPO_ROOT / "tests" / "hw_model"),
        "-c",
        str(ini),
        "--rootdir",
        str(REPO_ROOT),
        "--confcutdir",
        str(REPO_ROOT),
        "-p",
        "no:cacheprovider",
        "--ignore",
        __file__,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout
