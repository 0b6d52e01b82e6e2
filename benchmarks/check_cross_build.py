"""Build the provider for another CPU architecture (default aarch64: Jetson-class edge boards, Arm servers) and check
its matrix kernels there under an emulator.

    python benchmarks/check_cross_build.py [--arch aarch64] [--cxx aarch64-linux-gnu-g++] [--emulator qemu-aarch64]

Needs a cross compiler and a user-mode emulator (Debian: ``apt install g++-aarch64-linux-gnu qemu-user``). Two steps,
each printed as one line:

1. **the library**: this repository's CMake project (the one ``pip install .`` runs, configured as a wheel build
   without the mypyc step, so nothing lands in the source tree) built with the cross compiler into a temporary
   folder; the ONNX Runtime headers come from ``ORT_INCLUDE_DIR`` or are fetched as on any build. Checks that the
   result is a shared library for that architecture exporting ``CreateEpFactories`` and ``ReleaseEpFactory``.
2. **the kernels**: ``native/checks/panel_gemm_check.cc`` (every weight format's products against a double
   reference at the kernels' blocking edges, the float16/bfloat16 conversions, the kernel choice) with the library's
   kernel sources, linked statically for that architecture and run under the emulator, where only the portable
   kernel exists.

Exit status 0 when both pass, 1 when one fails, 2 when a tool is missing.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNEL_SOURCES = ("native/checks/panel_gemm_check.cc", "native/src/panel_gemm.cc", "native/src/float_convert.cc")
# the ELF machine names readelf prints, per --arch
MACHINES = {"aarch64": "AArch64", "riscv64": "RISC-V", "ppc64le": "PowerPC64", "s390x": "IBM S/390"}
EXPORTS = ("CreateEpFactories", "ReleaseEpFactory")


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)


def tail(process: subprocess.CompletedProcess, lines: int = 15) -> str:
    return "\n".join((process.stdout + process.stderr).strip().splitlines()[-lines:])


def build_library(cxx: str, build: Path) -> Path:
    """The provider library built by CMake with ``cxx``; raises RuntimeError with the build's last lines."""
    configure = run(
        [
            "cmake",
            "-S",
            str(ROOT),
            "-B",
            str(build),
            f"-DCMAKE_CXX_COMPILER={cxx}",
            "-DSKBUILD=1",  # a wheel build's layout: nothing copied into the source tree
            "-DNDP_EP_COMPILE_HW_MODEL=OFF",  # mypyc compiles for this interpreter's architecture, not the target's
            f"-DPython_EXECUTABLE={sys.executable}",
        ]
    )
    if configure.returncode != 0:
        raise RuntimeError(f"cmake configure failed:\n{tail(configure)}")
    compiled = run(["cmake", "--build", str(build), "--parallel"])
    if compiled.returncode != 0:
        raise RuntimeError(f"build failed:\n{tail(compiled)}")
    return build / "libndp_ep.so"


def describe_library(library: Path, machine: str) -> str:
    """One line on the built library; raises RuntimeError when it is not for ``machine`` or lacks an export."""
    header = run(["readelf", "--file-header", str(library)]).stdout
    if machine not in header:
        raise RuntimeError(f"{library} is not a {machine} ELF file:\n{header.strip()}")
    symbols = run(["readelf", "--dyn-syms", "--wide", str(library)]).stdout
    defined = {line.split()[-1] for line in symbols.splitlines() if " UND " not in line and len(line.split()) >= 8}
    missing = [name for name in EXPORTS if name not in defined]
    if missing:
        raise RuntimeError(f"{library} does not export {', '.join(missing)}")
    return f"{library.stat().st_size / 2**20:.1f} MiB, {machine}, exports {' and '.join(EXPORTS)}"


def check_kernels(cxx: str, emulator: str, out: Path) -> str:
    """The kernel check's summary line, built with ``cxx`` and run under ``emulator``; RuntimeError on failure."""
    binary = out / "panel_gemm_check"
    sources = [str(ROOT / source) for source in KERNEL_SOURCES]
    flags = ["-std=c++17", "-O3", "-Wall", "-Wextra", "-Wno-unused-parameter", "-static"]
    compiled = run([cxx, *flags, f"-I{ROOT / 'native' / 'src'}", *sources, "-o", str(binary)])
    if compiled.returncode != 0:
        raise RuntimeError(f"the kernel check did not compile:\n{tail(compiled)}")
    checked = run([emulator, str(binary)])
    if checked.returncode != 0:
        raise RuntimeError(f"the kernel check failed:\n{tail(checked, 25)}")
    return checked.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="aarch64", choices=sorted(MACHINES))
    parser.add_argument("--cxx", help="the cross compiler (default: ARCH-linux-gnu-g++)")
    parser.add_argument("--emulator", help="the user-mode emulator (default: qemu-ARCH)")
    args = parser.parse_args()
    cxx = args.cxx or f"{args.arch}-linux-gnu-g++"
    emulator = args.emulator or f"qemu-{args.arch}"
    for tool in (cxx, emulator, "cmake", "readelf"):
        if shutil.which(tool) is None:
            install = f"apt install g++-{args.arch}-linux-gnu qemu-user cmake"
            print(f"check_cross_build: {tool} not found (Debian: {install})")
            return 2
    version = run([cxx, "-dumpfullversion"]).stdout.strip()
    print(f"target {args.arch}: {cxx} {version}, run under {emulator}")
    failed = False
    with tempfile.TemporaryDirectory(prefix="ndp-cross-") as temp:
        work = Path(temp)
        try:
            library = build_library(cxx, work / "build")
            print(f"library: built by the CMake project, {describe_library(library, MACHINES[args.arch])}")
        except RuntimeError as exc:
            print(f"library: FAILED: {exc}")
            failed = True
        try:
            print(f"kernels: {check_kernels(cxx, emulator, work)}")
        except RuntimeError as exc:
            print(f"kernels: FAILED: {exc}")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
