"""What held in issue 11 and must keep holding: threads and parallel sessions agree bit for bit with a serial run,
every run is reported, and concurrent saves to one output leave one consistent model + weights pair."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest

from graph_passes.convert import convert
from graph_passes.model_io import owned_data_files, save_rewritten
from graph_passes.sharded_op import is_sharded_node, parse_node
from ndp_ep import InferenceSession
from ndp_io import TEMP_SUFFIX
from tests.reliability.conftest import feeds, tiny_model

THREADS = 8


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def test_eight_threads_on_one_session_match_a_serial_run(model):
    session = InferenceSession(model, shards=2)
    inputs = [feeds(seed) for seed in range(THREADS)]
    serial = [session.run(None, f)[0] for f in inputs]
    with ThreadPoolExecutor(THREADS) as pool:
        threaded = list(pool.map(lambda f: session.run(None, f)[0], inputs * 4))
    for position, result in enumerate(threaded):
        assert np.array_equal(result, serial[position % THREADS])
    reports = session.reports
    assert len(reports) == THREADS * 5
    assert all(r.tokens == 3 for r in reports)  # every run's routing made it into its report


def test_eight_sessions_in_parallel_match_one(model):
    reference = InferenceSession(model, shards=2).run(None, feeds(7))[0]

    def own_session(_):
        return InferenceSession(model, shards=2).run(None, feeds(7))[0]

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(own_session, range(THREADS)))
    assert all(np.array_equal(result, reference) for result in results)


def test_two_processes_saving_to_one_output_leave_a_consistent_pair(tmp_path, model):
    conversions = {shards: convert(model, shards=shards)[0] for shards in (2, 4)}
    out = tmp_path / "out.onnx"
    expected = InferenceSession(model, shards=1).run(None, feeds())[0]
    for _round in range(4):
        children = []
        for shards in (2, 4):
            pid = os.fork()
            if pid == 0:  # numpy-only work in the child (no ONNX Runtime after fork)
                code = 0
                try:
                    save_rewritten(conversions[shards], out, external=True)
                except BaseException:  # noqa: BLE001
                    code = 3
                os._exit(code)
            children.append(pid)
        for pid in children:
            _, status = os.waitpid(pid, 0)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        header = onnx.load(str(out), load_external_data=False)
        (shards,) = {parse_node(n).shards for n in header.graph.node if is_sharded_node(n)}
        assert shards in (2, 4)
        np.testing.assert_allclose(InferenceSession(out).run(None, feeds())[0], expected, rtol=1e-4, atol=1e-5)
        assert len(owned_data_files(out)) == 1
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(TEMP_SUFFIX)]
