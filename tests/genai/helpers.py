"""Converting a GenAI fixture folder and comparing a converted model's outputs with stock ONNX Runtime's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx

from ndp_ep.cli import main

# the acceptance tolerances, relative to the largest reference logit
TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 2e-2, "int8": 1e-3, "int4": 1e-3}
FUSED_OPS = {("com.microsoft", "MoE"), ("com.microsoft", "QMoE")}


def fused_op_count(model_path: Path) -> int:
    model = onnx.load(str(model_path), load_external_data=False)
    return sum((n.domain, n.op_type) in FUSED_OPS for n in model.graph.node)


def convert_json(source: Path, output: Path, capsys) -> dict:
    assert main(["convert", str(source), "-o", str(output), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def generate_converted(folder: Path, out_dir: Path, *generate_args: str) -> dict:
    """Convert the GenAI ``folder`` into ``out_dir`` (its other files copied beside) and ``ndp-ep generate`` it with
    ``generate_args``; returns the ``--json`` report."""
    import contextlib
    import io
    import shutil

    out_dir.mkdir()
    for item in folder.iterdir():
        if item.is_file() and not item.name.startswith("model.onnx"):
            shutil.copy2(item, out_dir / item.name)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["convert", str(folder / "model.onnx"), "-o", str(out_dir / "model.onnx")]) == 0
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["generate", str(out_dir), *generate_args, "--json"]) == 0
    return json.loads(out.getvalue())


def run_converted(model: Path, inputs: Path) -> dict[str, np.ndarray]:
    from ndp_ep.session import InferenceSession

    feeds = dict(np.load(inputs))
    session = InferenceSession(str(model))
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def assert_logits_close(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], weight_dtype: str) -> None:
    reference = expected["logits"].astype(np.float64)
    error = float(np.max(np.abs(got["logits"].astype(np.float64) - reference)))
    bound = TOLERANCE[weight_dtype] * float(np.max(np.abs(reference)))
    assert error <= bound, f"max |logit error| {error:.3g} > {bound:.3g} ({weight_dtype})"
