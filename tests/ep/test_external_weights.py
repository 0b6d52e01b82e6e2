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


@pytest.fixture(scope="module", params=[4, 8], ids=["int4", "int8"])
def converted(tmp_path_factory, request) -> Path:
    # int8 experts multiply with int8 activations on onnxruntime >= 1.31 (the kernel's other product path)
    folder = tmp_path_factory.mktemp("external")
    original, out = folder / "chain.onnx", folder / "chain.ndp.onnx"
    build_chain(original, layers=3, bits=request.param, widths=WIDTHS, seed=3)
    ndp_ep.convert_model(original, out, shards=4, external_data=True)
    assert (folder / "chain.ndp.onnx.data").stat().st_size > 10 * 2**20
    return out


@pytest.mark.parametrize("tokens", [7, 40])  # a decode-sized call (its products split by columns) and a larger one
def test_weights_read_from_the_file_give_the_bits_of_weights_inside_the_model(converted, ep_session, tokens):
    # from the file: codes packed from the provider's own mapping, float32 scales read in place from it; from
    # bytes: both copied from ONNX Runtime's values
    embedded = onnx.load(str(converted))  # loads the external data into the tensors
    for tensor in embedded.graph.initializer:
        assert tensor.data_location != onnx.TensorProto.EXTERNAL
    x = np.random.default_rng(tokens).standard_normal((tokens, WIDTHS.hidden)).astype(np.float32)
    from_file = ep_session(converted, threads=2).run(None, {"x": x})[0]
    from_bytes = ep_session(embedded, threads=2).run(None, {"x": x})[0]
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
    # the packed codes take about the file's size less the scales; before the file was mapped by the provider
    # itself, ONNX Runtime's mapping of every weight was resident next to them at the end of Compile (twice the file)
    data_bytes = (converted.parent / (converted.name + ".data")).stat().st_size
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), str(converted)], capture_output=True, text=True, check=True
    )
    grown = json.loads(done.stdout.strip().splitlines()[-1])["grown"]
    # plus a fixed allowance for the session's own structures (graph, allocator, thread pool), which a small
    # model's weights do not dwarf: 1.11x was seen on a fresh machine; the old library grew 2.3x
    session_overhead = 8 << 20
    assert grown < 1.1 * data_bytes + session_overhead, (
        f"session build grew the peak by {grown / data_bytes:.2f}x the weights"
    )


def experts_packed() -> int:
    """Experts the provider library has packed in this process so far (its ``ndp_ep_experts_packed``)."""
    import ctypes

    from ndp_ep import ep

    lib = ctypes.CDLL(ep.get_library_path())
    lib.ndp_ep_experts_packed.restype = ctypes.c_int64
    return int(lib.ndp_ep_experts_packed())


def test_a_session_packs_only_the_experts_its_runs_route_to(converted, ep_session):
    # weights in the node's own mapping are packed on their expert's first routing: none at creation, a one-token
    # run packs top_k experts per layer, the same token again packs nothing; the outputs are those of the same
    # model packed up front (test_weights_read_from_the_file_give_the_bits_of_weights_inside_the_model)
    start = experts_packed()
    session = ep_session(converted, threads=2)
    assert experts_packed() == start
    x = np.random.default_rng(5).standard_normal((1, WIDTHS.hidden)).astype(np.float32)
    first = session.run(None, {"x": x})[0]
    layers = 3
    assert experts_packed() == start + layers * WIDTHS.top_k
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], first)
    assert experts_packed() == start + layers * WIDTHS.top_k


def test_eager_packing_packs_every_expert_when_the_session_is_built(converted, ep_session, monkeypatch):
    monkeypatch.setenv("NDP_EP_PACK_EXPERTS", "eager")
    start = experts_packed()
    session = ep_session(converted, threads=2)
    layers = 3
    assert experts_packed() == start + layers * WIDTHS.experts
    x = np.random.default_rng(6).standard_normal((4, WIDTHS.hidden)).astype(np.float32)
    monkeypatch.delenv("NDP_EP_PACK_EXPERTS")
    lazy = ep_session(converted, threads=2)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], lazy.run(None, {"x": x})[0])


def test_concurrent_first_runs_pack_each_expert_once(converted, ep_session):
    from concurrent.futures import ThreadPoolExecutor

    start = experts_packed()
    session = ep_session(converted, threads=2)
    x = np.random.default_rng(7).standard_normal((32, WIDTHS.hidden)).astype(np.float32)
    with ThreadPoolExecutor(4) as pool:
        outputs = list(pool.map(lambda _: session.run(None, {"x": x})[0], range(4)))
    for out in outputs[1:]:
        np.testing.assert_array_equal(out, outputs[0])
    assert experts_packed() - start <= 3 * WIDTHS.experts
