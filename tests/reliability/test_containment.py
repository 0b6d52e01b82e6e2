"""External data is read only from inside the model's folder, by every entry point (issue 11, item 1)."""

from __future__ import annotations

import os

import pytest

from graph_passes.errors import InvalidModelError, UnsafeModelError
from graph_passes.tensors import external_data_path
from ndp_ep import InferenceSession, convert_model
from ndp_ep.cli import main
from ndp_ep.diff import diff_models
from ndp_ep.errors import ConversionError, ModelLoadError, NdpEpError
from tests.reliability.conftest import digest, feeds


def _assert_secret_unread(opened, secret):
    assert os.path.realpath(secret) not in opened


def test_convert_model_refuses_every_escape_and_writes_nothing(hostile_model, tmp_path, opened_files):
    model, secret, form = hostile_model
    out = tmp_path / "out" / "converted.onnx"
    out.parent.mkdir()
    with pytest.raises((ModelLoadError, ConversionError)) as caught:
        convert_model(model, out, shards=2)
    expected = "loop" if form == "symlink_loop" else ("absolute" if form == "absolute" else "directory")
    assert expected in str(caught.value)
    assert list(out.parent.iterdir()) == []
    _assert_secret_unread(opened_files, secret)


def test_inference_session_refuses_every_escape(hostile_model, opened_files):
    model, secret, _ = hostile_model
    with pytest.raises(ModelLoadError):
        InferenceSession(model, shards=2)
    _assert_secret_unread(opened_files, secret)


def test_session_on_a_converted_model_refuses_an_escape(external_model, tmp_path, opened_files):
    out = tmp_path / "conv" / "converted.onnx"
    out.parent.mkdir()
    files = convert_model(external_model, out, shards=2, external_data=True).files
    data = files[1]
    secret = tmp_path / "secret.bin"
    os.replace(data, secret)
    data.symlink_to(secret)
    opened_files.clear()
    with pytest.raises(ModelLoadError, match="out of the model's directory"):
        InferenceSession(out)
    _assert_secret_unread(opened_files, secret)


def test_diff_refuses_every_escape(hostile_model, external_model, opened_files):
    model, secret, _ = hostile_model
    with pytest.raises(NdpEpError):
        diff_models(model, model)
    _assert_secret_unread(opened_files, secret)


@pytest.mark.parametrize("command", ["convert", "run", "diff"])
def test_cli_says_one_line_and_exits_2(hostile_model, tmp_path, capsys, command, opened_files):
    model, secret, _ = hostile_model
    before = digest(secret)
    opened_files.clear()
    argv = {
        "convert": ["convert", str(model), "-o", str(tmp_path / "o.onnx")],
        "run": ["run", str(model)],
        "diff": ["diff", str(model), str(model)],
    }[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ndp-ep {command}: error:")
    assert "Traceback" not in err
    _assert_secret_unread(opened_files, secret)
    assert digest(secret) == before  # and nothing written over it


def test_a_model_in_its_folder_still_loads(external_model, opened_files):
    session = InferenceSession(external_model, shards=2)
    (out,) = session.run(None, feeds())
    assert out.shape == (1, 3, 16)
    assert all(p.startswith(os.path.realpath(external_model.parent)) for p in opened_files if p.endswith(".bin"))


@pytest.mark.parametrize(
    ("location", "error", "words"),
    [
        ("../x.bin", UnsafeModelError, "leaves"),
        ("sub/../../x.bin", UnsafeModelError, "leaves"),
        ("/etc/passwd", UnsafeModelError, "absolute"),
        ("C:\\x.bin", UnsafeModelError, "absolute"),
        ("..\\x.bin", UnsafeModelError, "leaves"),
        ("", InvalidModelError, "not a file name"),
        ("missing.bin", InvalidModelError, "not found"),
        ("sub", InvalidModelError, "not a regular file"),
    ],
)
def test_external_data_path_rejects_each_form(tmp_path, location, error, words):
    (tmp_path / "sub").mkdir()
    (tmp_path.parent / "x.bin").write_bytes(b"0")
    with pytest.raises(error, match=words):
        external_data_path(tmp_path, location, "w")


def test_external_data_path_allows_symlinks_that_stay_inside(tmp_path):
    (tmp_path / "real.bin").write_bytes(b"1234")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "link.bin").symlink_to(tmp_path / "real.bin")
    assert external_data_path(tmp_path, "sub/link.bin") == (tmp_path / "real.bin").resolve()
