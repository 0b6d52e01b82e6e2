"""Compile reads external-data weights from the file itself, once, without a second full copy resident.

The provider maps a converted model's external-data file (native/src/weight_map.cc) and drops each expert's pages
once it is packed; ONNX Runtime never maps them. What that must not change: the outputs (bit for bit the same as
the same model with its weights inside the file); what it must change: the memory a session takes while it is
built (the packed weights plus about one expert, not the packed weights plus the whole file).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import ndp_ep
from sample_models.qmoe_chain import ChainWidths, build_chain

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = ChainWidths(hidden=512, experts=16, top_k=2, ffn=1024, block=32)


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("external")
    original, out = folder / "chain.onnx", folder / "chain.ndp.onnx"
    build_chain(original, layers=3, bits=4, widths=WIDTHS, seed=3)
    ndp_ep.convert_model(original, out, shards=4, external_data=True)
    assert (folder / "chain.ndp.onnx.data").stat().st_size > 10 * 2**20
    return out


def test_weights_read_from_the_file_give_the_bits_of_weights_inside_the_model(converted, ep_session):
    embedded = onnx.load(str(converted))  # loads the external data into the tensors
    for tensor in embedded.graph.initializer:
        assert tensor.data_location != onnx.TensorProto.EXTERNAL
    x = np.random.default_rng(0).standard_normal((7, WIDTHS.hidden)).astype(np.float32)
    from_file = ep_session(converted).run(None, {"x": x})[0]
    from_bytes = ep_session(embedded).run(None, {"x": x})[0]
    np.testing.assert_array_equal(from_file, from_bytes)


CHILD = r"""
import json, sys
import numpy as np
import onnxruntime as ort
sys.path.insert(0, sys.argv[1])
import ndp_ep
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
ndp_ep.register()
options = ort.SessionOptions()
options.log_severity_level = 3
before = peak()
session = ort.InferenceSession(sys.argv[2], ndp_ep.session_options(options, record_routing=0))
print(json.dumps({"grown": peak() - before}))
"""


def test_building_a_session_holds_the_weights_once_not_twice(converted):
    # the packed weights take about the file's size; before the file was mapped by the provider itself, ONNX
    # Runtime's mapping of every weight was resident next to them at the end of Compile (twice the file)
    data_bytes = (converted.parent / (converted.name + ".data")).stat().st_size
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), str(converted)], capture_output=True, text=True, check=True
    )
    grown = json.loads(done.stdout.strip().splitlines()[-1])["grown"]
    assert grown < 1.4 * data_bytes, f"session build grew the peak by {grown / data_bytes:.2f}x the weights"
