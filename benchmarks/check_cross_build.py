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

3. **the provider** (aarch64 only; ``--no-provider`` skips it): the library loaded into ONNX Runtime's own aarch64
   wheel (the version this interpreter runs, with numpy, from the package index) in Debian's aarch64 Python 3.11
   (``python3.11-minimal`` and the libraries it needs, downloaded with a private apt state from ``--mirror``, nothing
   installed), all under the emulator: a plain ``onnxruntime.InferenceSession`` with ``ndp_ep.session_options()``
   on ``moe_decoder`` converted here, its outputs against stock ONNX Runtime on the original here, and the
   providers the session's nodes were assigned to. ONNX Runtime reads the CPU's features from ``/proc/cpuinfo``,
   which qemu's user mode passes through from the host (an x86 one crashes ONNX Runtime's parser at load), so the
   run sees an Arm Neoverse-N1's ``/proc/cpuinfo``, bind-mounted in a mount namespace of its own (``unshare``;
   as root, or with unprivileged user namespaces).

Exit status 0 when every step passes, 1 when one fails, 2 when a tool is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
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


# Debian's aarch64 Python and what it and ONNX Runtime's wheel load (libstdc++ for the wheel, libffi for ctypes)
SYSROOT_PACKAGES = (
    "python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib", "libc6", "libexpat1", "zlib1g", "libffi8",
    "libssl3", "libbz2-1.0", "liblzma5", "libstdc++6", "libgcc-s1", "libuuid1",
)  # fmt: skip
SYSROOT_PYTHON = "3.11"
DEBIAN_ARCH = {"aarch64": "arm64"}
PARITY_RTOL = 1e-5
# an Arm Neoverse-N1 (the -cpu qemu emulates) as Linux lists it
NEOVERSE_N1_CPUINFO = "".join(
    f"processor\t: {n}\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp "
    "asimdhp cpuid asimdrdm lrcpc dcpop asimddp\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x3\n"
    "CPU part\t: 0xd0c\nCPU revision\t: 1\n\n"
    for n in range(2)
)
CHILD = r"""
import json, platform, sys
import numpy as np
import onnxruntime as ort
sys.path.insert(0, sys.argv[1])
from ndp_ep import ep
data = np.load(sys.argv[3])
options = ort.SessionOptions()
options.log_severity_level = 3
options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
session = ort.InferenceSession(sys.argv[2], ep.session_options(options))
outputs = session.run(None, {i.name: data[i.name] for i in session.get_inputs()})
expected = [data[f"out{i}"] for i in range(len(outputs))]
print(json.dumps({
    "machine": platform.machine(),
    "onnxruntime": ort.__version__,
    "library": ep.get_library_path(),
    "assigned": {n.name: a.ep_name for a in session.get_provider_graph_assignment_info() for n in a.get_nodes()},
    "max_relative_error": max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(outputs, expected)),
}))
"""


def fetch_sysroot(arch: str, mirror: str, suite: str, work: Path) -> Path:
    """Debian's Python for ``arch`` and its libraries, unpacked into ``work/sysroot`` (a private apt state: nothing is
    installed or cached outside ``work``)."""
    apt = work / "apt"
    for folder in (apt / "lists" / "partial", apt / "cache" / "archives" / "partial", work / "debs"):
        folder.mkdir(parents=True)
    sources = work / "sources.list"
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    sources.write_text(f"deb [arch={DEBIAN_ARCH[arch]} signed-by={keyring}] {mirror} {suite} main\n")
    options = [
        f"-oDir::State={apt}", "-oDir::State::status=/dev/null", f"-oDir::Cache={apt / 'cache'}",
        f"-oDir::Etc::SourceList={sources}", "-oDir::Etc::SourceParts=/dev/null",
        f"-oAPT::Architecture={DEBIAN_ARCH[arch]}", f"-oAPT::Architectures={DEBIAN_ARCH[arch]}", "-q",
    ]  # fmt: skip
    for step in (["update"], ["download", *SYSROOT_PACKAGES]):
        done = run(["apt-get", *options, *step], cwd=work / "debs")
        if done.returncode != 0:
            raise RuntimeError(f"apt-get {step[0]} failed:\n{tail(done)}")
    sysroot = work / "sysroot"
    for package in sorted((work / "debs").glob("*.deb")):
        unpacked = run(["dpkg-deb", "-x", str(package), str(sysroot)])
        if unpacked.returncode != 0:
            raise RuntimeError(f"dpkg-deb -x {package.name} failed:\n{tail(unpacked)}")
    return sysroot


def fetch_wheels(arch: str, work: Path) -> Path:
    """ONNX Runtime (this interpreter's version) and numpy for ``arch`` and the sysroot's Python, unpacked."""
    import onnxruntime

    wheels, site = work / "wheels", work / "site"
    downloaded = run(
        [
            sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--no-deps",
            "--python-version", SYSROOT_PYTHON, "--platform", f"manylinux_2_28_{arch}",
            "--platform", f"manylinux2014_{arch}", "--dest", str(wheels),
            f"onnxruntime=={onnxruntime.__version__}", "numpy",
        ]
    )  # fmt: skip
    if downloaded.returncode != 0:
        raise RuntimeError(f"pip download failed:\n{tail(downloaded)}")
    for wheel in wheels.glob("*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    return site


def reference(work: Path) -> tuple[Path, Path]:
    """moe_decoder converted here, and its inputs with stock ONNX Runtime's outputs on the original (this machine)."""
    import numpy as np
    import onnxruntime as ort

    original = ROOT / "sample_models" / "moe_decoder.onnx"
    converted = work / "moe_decoder.ndp.onnx"
    done = run([sys.executable, "-m", "ndp_ep", "convert", str(original), "-o", str(converted)], cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"ndp-ep convert failed:\n{tail(done)}")
    feeds = dict(np.load(original.with_name("moe_decoder.inputs.npz")))
    outputs = ort.InferenceSession(str(original), providers=["CPUExecutionProvider"]).run(None, feeds)
    data = work / "data.npz"
    np.savez(data, **feeds, **{f"out{i}": value for i, value in enumerate(outputs)})
    return converted, data


def sharded_nodes(model: Path) -> set[str]:
    import onnx

    sys.path.insert(0, str(ROOT))
    from graph_passes.sharded_op import is_sharded_node

    return {node.name for node in onnx.load(str(model), load_external_data=False).graph.node if is_sharded_node(node)}


def check_provider(arch: str, emulator: str, library: Path, mirror: str, suite: str, work: Path) -> str:
    """One line on the provider run under ``emulator``; RuntimeError when it fails or does not match."""
    sysroot = fetch_sysroot(arch, mirror, suite, work)
    site = fetch_wheels(arch, work)
    model, data = reference(work)
    (work / "cpuinfo").write_text(NEOVERSE_N1_CPUINFO)
    (work / "child.py").write_text(f"import sys\nsys.path.insert(0, {str(site)!r})\n{CHILD}")
    python = sysroot / "usr" / "bin" / f"python{SYSROOT_PYTHON}"
    emulated = [emulator, "-cpu", "neoverse-n1", "-L", str(sysroot), str(python), str(work / "child.py")]
    script = 'mount --bind "$0" /proc/cpuinfo && exec "$@"'
    namespace = ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    command = [*namespace, "sh", "-c", script, str(work / "cpuinfo"), *emulated, str(ROOT), str(model), str(data)]
    child = run(command, env=dict(os.environ, NDP_EP_LIBRARY=str(library)))
    if child.returncode != 0:
        raise RuntimeError(f"the emulated run failed:\n{tail(child, 25)}")
    result = json.loads(child.stdout.strip().splitlines()[-1])
    owned = {name for name, provider in result["assigned"].items() if provider == "NdpExecutionProvider"}
    sharded = sharded_nodes(model)
    problems = []
    if result["machine"] != arch or result["library"] != str(library):
        problems.append(f"ran on {result['machine']} with {result['library']}")
    if owned != sharded or not sharded:
        problems.append(f"NdpExecutionProvider was assigned {sorted(owned)}, the sharded nodes are {sorted(sharded)}")
    if not result["max_relative_error"] <= PARITY_RTOL:
        problems.append(f"max relative error {result['max_relative_error']:.2g} > {PARITY_RTOL:g}")
    if problems:
        raise RuntimeError("; ".join(problems))
    return (
        f"onnxruntime {result['onnxruntime']} ({arch} wheel) in Debian's {arch} Python {SYSROOT_PYTHON}: "
        f"NdpExecutionProvider runs exactly moe_decoder's {len(sharded)} sharded nodes, ONNX Runtime's CPU provider "
        f"the rest; outputs vs stock ONNX Runtime on the original on this machine: max rel. error "
        f"{result['max_relative_error']:.1e} (<= {PARITY_RTOL:g})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="aarch64", choices=sorted(MACHINES))
    parser.add_argument("--cxx", help="the cross compiler (default: ARCH-linux-gnu-g++)")
    parser.add_argument("--emulator", help="the user-mode emulator (default: qemu-ARCH)")
    parser.add_argument("--no-provider", action="store_true", help="skip step 3 (the provider in ONNX Runtime)")
    parser.add_argument("--mirror", default="http://deb.debian.org/debian", help="the Debian mirror for step 3")
    parser.add_argument("--suite", default="bookworm", help=f"a Debian suite with python{SYSROOT_PYTHON}")
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
        library: Path | None = None
        try:
            built = build_library(cxx, work / "build")
            print(f"library: built by the CMake project, {describe_library(built, MACHINES[args.arch])}")
            library = built
        except RuntimeError as exc:
            print(f"library: FAILED: {exc}")
            failed = True
        try:
            print(f"kernels: {check_kernels(cxx, emulator, work)}")
        except RuntimeError as exc:
            print(f"kernels: FAILED: {exc}")
            failed = True
        if args.no_provider or args.arch not in DEBIAN_ARCH:
            print(f"provider: skipped ({'--no-provider' if args.no_provider else 'aarch64 only'})")
        elif library is None:
            print("provider: not run (no library)")
        else:
            try:
                provider = work / "provider"
                provider.mkdir()
                print(f"provider: {check_provider(args.arch, emulator, library, args.mirror, args.suite, provider)}")
            except RuntimeError as exc:
                print(f"provider: FAILED: {exc}")
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
