"""A model and its weights are replaced as one unit (issue 11, item 3).

Each test first converts the tiny model with 2 shards (the *old* pair), then saves a 4-shard conversion over
it while a fault hits the k-th file-system mutation (``os.open``, ``os.fsync``, ``os.replace``, ``os.unlink``)
of the save, for every k: an ``OSError`` in-process, ``os._exit`` in a forked child (a kill: no cleanup runs),
or SIGTERM/SIGINT delivered to a forked child. Afterwards the output must load and compute what the original
model computes, with the old or the new shard count, never a mix; no temporary file may remain once a later
save has run.
"""

from __future__ import annotations

import errno
import os
import signal

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from graph_passes.convert import convert
from graph_passes.model_io import owned_data_files, save_rewritten
from graph_passes.sharded_op import is_sharded_node, parse_node
from ndp_ep import InferenceSession
from ndp_io import TEMP_SUFFIX
from tests.reliability.conftest import feeds, tiny_model

MUTATIONS = ("open", "fsync", "replace", "unlink")


@pytest.fixture(scope="module")
def expected():
    model = tiny_model()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds())[0]


@pytest.fixture(scope="module")
def conversions():
    """The 2-shard and 4-shard in-memory conversions of the tiny model (lazy weights; saved many times)."""
    return {shards: convert(tiny_model(), shards=shards)[0] for shards in (2, 4)}


def _old_pair(directory, conversions):
    out = directory / "out.onnx"
    save_rewritten(conversions[2], out, external=True)
    return out


def _old_pair_per_step(tmp_path, conversions, mutation_count):
    """``(step, directory, out)`` for every mutation step (1-based): a fresh directory holding the old pair."""
    for step in range(1, mutation_count + 1):
        directory = tmp_path / f"step{step}"
        directory.mkdir()
        yield step, directory, _old_pair(directory, conversions)


def _state(out, expected) -> int:
    """The shard count of the model at ``out``, after checking it runs and computes the original outputs."""
    model = onnx.load(str(out), load_external_data=False)
    (shards,) = {parse_node(n).shards for n in model.graph.node if is_sharded_node(n)}
    (result,) = InferenceSession(out).run(None, feeds())
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-5)
    return shards


def _temp_files(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(TEMP_SUFFIX))


class _Faults:
    """Counts file-system mutations and runs ``action`` at the ``at``-th (1-based; 0 counts only)."""

    def __init__(self, monkeypatch, at: int, action) -> None:
        self.count, self.at, self.action = 0, at, action
        for name in MUTATIONS:
            original = getattr(os, name)
            monkeypatch.setattr(os, name, self._wrap(original))

    def _wrap(self, original):
        def wrapped(*args, **kwargs):
            self.count += 1
            if self.count == self.at:
                self.action()
            return original(*args, **kwargs)

        return wrapped


def _raise_eio():
    raise OSError(errno.EIO, "injected fault")


@pytest.fixture(scope="module")
def mutation_count(tmp_path_factory, conversions):
    """How many mutations a 4-shard save over the old pair makes (every one gets a fault below)."""
    directory = tmp_path_factory.mktemp("count")
    out = _old_pair(directory, conversions)
    with pytest.MonkeyPatch.context() as monkeypatch:
        faults = _Faults(monkeypatch, 0, None)
        save_rewritten(conversions[4], out, external=True)
    assert faults.count >= 6  # open/fsync/replace for data and model, then the old data's removal
    return faults.count


def test_an_error_at_any_step_leaves_the_old_or_the_new_pair(tmp_path, conversions, expected, mutation_count):
    outcomes = []
    for step, directory, out in _old_pair_per_step(tmp_path, conversions, mutation_count):
        with pytest.MonkeyPatch.context() as monkeypatch:
            _Faults(monkeypatch, step, _raise_eio)
            try:
                save_rewritten(conversions[4], out, external=True)
            except OSError:  # the typed OutputWriteError (a ValueError) or the raw injected error
                pass
            except ValueError:
                pass
        outcomes.append(_state(out, expected))
        assert _temp_files(directory) == []
    assert set(outcomes) == {2, 4}  # some faults hit before the model's rename, some after


def _in_child(action_at_step, step, conversions, out) -> int:
    """Fork; the child saves the 4-shard model with ``action_at_step`` at mutation ``step``; returns the status."""
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 0
        try:
            with pytest.MonkeyPatch.context() as monkeypatch:
                _Faults(monkeypatch, step, action_at_step)
                save_rewritten(conversions[4], out, external=True)
        except KeyboardInterrupt:
            code = 130
        except BaseException:  # noqa: BLE001
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def test_a_kill_at_any_step_leaves_the_old_or_the_new_pair(tmp_path, conversions, expected, mutation_count):
    outcomes = []
    for step, directory, out in _old_pair_per_step(tmp_path, conversions, mutation_count):
        status = _in_child(lambda: os._exit(137), step, conversions, out)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 137
        outcomes.append(_state(out, expected))
        # the next save cleans what the killed one left: no temporary file, one data file
        save_rewritten(conversions[2], out, external=True)
        assert _temp_files(directory) == []
        assert len(owned_data_files(out)) == 1
        assert _state(out, expected) == 2
    assert set(outcomes) == {2, 4}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_save_removes_the_temporary_files(tmp_path, conversions, expected, signum):
    out = _old_pair(tmp_path, conversions)
    # mutation 3 is the fsync of the staged data file: both temporary files may exist
    status = _in_child(lambda: os.kill(os.getpid(), signum), 3, conversions, out)
    if signum == signal.SIGTERM:
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
    else:
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 130
    assert _temp_files(tmp_path) == []
    assert _state(out, expected) == 2


def test_resaving_alternates_data_names_and_keeps_one_data_file(tmp_path, conversions, expected):
    out = tmp_path / "out.onnx"
    names = []
    for shards in (2, 4, 2):
        files = save_rewritten(conversions[shards], out, external=True)
        names.append(files[1].name)
        assert owned_data_files(out) == [files[1]]
        assert _state(out, expected) == shards
    assert names[0] == "out.onnx.data" and names[1] != names[0] and names[2] == "out.onnx.data"
    save_rewritten(conversions[4], out, external=False)  # an embedded model needs no data file
    assert owned_data_files(out) == []
    assert _state(out, expected) == 4
