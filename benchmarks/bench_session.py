"""Time the provider against stock ONNX Runtime on the same original model, at 1 and 64 tokens.

    python benchmarks/bench_session.py [--models M.onnx ...] [--repeats 200] [--threads 1 2] [--startup N]
                                       [--installed]
    python benchmarks/bench_session.py --startup-imports N

Per model, token count and intra-op thread count, three sessions run in this process, alternating call by
call so machine noise hits all alike: stock ONNX Runtime (CPU provider) on the original model;
``ndp_ep.InferenceSession`` on it (converted in memory, experts on NdpExecutionProvider, each run tagged for
its report); and a plain ``onnxruntime.InferenceSession`` on the converted model with the provider added
(``ndp_ep.session_options``). Prints medians and the ratios to stock (target <= 1.0), and the cost of
building the run's report (``last_report`` after each run; target <= 10 % of a 1-token run), split into the
time spent inside hw_model's MoESimulator and the rest (draining the routing, grouping, costing lookups), and
its mean and 99th percentile: the median hides the reports that also re-plan the prefetcher (one decode step in
32).
Default models: sample_models/moe_decoder.onnx and the exported Hugging Face decoders (sample_models/hf/*_model_*,
not the eager-unrolled export, whose MoE block does not convert). The packages come from this checkout, unless
``--installed``: then from the installed package (``pip install .`` from this checkout first), as users run them,
with hw_model's compiled modules.

``--scaled H [H ...]`` replaces the models with ``moe_decoder``'s structure (three layers of attention and an 8-expert
top-2 MoE block, built by ``sample_models.build_samples``) at hidden width H (expert FFN width 2H), generated into a
temporary folder: how the report's cost compares with runs of larger models (it does not grow with the weights).

``--startup N`` instead times process start-up (target <= 1.5x): ``ndp-ep run`` on the converted and on the
original ``moe_decoder`` against ``python -c 'import onnxruntime' + one run``, N alternating starts each, both
with compiled bytecode (see :func:`startup`), with the machine's load average (1 minute) before and after.
``--startup-imports N`` lists what the difference is made of at import time: the modules ``ndp-ep run`` imports
beyond the stock program, by package (:func:`startup_imports`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
if "--installed" not in sys.argv:  # read before argparse: it decides where the packages below come from
    sys.path.insert(0, str(ROOT))

import ndp_ep  # noqa: E402
from graph_passes.feeds import random_feeds  # noqa: E402

TARGET_RATIO = 1.0
TARGET_STARTUP_RATIO = 1.5
STOCK_ONE_RUN = (
    "import sys, numpy as np, onnxruntime as ort;"
    "ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider']).run(None, dict(np.load(sys.argv[2])))"
)
TARGET_REPORT_FRACTION = 0.10
# what pip writes as the ``ndp-ep`` console script (pyproject.toml: ndp-ep = "ndp_ep.cli:program"), after the shebang
CONSOLE_SCRIPT = """import sys
from ndp_ep.cli import program
if __name__ == '__main__':
    sys.argv[0] = sys.argv[0].removesuffix('.exe')
    sys.exit(program())
"""


def _options(threads: int) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return options


def measure(model: Path, converted: Path, tokens: int, repeats: int, threads: int) -> dict[str, float]:
    stock = ort.InferenceSession(str(model), _options(threads), providers=["CPUExecutionProvider"])
    ours = ndp_ep.InferenceSession(model, _options(threads), hw="paper")
    plain = ort.InferenceSession(str(converted), ndp_ep.session_options(_options(threads), hw="paper"))
    feed = random_feeds(onnx.load(str(model), load_external_data=False), seed=tokens, seq_len=tokens)
    for _ in range(10):  # warm-up (and first reports: the non-expert costing is cached per input shape)
        stock.run(None, feed)
        ours.run(None, feed)
        plain.run(None, feed)
        ours.last_report  # noqa: B018
    simulator_s = _time_simulator(ours)
    times: dict[str, list[float]] = {"stock": [], "ours": [], "plain": [], "report": [], "simulator": []}
    for _ in range(repeats):
        for name, session in (("stock", stock), ("ours", ours), ("plain", plain)):
            start = time.perf_counter()
            session.run(None, feed)
            times[name].append(time.perf_counter() - start)
        simulator_s[0] = 0.0
        start = time.perf_counter()
        report = ours.last_report
        times["report"].append(time.perf_counter() - start)
        times["simulator"].append(simulator_s[0])
        assert report is not None and report.tokens == tokens
    medians = {name: statistics.median(values) for name, values in times.items()}
    reports = sorted(times["report"])
    return {**medians, "report_mean": statistics.fmean(reports), "report_p99": reports[int(0.99 * (len(reports) - 1))]}


class _TimedSimulator:
    """A session's MoESimulator whose ``simulate_step``, ``summary`` and ``summary_snapshot`` (a report simulates its
    run's layers in one step and takes a snapshot of the summary) add their wall time to ``total[0]``; everything
    else is the simulator's own. A wrapper, not patched methods: a compiled simulator's methods cannot be replaced."""

    def __init__(self, simulator, total: list[float]) -> None:
        self._simulator = simulator
        self._total = total

    def __getattr__(self, name: str):
        return getattr(self._simulator, name)

    def _timed(self, method, *args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            self._total[0] += time.perf_counter() - start

    def simulate_step(self, *args, **kwargs):
        return self._timed(self._simulator.simulate_step, *args, **kwargs)

    def summary(self):
        return self._timed(self._simulator.summary)

    def summary_snapshot(self):
        return self._timed(self._simulator.summary_snapshot)


def _time_simulator(session) -> list[float]:
    """Time the session's MoESimulator (see :class:`_TimedSimulator`); returns the one-element running total."""
    total = [0.0]
    session.reporter.simulator = _TimedSimulator(session.reporter.simulator, total)
    return total


def _startup_commands(original: Path, model: Path, pycache: Path) -> tuple[list[list[str]], dict[str, str]]:
    """The two commands :func:`startup` times (stock, then ``ndp-ep run``) and their environment."""
    inputs = original.with_name(original.name.replace(".onnx", ".inputs.npz"))
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(pycache))
    if str(ROOT) in sys.path:  # this checkout's packages (not --installed)
        env["PYTHONPATH"] = str(ROOT)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    script = pycache.parent / "ndp-ep"
    script.write_text(f"#!{sys.executable}\n{CONSOLE_SCRIPT}", encoding="utf-8")
    commands = [
        [sys.executable, "-c", STOCK_ONE_RUN, str(original), str(inputs)],
        [sys.executable, str(script), "run", str(model), "--inputs", str(inputs)],
    ]
    return commands, env


def startup(original: Path, model: Path, repeats: int, pycache: Path) -> tuple[list[float], list[float]]:
    """Wall times of ``python -c 'import onnxruntime; one run'`` on ``original`` and of ``ndp-ep run MODEL`` (both
    with the original's input feeds), alternating, after one unmeasured start of each.

    ``ndp-ep`` is started as the console script pip installs (:data:`CONSOLE_SCRIPT`, written next to
    ``pycache``), not as ``python -m ndp_ep``, which also imports :mod:`runpy` (a few milliseconds an installed
    ``ndp-ep`` never pays). Both start with compiled bytecode, as an installed package does (pip compiles it):
    with ``PYTHONDONTWRITEBYTECODE`` set, a source checkout would recompile every one of its modules on every
    start while ONNX Runtime's and numpy's come precompiled. The bytecode goes to ``pycache``
    (``PYTHONPYCACHEPREFIX``), not into the checkout."""
    import subprocess

    commands, env = _startup_commands(original, model, pycache)
    for command in commands:  # warm-up: compiles the bytecode, fills the page cache
        subprocess.run(command, check=True, capture_output=True, env=env)
    stock: list[float] = []
    ours: list[float] = []
    for _ in range(repeats):
        for command, out in zip(commands, (stock, ours), strict=True):
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, env=env)
            out.append(time.perf_counter() - start)
    return stock, ours


def _import_rows(stderr: str) -> list[tuple[str, int, int]]:
    """``(module, self microseconds, depth)`` of each ``-X importtime`` line, in the order Python prints them
    (a module after everything it imported)."""
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "imported package" in line:
            continue
        self_us, _, name = line[len("import time:") :].split("|")
        rows.append((name.strip(), int(self_us), (len(name) - len(name.lstrip()) - 1) // 2))
    return rows


def startup_imports(original: Path, model: Path, repeats: int, pycache: Path) -> dict[str, float]:
    """Milliseconds ``ndp-ep run MODEL`` spends importing modules that ``import onnxruntime + one run`` does not
    import, grouped by the package whose import (from the command's own code) pulled them in, e.g. ``onnx`` for
    protobuf and ``ml_dtypes``: the smallest ``python -X importtime`` self-times of ``repeats`` starts (which add
    their own overhead, so the groups slightly overstate the real cost)."""
    import subprocess

    commands, env = _startup_commands(original, model, pycache)
    timed = [[command[0], "-X", "importtime", *command[1:]] for command in commands]
    for command in timed:  # warm-up: compiles the bytecode
        subprocess.run(command, check=True, capture_output=True, env=env)
    best: dict[str, float] = {}
    for _ in range(repeats):
        stock, ours = (subprocess.run(c, check=True, capture_output=True, env=env, text=True).stderr for c in timed)
        known = {name for name, _, _ in _import_rows(stock)}
        groups: dict[str, float] = {}
        pending = 0.0
        for name, self_us, depth in _import_rows(ours):
            if name not in known:
                pending += self_us / 1e3
            if depth == 0:  # a top-level import: the modules printed since it are its own
                group = name.split(".")[0]
                groups[group] = groups.get(group, 0.0) + pending
                pending = 0.0
        for group, ms in groups.items():
            best[group] = min(best.get(group, ms), ms)
    return dict(sorted(((g, ms) for g, ms in best.items() if ms >= 0.05), key=lambda item: -item[1]))


def scaled_decoders(hiddens: list[int], directory: Path) -> list[Path]:
    """``moe_decoder``-shaped models (see the module docstring) of each hidden width, written into ``directory``."""
    if str(ROOT) not in sys.path:  # --installed: the packages stay the installed ones, the builder is this checkout's
        sys.path.append(str(ROOT))
    from sample_models.build_samples import MoEBlockSpec, build_moe_decoder

    paths = []
    for hidden in hiddens:
        spec = MoEBlockSpec(num_experts=8, top_k=2, hidden=hidden, ffn=2 * hidden)
        path = directory / f"moe_decoder_h{hidden}.onnx"
        onnx.save(build_moe_decoder((spec, spec, spec)), path)
        paths.append(path)
    return paths


def default_models() -> list[Path]:
    exported = [p for p in sorted((ROOT / "sample_models" / "hf").glob("*_model_*.onnx")) if "eager" not in p.name]
    return [ROOT / "sample_models" / "moe_decoder.onnx", *exported]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", type=Path, default=None)
    parser.add_argument("--installed", action="store_true", help="the installed packages, not this checkout's")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    parser.add_argument("--tokens", nargs="*", type=int, default=[1, 64])
    parser.add_argument(
        "--scaled",
        nargs="*",
        type=int,
        default=None,
        metavar="H",
        help="instead of the models: moe_decoder's structure at these hidden widths (generated)",
    )
    parser.add_argument(
        "--startup",
        type=int,
        default=0,
        metavar="N",
        help="instead: N process start-ups each, `ndp-ep run` vs import onnxruntime + one run (best and median)",
    )
    parser.add_argument(
        "--startup-imports",
        type=int,
        default=0,
        metavar="N",
        help="instead: what `ndp-ep run` imports beyond import onnxruntime + one run, per package (min of N starts)",
    )
    args = parser.parse_args()
    if args.startup_imports or args.startup:
        model = ROOT / "sample_models" / "moe_decoder.onnx"
        with tempfile.TemporaryDirectory() as tmp:
            converted = Path(tmp) / "moe_decoder.ndp.onnx"
            ndp_ep.convert_model(model, converted, shards=4)
            cache = Path(tmp) / "pycache"
            if args.startup_imports:
                print(f"import time (python -X importtime self times, min of {args.startup_imports} starts) of the")
                print("modules `ndp-ep run` loads beyond `import onnxruntime` + one run, by the package loading them")
            else:
                print(f"{args.startup} alternating process starts each; best and median wall times")
                print(f"load average before: {os.getloadavg()[0]:.2f}")
            for label, path in (("converted", converted), ("original", model)):
                if args.startup_imports:
                    costs = startup_imports(model, path, args.startup_imports, cache)
                    listed = ", ".join(f"{group} {ms:.1f}" for group, ms in costs.items())
                    print(f"ndp-ep run {label} {path.name}: {sum(costs.values()):.1f} ms: {listed} (ms)")
                    continue
                stock, ours = startup(model, path, args.startup, cache)
                best, median = min(ours) / min(stock), statistics.median(ours) / statistics.median(stock)
                print(
                    f"ndp-ep run {label} {path.name}: best {min(ours):.3f} s, median {statistics.median(ours):.3f} s; "
                    f"import onnxruntime + one run: best {min(stock):.3f} s, median {statistics.median(stock):.3f} s; "
                    f"ratio best {best:.2f}, median {median:.2f} (target <= {TARGET_STARTUP_RATIO}); "
                    f"load average after: {os.getloadavg()[0]:.2f}"
                )
        return
    print(f"{args.repeats} alternating runs per cell; medians; ratios to stock ONNX Runtime on the original model")
    print(
        f"{'model':<28} {'thr':>3} {'tok':>4} {'stock':>10} {'session':>10} {'plain EP':>10} "
        f"{'session/stock':>13} {'plain/stock':>11} {'report':>9} {'report/run':>10} {'simulator':>9} {'rest/run':>8} "
        f"{'mean report':>11} {'p99 report':>10}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        models = scaled_decoders(args.scaled, Path(tmp)) if args.scaled else args.models or default_models()
        for model in models:
            converted = Path(tmp) / f"{model.stem}.ndp.onnx"
            ndp_ep.convert_model(model, converted, shards=4)
            for threads in args.threads:
                for tokens in args.tokens:
                    t = measure(model, converted, tokens, args.repeats, threads)
                    ratio, plain_ratio = t["ours"] / t["stock"], t["plain"] / t["stock"]
                    fraction = t["report"] / t["ours"]
                    rest = (t["report"] - t["simulator"]) / t["ours"]
                    print(
                        f"{model.stem:<28} {threads:>3} {tokens:>4} {t['stock'] * 1e6:>8.1f}us "
                        f"{t['ours'] * 1e6:>8.1f}us {t['plain'] * 1e6:>8.1f}us {ratio:>13.2f} {plain_ratio:>11.2f} "
                        f"{t['report'] * 1e6:>7.1f}us {fraction:>9.1%} {t['simulator'] * 1e6:>7.1f}us {rest:>7.1%} "
                        f"{t['report_mean'] * 1e6:>9.1f}us {t['report_p99'] * 1e6:>8.1f}us"
                    )
    targets = f"session/stock and plain/stock <= {TARGET_RATIO}; report/run <= {TARGET_REPORT_FRACTION:.0%} at 1 token"
    print(f"targets: {targets}")


if __name__ == "__main__":
    main()
