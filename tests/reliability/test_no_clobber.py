"""No command ever writes over one of its inputs (issue 11, item 2): checked before anything is written."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from ndp_ep import convert_model
from ndp_ep.cli import main
from ndp_ep.errors import ConversionError
from ndp_io import ClobberError, check_no_clobber
from tests.reliability.conftest import digest, feeds


def _snapshot(directory):
    return {p.name: digest(p) for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture
def workdir(external_model):
    directory = external_model.parent
    np.savez(directory / "feeds.npz", **feeds())
    return directory


def _one_line_exit_2(capsys, argv, command):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ndp-ep {command}: error:") and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "output",
    [
        "moe.onnx",  # the model itself
        "weights.bin",  # its external-data file
        "hardlink.onnx",  # another name of the model
        "symlink.onnx",  # a link to the model
    ],
)
def test_convert_refuses_to_write_over_its_input(workdir, capsys, output):
    os.link(workdir / "moe.onnx", workdir / "hardlink.onnx")
    (workdir / "symlink.onnx").symlink_to(workdir / "moe.onnx")
    before = _snapshot(workdir)
    err = _one_line_exit_2(capsys, ["convert", str(workdir / "moe.onnx"), "-o", str(workdir / output)], "convert")
    assert "overwrite the input" in err
    assert _snapshot(workdir) == before


def test_convert_refuses_an_output_whose_data_file_is_the_inputs_weights(tmp_path, capsys):
    from tests.reliability.conftest import save_external, tiny_model

    model = save_external(tiny_model(), tmp_path / "m.onnx", location="X.onnx.data")
    before = _snapshot(tmp_path)
    with pytest.raises(ConversionError, match="X.onnx.data"):
        convert_model(model, tmp_path / "X.onnx", shards=2)
    assert _snapshot(tmp_path) == before


def _run_argv(workdir, option: str, target: str) -> list[str]:
    """``ndp-ep run`` of the work directory's model on its feeds, writing ``option`` to ``target``."""
    return ["run", str(workdir / "moe.onnx"), "--inputs", str(workdir / "feeds.npz"), option, str(workdir / target)]


@pytest.mark.parametrize("target", ["moe.onnx", "weights.bin", "feeds.npz"])
@pytest.mark.parametrize("option", ["--outputs", "--trace"])
def test_run_refuses_outputs_or_a_trace_over_model_data_or_feeds(workdir, capsys, option, target):
    before = _snapshot(workdir)
    _one_line_exit_2(capsys, _run_argv(workdir, option, target), "run")
    assert _snapshot(workdir) == before


@pytest.mark.parametrize("target", ["moe.onnx", "weights.bin", "other.onnx"])
@pytest.mark.parametrize("option", ["--html", "--json-out"])
def test_diff_refuses_html_over_either_model(workdir, capsys, target, option):
    (workdir / "other.onnx").write_bytes((workdir / "moe.onnx").read_bytes())
    before = _snapshot(workdir)
    argv = ["diff", str(workdir / "moe.onnx"), str(workdir / "other.onnx"), option, str(workdir / target)]
    _one_line_exit_2(capsys, argv, "diff")
    assert _snapshot(workdir) == before


def test_run_writes_outputs_next_to_inputs_when_the_name_differs(workdir, capsys):
    argv = _run_argv(workdir, "--outputs", "o.npz")
    assert main(argv) == 0
    capsys.readouterr()
    names = [o.name for o in onnx.load(str(workdir / "moe.onnx"), load_external_data=False).graph.output]
    assert np.load(workdir / "o.npz").files == names


def test_check_no_clobber_compares_real_files(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"a")
    check_no_clobber([b], [a])  # a new file: fine
    check_no_clobber([a], [tmp_path / "missing"])  # an input that does not exist cannot be destroyed
    os.link(a, tmp_path / "hard")
    (tmp_path / "soft").symlink_to(a)
    for alias in (a, tmp_path / "hard", tmp_path / "soft", tmp_path / "." / "a"):
        with pytest.raises(ClobberError):
            check_no_clobber([alias], [a])
    with pytest.raises(ClobberError, match="same file"):
        check_no_clobber([b, tmp_path / "." / "b"], [a])
    check_no_clobber([None, b], [None, a])


def test_a_hardware_file_is_an_input_too(workdir, capsys, repo_root):
    toml = workdir / "hw.toml"
    toml.write_bytes((repo_root / "hw_model" / "presets" / "paper.toml").read_bytes())
    before = _snapshot(workdir)
    argv = ["run", str(workdir / "moe.onnx"), "--hw", str(toml), "--outputs", str(toml)]
    _one_line_exit_2(capsys, argv, "run")
    with pytest.raises(ConversionError, match="overwrite the input"):
        convert_model(workdir / "moe.onnx", toml, hw=toml, shards=2)
    assert _snapshot(workdir) == before
