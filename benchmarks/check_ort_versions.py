"""Load the built provider library into the oldest and the newest onnxruntime and check parity in each.

    python benchmarks/check_ort_versions.py [--versions 1.23.0 1.23.1 latest] [--keep DIR]

For each version a throwaway virtualenv gets ``onnxruntime==VERSION`` and numpy (pip, from the configured
index); a child process there imports this repository's ``ndp_ep`` helpers (``ndp_ep.ep``: nothing else of the
package), creates a plain ``onnxruntime.InferenceSession`` on sample_models/moe_decoder converted by ndp-ep
with ``ndp_ep.session_options()``, and compares its outputs with stock ONNX Runtime on the original model
(computed here, in this interpreter's onnxruntime). Prints one row per version.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ndp_ep  # noqa: E402

PARITY_RTOL = 1e-5
CHILD = r"""
import json, sys
import numpy as np
import onnxruntime as ort
sys.path.insert(0, sys.argv[1])
import ndp_ep
from ndp_ep import ep
data = np.load(sys.argv[3])
options = ort.SessionOptions()
options.log_severity_level = 3
session = ort.InferenceSession(sys.argv[2], ep.session_options(options))
outputs = session.run(None, {"input_ids": data["input_ids"]})
expected = [data[f"out{i}"] for i in range(len(outputs))]
error = max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(outputs, expected))
print(json.dumps({
    "onnxruntime": ort.__version__,
    "providers": session.get_providers(),
    "factory_api": int(ep.native().ndp_ep_factory_api_version()),
    "schema_from": "EP factory" if ep.native().ndp_ep_factory_api_version() >= ep.SCHEMA_API_VERSION
    else "register_custom_ops_library",
    "max_relative_error": error,
}))
"""


def check(version: str, workdir: Path, model: Path, data: Path) -> dict:
    env_dir = workdir / f"venv-{version}"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    requirement = "onnxruntime" if version == "latest" else f"onnxruntime=={version}"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", requirement, "numpy"], capture_output=True, text=True
    )
    if install.returncode:
        return {"onnxruntime": version, "error": f"pip install failed: {install.stderr.strip().splitlines()[-1]}"}
    child = subprocess.run(
        [str(python), "-c", CHILD, str(ROOT), str(model), str(data)],
        capture_output=True,
        text=True,
        env={"NDP_EP_LIBRARY": ndp_ep.get_library_path(), "PATH": "/usr/bin:/bin"},
    )
    if child.returncode:
        lines = (child.stderr or child.stdout).strip().splitlines()
        return {"onnxruntime": version, "error": lines[-1] if lines else f"exit {child.returncode}"}
    return json.loads(child.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="*", default=["1.23.0", "1.23.1", "latest"])
    parser.add_argument("--keep", type=Path, default=None, help="keep the virtualenvs in this directory")
    args = parser.parse_args()
    sample = ROOT / "sample_models" / "moe_decoder.onnx"
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        converted = workdir / "moe_decoder.ndp.onnx"
        ndp_ep.convert_model(sample, converted, shards=4)
        feeds = dict(np.load(ROOT / "sample_models" / "moe_decoder.inputs.npz"))
        stock = ort.InferenceSession(str(sample), providers=["CPUExecutionProvider"]).run(None, feeds)
        data = workdir / "expected.npz"
        np.savez(data, input_ids=feeds["input_ids"], **{f"out{i}": a for i, a in enumerate(stock)})
        print(f"library {ndp_ep.get_library_path()}; reference: stock onnxruntime {ort.__version__} on {sample.name}")
        print(f"{'onnxruntime':<12} {'factory API':>11} {'op schema from':<28} {'providers':<44} {'max rel err':>11}")
        for version in args.versions:
            row = check(version, workdir, converted, data)
            if "error" in row:
                print(f"{row['onnxruntime']:<12} FAILED: {row['error']}")
                continue
            verdict = "ok" if row["max_relative_error"] <= PARITY_RTOL else "MISMATCH"
            print(
                f"{row['onnxruntime']:<12} {row['factory_api']:>11} {row['schema_from']:<28} "
                f"{','.join(row['providers']):<44} {row['max_relative_error']:>11.1e} {verdict}"
            )


if __name__ == "__main__":
    main()
