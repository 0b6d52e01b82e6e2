"""A full disk (ENOSPC) at any write of a conversion leaves the old state or nothing (issue 32, kind 7).

The fault is an ``OSError(ENOSPC)`` raised by the k-th ``os.fsync`` or ``os.replace`` of the save (where a full
disk shows: buffered bytes reach the disk at the fsync), for every k the save makes. After each:

* a fresh conversion with external data leaves neither ``OUT`` nor any ``OUT*.data`` (before: ``OUT.data``
  without ``OUT``), or else the complete pair;
* over an existing pair no orphan ``OUT.<hex>.data`` remains and the model there still runs;
* a GenAI folder conversion leaves the model with its ``genai_config.json``, or no new file at all.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import onnx
import pytest

from graph_passes.model_io import owned_data_files
from ndp_ep.cli import main
from ndp_io import TEMP_SUFFIX
from tests.reliability.conftest import save_external, tiny_model

REPO = Path(__file__).resolve().parents[2]
GENAI = REPO / "sample_models" / "genai" / "gpt_oss_int4"
FAULTS = ("fsync", "replace")


class _FullDisk:
    """Counts ``os.fsync`` / ``os.replace`` calls; the ``at``-th (1-based; 0: none) raises ENOSPC."""

    def __init__(self, monkeypatch, at: int) -> None:
        self.count, self.at = 0, at
        for name in FAULTS:
            monkeypatch.setattr(os, name, self._wrap(getattr(os, name)))

    def _wrap(self, original):
        def call(*args, **kwargs):
            self.count += 1
            if self.count == self.at:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return original(*args, **kwargs)

        return call


def _convert(source: Path, output: Path) -> int:
    return main(["convert", str(source), "-o", str(output), "--external-data"])


def _calls(monkeypatch, source: Path, output: Path) -> int:
    """How many faultable calls a successful conversion makes (into a throwaway folder)."""
    with monkeypatch.context() as patch:
        counter = _FullDisk(patch, 0)
        assert _convert(source, output) == 0
    return counter.count


def _references(model_path: Path) -> set[str]:
    model = onnx.load(str(model_path), load_external_data=False)
    return {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}


def _no_temp_files(folder: Path) -> None:
    assert not [p for p in folder.iterdir() if p.name.endswith(TEMP_SUFFIX)]


@pytest.fixture
def source(tmp_path) -> Path:
    return save_external(tiny_model(), tmp_path / "model" / "moe.onnx")


def test_a_fresh_conversion_leaves_the_pair_or_nothing(tmp_path, monkeypatch, capsys, source):
    total = _calls(monkeypatch, source, tmp_path / "probe.onnx")
    assert total >= 3
    for at in range(1, total + 1):
        folder = tmp_path / f"fresh{at}"
        folder.mkdir()
        output = folder / "out.onnx"
        with monkeypatch.context() as patch:
            _FullDisk(patch, at)
            code = _convert(source, output)
        capsys.readouterr()
        data = owned_data_files(output)
        if output.exists():
            assert _references(output) == {p.name for p in data}, at
        else:
            assert code == 2 and data == [], (at, data)
        _no_temp_files(folder)


def test_over_an_existing_pair_no_orphan_data_file_remains(tmp_path, monkeypatch, capsys, source):
    total = _calls(monkeypatch, source, tmp_path / "probe.onnx")
    for at in range(1, total + 1):
        folder = tmp_path / f"over{at}"
        folder.mkdir()
        output = folder / "out.onnx"
        assert _convert(source, output) == 0
        with monkeypatch.context() as patch:
            _FullDisk(patch, at)
            _convert(source, output)
        capsys.readouterr()
        assert _references(output) == {p.name for p in owned_data_files(output)}, at
        assert main(["run", str(output)]) == 0
        capsys.readouterr()
        _no_temp_files(folder)


def test_a_genai_folder_conversion_is_all_or_nothing(tmp_path, monkeypatch, capsys):
    source = tmp_path / "in"
    shutil.copytree(GENAI, source)
    probe = tmp_path / "probe"
    probe.mkdir()
    total = _calls(monkeypatch, source / "model.onnx", probe / "model.onnx")
    for at in range(1, total + 1):
        folder = tmp_path / f"g{at}"
        folder.mkdir()
        with monkeypatch.context() as patch:
            _FullDisk(patch, at)
            code = _convert(source / "model.onnx", folder / "model.onnx")
        capsys.readouterr()
        names = sorted(p.name for p in folder.iterdir())
        if code == 0 or (folder / "model.onnx").exists():
            assert {"model.onnx", "genai_config.json", "tokenizer.json"} <= set(names), (at, names)
        else:
            assert names == [], (at, names)
