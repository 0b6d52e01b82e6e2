"""Compiles hw_model's hot modules with mypyc into CPython extension modules, at build time.

    python native/compile_hw_model.py SOURCE_ROOT OUT_DIR WORK_DIR

CMake runs this on ``pip install .`` (option ``NDP_EP_COMPILE_HW_MODEL``, on by default) with the isolated build
environment's Python, which has mypy (mypyc) and setuptools. The sources stay pure Python: this is an optional
speed-up of the installed package. mypy type-checks the modules listed in :data:`MODULES` and :data:`PACKAGES` (and
what they import), mypyc translates them to C under WORK_DIR, and setuptools' ``build_ext`` compiles that C, in
parallel on all cores, into OUT_DIR laid out as it is installed relative to site-packages:

- ``OUT_DIR/hw_model/<name>.<EXT_SUFFIX>`` (``hw_model/<package>/<name>.<EXT_SUFFIX>``, ``__init__`` included, for
  a package's modules): one small shim per module, found by ``import hw_model.<name>`` before the ``.py`` file next
  to it;
- ``OUT_DIR/<group>__mypyc.<EXT_SUFFIX>`` (top level): the compiled code of the group, which the shims load.

Nothing is written into SOURCE_ROOT: the generated C, the object files and mypy's cache all go under WORK_DIR.
mypy reads its settings from SOURCE_ROOT/pyproject.toml (a ``[tool.mypy]`` section, if there is one) plus the flags
in :func:`mypy_args`. On a type error or a compiler error the script exits non-zero, the errors above a final line
that says how to build without the compile.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import time
from pathlib import Path

# the hw_model modules compiled (hw_model/<name>.py) and packages compiled whole (every hw_model/<name>/*.py: a
# policy added to hw_model/policies/ is compiled with no edit here); the one place the lists are kept
MODULES = ("cost", "run_context", "timeline", "layout", "prefetch", "step_results", "simulator")
PACKAGES = ("policies",)
# mypyc group: names the shared library, <GROUP>__mypyc.<EXT_SUFFIX>, at the top of site-packages
GROUP = "hw_model"
# gcc's -O level for the generated C (mypyc's default is "3"). Measured on 2 cores, one C file (mypyc's default;
# multi_file or separate=True compiled slower here): cost.py runs about 5x faster than pure Python at -O1, -O2 and
# -O3 alike (-O1 within 5%); the simulator's decode loop (all six modules, built at each level with the
# MYPYC_OPT_LEVEL environment variable, timed alternately) was no slower at -O1, and gcc takes a third less time.
OPT_LEVEL = "1"
NO_HEADERS = (
    "ndp-ep: warning: Python's C headers are not in {headers} (Debian: apt install python3-dev); hw_model is "
    "installed interpreted, not compiled with mypyc (ndp-ep --version says which)"
)
FAILURE = (
    "ndp-ep: compiling hw_model with mypyc failed; build without it with: "
    "pip install . -C cmake.define.NDP_EP_COMPILE_HW_MODEL=OFF"
)


def mypy_args(source_root: Path, work_dir: Path) -> list[str]:
    """mypy's command line for mypycify: the settings, then the module paths."""
    return [
        "--config-file",
        str(source_root / "pyproject.toml"),
        "--cache-dir",
        str(work_dir / "mypy_cache"),
        # numpy, scipy ... are not in the build environment: their names are Any to mypy (and to mypyc)
        "--ignore-missing-imports",
        "--disable-error-code",
        "annotation-unchecked",
        *(str(path) for path in module_files(source_root)),
    ]


def module_files(source_root: Path) -> list[Path]:
    """The source files compiled: :data:`MODULES`, then every module of :data:`PACKAGES` (``__init__.py`` first)."""
    files = [source_root / "hw_model" / f"{name}.py" for name in MODULES]
    for package in PACKAGES:
        found = (source_root / "hw_model" / package).glob("*.py")
        files += sorted(found, key=lambda path: (path.name != "__init__.py", path.name))
    return files


def compile_hw_model(source_root: Path, out_dir: Path, work_dir: Path) -> None:
    """Type-checks and translates :data:`MODULES`, then compiles them into OUT_DIR; raises or exits on failure."""
    import setuptools  # before mypyc.build, which picks setuptools over distutils only if it is already imported
    from mypyc.build import mypycify

    c_dir = work_dir / "c"
    extensions = mypycify(
        mypy_args(source_root, work_dir),
        opt_level=OPT_LEVEL,
        group_name=GROUP,
        target_dir=str(c_dir),
    )
    distribution = setuptools.Distribution({"name": "hw_model-mypyc", "ext_modules": extensions})
    build_ext = distribution.get_command_obj("build_ext")
    build_ext.build_lib = str(out_dir)
    build_ext.build_temp = str(work_dir / "temp")
    build_ext.inplace = False
    build_ext.parallel = os.cpu_count() or 1
    build_ext.ensure_finalized()
    build_ext.run()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: " + __doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    source_root, out_dir, work_dir = (Path(arg).resolve() for arg in argv)
    headers = Path(sysconfig.get_paths()["include"])
    if not (headers / "Python.h").is_file():  # the provider itself does not need them: install, interpreted
        out_dir.mkdir(parents=True, exist_ok=True)  # nothing to install from it
        print(NO_HEADERS.format(headers=headers), file=sys.stderr)
        return 0
    start = time.perf_counter()
    try:
        compile_hw_model(source_root, out_dir, work_dir)
    except SystemExit as error:  # mypycify reports type errors and exits
        if error.code not in (None, 0):
            if not isinstance(error.code, int):
                print(error.code, file=sys.stderr)
            print(FAILURE, file=sys.stderr)
            return 1
    except Exception as error:  # a compiler or linker error (the compiler's messages are already on stderr)
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        print(FAILURE, file=sys.stderr)
        return 1
    names = ", ".join([*MODULES, *PACKAGES])
    print(f"ndp-ep: compiled hw_model ({names}) with mypyc in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
