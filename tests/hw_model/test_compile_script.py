"""native/compile_hw_model.py, the build step that compiles hw_model's hot modules with mypyc: what it does when it
cannot compile (the compile itself is checked on the installed package by test_compiled_core.py)."""

from __future__ import annotations

import importlib.util
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def script():
    """native/compile_hw_model.py (a build script, not a package module) loaded from its path."""
    spec = importlib.util.spec_from_file_location("ndp_compile_hw_model", ROOT / "native" / "compile_hw_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_compiled_list_names_existing_hw_model_modules(script):
    assert script.MODULES and all((ROOT / "hw_model" / f"{name}.py").is_file() for name in script.MODULES)
    assert script.PACKAGES and all((ROOT / "hw_model" / name / "__init__.py").is_file() for name in script.PACKAGES)


def test_a_package_is_compiled_whole_its_init_first(script):
    files = script.module_files(ROOT)
    policies = [path.relative_to(ROOT).as_posix() for path in files if path.parent.name == "policies"]
    assert policies[0] == "hw_model/policies/__init__.py"
    assert sorted(policies) == sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "hw_model/policies").glob("*.py"))
    assert "hw_model/policies/tp_lb_prefetch.py" in policies  # ours, as a file of its own


def test_without_pythons_headers_hw_model_installs_interpreted_with_a_warning(script, tmp_path, monkeypatch, capsys):
    paths = {**sysconfig.get_paths(), "include": str(tmp_path / "no-headers")}
    monkeypatch.setattr(script.sysconfig, "get_paths", lambda: paths)
    out = tmp_path / "out"
    assert script.main([str(ROOT), str(out), str(tmp_path / "work")]) == 0
    assert out.is_dir() and not any(out.iterdir())  # nothing compiled, nothing to install
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "python3-dev" in err[0] and "interpreted" in err[0]


def test_a_type_error_fails_the_build_naming_the_option_that_skips_the_compile(script, tmp_path, capsys):
    pytest.importorskip("mypyc")
    source = tmp_path / "source"
    (source / "hw_model").mkdir(parents=True)
    (source / "pyproject.toml").write_text("[project]\nname = 'x'\n")  # mypy reads its settings from there
    for name in script.MODULES:
        (source / "hw_model" / f"{name}.py").write_text("x: int = 'not an int'\n")
    assert script.main([str(source), str(tmp_path / "out"), str(tmp_path / "work")]) == 1
    err = capsys.readouterr()
    assert "Incompatible types in assignment" in err.out + err.err
    assert err.err.strip().splitlines()[-1] == script.FAILURE
    assert not list((tmp_path / "out").glob("**/*.so"))
    assert not (source / ".mypy_cache").exists()  # mypy's cache goes under the work directory


def test_compiled_modules_names_a_compiled_subpackage_once(tmp_path):
    from importlib.machinery import EXTENSION_SUFFIXES

    import hw_model

    suffix = EXTENSION_SUFFIXES[0]
    (tmp_path / "policies").mkdir()
    (tmp_path / "empty").mkdir()
    for name in ("cost.py", f"simulator{suffix}", "policies/__init__.py", f"policies/__init__{suffix}"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "policies" / f"base{suffix}").write_bytes(b"")
    assert hw_model.compiled_modules(tmp_path) == ("policies", "simulator")
