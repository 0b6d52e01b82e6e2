"""Inputs built to exhaust a parser or a limit end as one line and exit 2 (CLI) or a typed error (API), and every
limit they hit is named in the message (issue 32, kinds 9 and 10; the limits: ndp_io/limits.py).

Each case failed before as a traceback: RecursionError (deep JSON/TOML), OverflowError (a TOML or CSV integer of
hundreds of digits), ONNX Runtime's raw InvalidArgument (a name or session key over its 8 KB), OSError (a path
over 4,096 bytes, a non-UTF-8 file name in a written report), AttributeError/ValueError/TypeError from the API.
"""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from hw_model.errors import CalibrationDataError, HardwareConfigError, WorkloadError
from hw_model.hardware import load_system
from hw_model.traces import load_trace
from hw_model.validate import load_measurements
from ndp_ep import InferenceSession, last_report, session_options
from ndp_ep.cli import main
from ndp_ep.errors import ModelLoadError, NdpEpError
from ndp_ep.genai import read_config
from ndp_io import limits

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "sample_models" / "moe_block.onnx"
PRESET = (REPO / "hw_model" / "presets" / "paper.toml").read_text(encoding="utf-8")
KERNEL_CSV = (REPO / "hw_model" / "calibration" / "h200" / "expert_ffn.csv").read_text(encoding="utf-8")
GENAI = REPO / "sample_models" / "genai" / "gpt_oss_int4"


def one_line(capsys, code: int, *named: str) -> str:
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ndp-ep") and "Traceback" not in err, err
    for text in named:
        assert text in lines[0], lines[0]
    return lines[0]


def _hw(tmp_path, text: str) -> Path:
    path = tmp_path / "hw.toml"
    path.write_text(text, encoding="utf-8")
    return path


HARDWARE = {
    "integer beyond float range": (
        lambda: PRESET.replace("memory_bandwidth_bytes_per_s = 960e9", "memory_bandwidth_bytes_per_s = 1" + "0" * 400),
        "gpu.memory_bandwidth_bytes_per_s",
    ),
    "arrays nested 1,000 deep": (
        lambda: PRESET.replace("num_ndp_units = 4\n", "num_ndp_units = 4\nx = " + "[" * 1000 + "]" * 1000 + "\n", 1),
        "MAX_PARSE_DEPTH",
    ),
    "a name over 8 KB": (
        lambda: re.sub(r'(?m)^name = ".*"$', lambda _: f'name = "{"n" * 9000}"', PRESET, count=1),
        "MAX_NAME_CHARS",
    ),
    "a subnormal bandwidth": (
        lambda: PRESET.replace("memory_bandwidth_bytes_per_s = 960e9", "memory_bandwidth_bytes_per_s = 5e-324"),
        "gpu.memory_bandwidth_bytes_per_s",
    ),
    "an integer of 5,000 digits": (
        lambda: PRESET.replace("memory_bandwidth_bytes_per_s = 960e9", "memory_bandwidth_bytes_per_s = " + "9" * 5000),
        "not valid TOML",
    ),
}


@pytest.mark.parametrize("case", sorted(HARDWARE))
def test_hostile_hardware_files(tmp_path, capsys, case):
    build, named = HARDWARE[case]
    path = _hw(tmp_path, build())
    with pytest.raises(HardwareConfigError, match=re.escape(named)):
        load_system(path)
    one_line(capsys, main(["run", str(MODEL), "--hw", str(path)]), named)


def test_a_hardware_file_with_a_byte_order_mark_is_read(tmp_path):
    assert load_system(_hw(tmp_path, "\ufeff" + PRESET)).gpu == load_system("paper").gpu


def test_hardware_that_is_a_directory_or_a_huge_name(tmp_path, capsys):
    one_line(capsys, main(["run", str(MODEL), "--hw", str(tmp_path)]), "is a directory")
    with pytest.raises(HardwareConfigError, match="MAX_PATH_BYTES"):
        InferenceSession(str(MODEL), hw="x" * 10_000)
    with pytest.raises(HardwareConfigError):
        InferenceSession(str(MODEL), hw="x" * 300)  # a file name over NAME_MAX: not OSError


def _csv(tmp_path, row_edit) -> Path:
    lines = KERNEL_CSV.splitlines()
    cells = lines[1].split(",")
    row_edit(cells)
    path = tmp_path / "kernels.csv"
    path.write_text("\n".join([lines[0], ",".join(cells), *lines[2:6]]) + "\n", encoding="utf-8")
    return path


CSV = {
    "a field over 128 KB": (lambda c: c.__setitem__(0, "k" * 200_000), "MAX_CSV_FIELD_BYTES"),
    "a 400-digit integer": (lambda c: c.__setitem__(2, "9" * 400), "MAX_CSV_INTEGER_DIGITS"),
    "a 5,000-character kind": (lambda c: c.__setitem__(0, "x" * 5000), "MAX_KIND_NAME_CHARS"),
    "a layer kind of 40-digit experts": (lambda c: c.__setitem__(0, f"moe_layer_e{'9' * 40}_k1"), "unknown kind"),
}


@pytest.mark.parametrize("case", sorted(CSV))
def test_hostile_validation_csvs(tmp_path, capsys, case):
    edit, named = CSV[case]
    path = _csv(tmp_path, edit)
    with pytest.raises(CalibrationDataError, match=named):
        load_measurements(path)
    one_line(capsys, main(["validate", "--data", str(path)]), named)


def test_a_validation_csv_with_a_byte_order_mark_is_read(tmp_path):
    plain, marked = tmp_path / "a.csv", tmp_path / "b.csv"
    plain.write_text(KERNEL_CSV, encoding="utf-8")
    marked.write_text("\ufeff" + KERNEL_CSV, encoding="utf-8")
    assert load_measurements(marked) == load_measurements(plain)


def _deep_json(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def test_a_deeply_nested_genai_config(tmp_path, capsys):
    folder = tmp_path / "in"
    shutil.copytree(GENAI, folder)
    config = json.loads((folder / "genai_config.json").read_text())
    config["search"] = json.loads(_deep_json(40))
    (folder / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="MAX_PARSE_DEPTH"):
        read_config(folder)
    (folder / "genai_config.json").write_text(_deep_json(100_000))  # RecursionError in json itself
    with pytest.raises(ModelLoadError, match="MAX_PARSE_DEPTH"):
        read_config(folder)
    one_line(capsys, main(["generate", str(folder)]), "MAX_PARSE_DEPTH")
    (tmp_path / "out").mkdir()
    one_line(
        capsys, main(["convert", str(folder / "model.onnx"), "-o", str(tmp_path / "out" / "m.onnx")]), "MAX_PARSE_DEPTH"
    )
    assert list((tmp_path / "out").iterdir()) == []


def test_hostile_routing_trace_files(tmp_path, capsys, monkeypatch):
    deep = tmp_path / "deep.json"
    deep.write_text(_deep_json(100_000))
    with pytest.raises(WorkloadError, match="MAX_PARSE_DEPTH"):
        load_trace(deep)
    one_line(capsys, main(["bench", "--quick", "--trace", str(deep)]), "MAX_PARSE_DEPTH")
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, expert_ids=np.zeros((1, 2, 1), np.int64), num_experts=np.arange(3), prompt_tokens=np.int64(1))
    with pytest.raises(WorkloadError, match="num_experts must be an integer"):
        load_trace(wrong)
    text = tmp_path / "text.json"
    text.write_text(json.dumps({"format": "ndp-ep-trace/1", "num_experts": "4", "prompt_tokens": 1, "expert_ids": []}))
    with pytest.raises(WorkloadError, match="num_experts"):
        load_trace(text)
    # a small archive whose header promises more than the limit: refused from the header, nothing inflated
    monkeypatch.setattr("hw_model.traces.MAX_TRACE_BYTES", 1 << 20)
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive, archive.open("expert_ids.npy", "w") as member:
        np.lib.format.write_array(member, np.zeros((4, 1 << 16, 2), np.int64))
    assert bomb.stat().st_size < 1 << 16
    with pytest.raises(WorkloadError, match="MAX_TRACE_BYTES"):
        load_trace(bomb)


def test_file_names_that_are_not_utf8(tmp_path, capsys):
    name = tmp_path / "m\udcff.onnx"  # the byte 0xff, as Python names it
    shutil.copy(MODEL, name)
    html, report = tmp_path / "r.html", tmp_path / "r.json"
    assert main(["diff", str(name), str(MODEL), "--html", str(html), "--json-out", str(report), "-q"]) == 0
    assert json.loads(report.read_text(encoding="utf-8"))["models"]["a"]["path"].endswith("m\udcff.onnx")
    assert "m\\udcff.onnx" in html.read_text(encoding="utf-8")
    folder = tmp_path / "g\udcffdir"
    shutil.copytree(GENAI, folder)
    one_line(capsys, main(["generate", str(folder)]), "UTF-8")


@pytest.mark.parametrize("command", ["convert", "diff-html", "run"])
def test_paths_over_4096_bytes(tmp_path, capsys, command):
    long = "a/" * 2100 + "x.onnx"
    argv = {
        "convert": ["convert", str(MODEL), "-o", long],
        "diff-html": ["diff", str(MODEL), str(MODEL), "--html", long],
        "run": ["run", long],
    }[command]
    line = one_line(capsys, main(argv))
    assert len(line) < 600  # the path is shortened in the message


def test_api_errors_are_of_documented_types():
    with pytest.raises(NdpEpError, match="sess_options"):
        InferenceSession(str(MODEL), sess_options=5)
    with pytest.raises(NdpEpError, match="input_shapes"):
        InferenceSession(str(MODEL), input_shapes={"hidden_states": [1, "a", 16]})
    with pytest.raises(NdpEpError, match="input_shapes"):
        InferenceSession(str(MODEL), input_shapes={"hidden_states": [1, 2.5, 16]})
    for not_a_session in (None, "model.onnx", 3):
        with pytest.raises(NdpEpError, match="expected an ndp_ep.InferenceSession"):
            last_report(not_a_session)
    with pytest.raises(NdpEpError, match="MAX_SESSION_KEY_CHARS"):
        session_options(session_key="k" * 10_000)


def test_every_limit_is_defined_once_and_named():
    names = [name for name in dir(limits) if name.startswith("MAX_")]
    assert len(names) >= 10
    for name in names:
        assert limits.limit_note(name) == f"(limit: {name} = {getattr(limits, name):,}, ndp_io/limits.py)"
