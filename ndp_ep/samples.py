"""The bundled demo samples: ``sample_path("moe_decoder.onnx") -> Path``.

An installed wheel ships them as package data of ``ndp_ep`` (``ndp_ep/samples/``); in a repository checkout
they are the top-level ``sample_models/`` files they are built into (``python -m sample_models.build_samples``).
The installed copy wins when both exist.

======================  =============================================================================
``moe_decoder.onnx``    a three-layer MoE decoder (token ids in, logits out) used by ``ndp-ep demo``
``moe_decoder.inputs.npz``  its prompt: ``input_ids`` of 16 tokens
``moe_block.onnx``      one MoE block (hidden states in and out), the smallest model to convert
``moe_block.inputs.npz``    its feeds: ``hidden_states``
======================  =============================================================================
"""

from __future__ import annotations

from pathlib import Path

from ndp_ep.errors import ModelLoadError

SAMPLES = ("moe_decoder.onnx", "moe_decoder.inputs.npz", "moe_block.onnx", "moe_block.inputs.npz")
PACKAGE_DIR = Path(__file__).resolve().parent / "samples"
CHECKOUT_DIR = Path(__file__).resolve().parents[1] / "sample_models"


def sample_path(name: str) -> Path:
    """Where the bundled sample ``name`` (one of :data:`SAMPLES`) is; :class:`ModelLoadError` if it is absent."""
    if name not in SAMPLES:
        raise ValueError(f"unknown sample {name!r}; the samples are {', '.join(SAMPLES)}")
    for directory in (PACKAGE_DIR, CHECKOUT_DIR):
        candidate = directory / name
        if candidate.is_file():
            return candidate
    raise ModelLoadError(
        f"sample {name} is missing from this installation (looked in {PACKAGE_DIR} and {CHECKOUT_DIR}); "
        "reinstall ndp-ep, or in a checkout run: python -m sample_models.build_samples"
    )
