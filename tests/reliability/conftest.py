"""Fixtures of the reliability tests: a tiny MoE model with external data, hostile variants, an open() recorder."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from sample_models.build_samples import MoEBlockSpec, build_moe_block

SPEC = MoEBlockSpec(num_experts=4, top_k=2, hidden=16, ffn=32)
_OPENED: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and args and isinstance(args[0], str | bytes | os.PathLike):
        _OPENED.append(os.path.realpath(os.fsdecode(args[0])))


sys.addaudithook(_audit)


@pytest.fixture
def opened_files():
    """Every path Python opens (builtins.open, io.open, os.open, np.memmap) while the test runs, resolved."""
    global _OPENED
    _OPENED = []
    try:
        yield _OPENED
    finally:
        _OPENED = None


def digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tiny_model() -> onnx.ModelProto:
    return build_moe_block(SPEC, seed=3)


def feeds(seed: int = 0) -> dict[str, np.ndarray]:
    return {"hidden_states": np.random.default_rng(seed).standard_normal((1, 3, SPEC.hidden)).astype(np.float32)}


def save_external(model: onnx.ModelProto, path: Path, location: str = "weights.bin") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=location,
        size_threshold=0,
    )
    return path


def relocate(path: Path, location: str) -> None:
    """Point every external initializer of the model at ``path`` to ``location`` (offsets unchanged)."""
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    path.write_bytes(model.SerializeToString())


@pytest.fixture
def external_model(tmp_path) -> Path:
    """``tmp/model/moe.onnx`` with every weight in ``tmp/model/weights.bin``."""
    return save_external(tiny_model(), tmp_path / "model" / "moe.onnx")


@pytest.fixture(params=["dotdot", "absolute", "symlink_escape", "symlink_loop"])
def hostile_model(request, external_model) -> tuple[Path, Path, str]:
    """``(model, secret, form)``: a model whose external data points outside its folder at a file holding
    exactly the bytes it needs (what an attacker would plant), in each of the four forms."""
    model_dir = external_model.parent
    secret = model_dir.parent / "secret.bin"
    secret.write_bytes((model_dir / "weights.bin").read_bytes())
    form = request.param
    if form == "dotdot":
        relocate(external_model, "../secret.bin")
    elif form == "absolute":
        relocate(external_model, str(secret))
    elif form == "symlink_escape":
        (model_dir / "weights.bin").unlink()
        (model_dir / "weights.bin").symlink_to(secret)
    else:
        (model_dir / "loop_a").symlink_to(model_dir / "loop_b")
        (model_dir / "loop_b").symlink_to(model_dir / "loop_a")
        relocate(external_model, "loop_a")
    if form != "symlink_escape":
        (model_dir / "weights.bin").unlink()  # the only copy of the weights is now outside the folder
    return external_model, secret, form
