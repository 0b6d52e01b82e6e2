"""Converting a model inside a GenAI folder never overwrites a user's file and never reads outside the model's
folder (issue 32, kinds 1 and 2).

The side files (tokenizer, templates, ...) go beside the output only where no other file of that name is (an
identical one, an earlier conversion's copy, is kept); the ``--hw`` file the command reads is never written; a
side file, the config or the decoder that is a link out of the model's folder is refused without being opened.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from ndp_ep.cli import main
from ndp_ep.errors import ModelLoadError
from ndp_ep.genai import read_config
from tests.reliability.conftest import digest

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "sample_models" / "genai" / "gpt_oss_int4"


@pytest.fixture
def folder(tmp_path) -> Path:
    source = tmp_path / "in"
    shutil.copytree(FIXTURE, source)
    (tmp_path / "out").mkdir()
    return source


def _convert(source: Path, output: Path, *extra: str) -> int:
    return main(["convert", str(source / "model.onnx"), "-o", str(output), *extra])


def test_a_users_same_named_file_is_not_overwritten(folder, tmp_path, capsys):
    mine = tmp_path / "out" / "tokenizer.json"
    mine.write_text("my own notes")
    assert _convert(folder, tmp_path / "out" / "model.onnx") == 2
    err = capsys.readouterr().err
    assert "tokenizer.json exists with other content" in err and len(err.strip().splitlines()) == 1
    assert mine.read_text() == "my own notes"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["tokenizer.json"]  # nothing else written


def test_the_hw_file_the_command_reads_is_never_written(folder, tmp_path, capsys):
    preset = (REPO / "hw_model" / "presets" / "paper.toml").read_text(encoding="utf-8")
    (folder / "hw.toml").write_text("# a side file of the model folder\n" + preset)
    hw = tmp_path / "out" / "hw.toml"
    hw.write_text(preset)
    before = digest(hw)
    assert _convert(folder, tmp_path / "out" / "model.onnx", "--hw", str(hw)) == 2
    assert digest(hw) == before
    assert "hw.toml" in capsys.readouterr().err


def test_identical_side_files_are_kept_and_a_conversion_again_succeeds(folder, tmp_path, capsys):
    output = tmp_path / "out" / "model.onnx"
    assert _convert(folder, output) == 0
    assert _convert(folder, output) == 0  # its own config and copies are there now
    config = json.loads((tmp_path / "out" / "genai_config.json").read_text())
    assert config["model"]["decoder"]["filename"] == "model.onnx"
    assert digest(tmp_path / "out" / "tokenizer.json") == digest(folder / "tokenizer.json")


def test_a_side_file_linking_out_of_the_folder_is_refused_unread(folder, tmp_path, capsys, opened_files):
    secret = tmp_path / "secret.txt"
    secret.write_text("password")
    (folder / "notes.txt").symlink_to(secret)
    opened_files.clear()  # from here on
    assert _convert(folder, tmp_path / "out" / "model.onnx") == 2
    assert "notes.txt is a link out of the model's folder" in capsys.readouterr().err
    assert str(secret) not in opened_files
    assert list((tmp_path / "out").iterdir()) == []


def test_links_inside_the_folder_are_followed(folder, tmp_path, capsys):
    (folder / "vocab.txt").symlink_to(folder / "tokenizer_config.json")
    assert _convert(folder, tmp_path / "out" / "model.onnx") == 0
    assert digest(tmp_path / "out" / "vocab.txt") == digest(folder / "tokenizer_config.json")
    assert not (tmp_path / "out" / "vocab.txt").is_symlink()


def test_a_fifo_or_device_beside_the_model_is_not_copied(folder, tmp_path, capsys):
    os.mkfifo(folder / "pipe")
    (folder / "zero").symlink_to(folder / "pipe")
    assert _convert(folder, tmp_path / "out" / "model.onnx") == 0  # would block forever if opened
    assert not (tmp_path / "out" / "pipe").exists() and not (tmp_path / "out" / "zero").exists()


@pytest.mark.parametrize("which", ["genai_config.json", "model.onnx"])
def test_a_config_or_decoder_linking_out_of_the_folder_is_refused(folder, tmp_path, which, capsys):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.move(folder / which, outside / which)
    (folder / which).symlink_to(outside / which)
    with pytest.raises(ModelLoadError, match="link out of the model folder"):
        read_config(folder)
    assert main(["generate", str(folder)]) == 2
    if which == "genai_config.json":  # convert reads the config too
        assert _convert(folder, tmp_path / "out" / "model.onnx") == 2
        assert list((tmp_path / "out").iterdir()) == []
