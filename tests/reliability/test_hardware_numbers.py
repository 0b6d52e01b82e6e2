"""Numbers of a hardware TOML file beyond float range: a one-line HardwareConfigError naming the field, never
an OverflowError (TOML integers have no size limit; every such field is used as a float), and an integer of more
digits than Python converts (4,300) is "not valid TOML", never a ValueError traceback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hw_model.errors import HardwareConfigError
from hw_model.hardware import load_system

PAPER = Path(__file__).resolve().parents[2] / "hw_model" / "presets" / "paper.toml"
NUMBER_LINE = re.compile(r"^(\s*([A-Za-z0-9_]+)\s*=\s*)([-+0-9.eE_]+)\s*$")


def _numeric_fields() -> list[int]:
    return [i for i, line in enumerate(PAPER.read_text(encoding="utf-8").splitlines()) if NUMBER_LINE.match(line)]


def _with_value(tmp_path: Path, index: int, value: str) -> tuple[Path, str]:
    lines = PAPER.read_text(encoding="utf-8").splitlines()
    match = NUMBER_LINE.match(lines[index])
    assert match is not None
    lines[index] = match.group(1) + value
    path = tmp_path / "hw.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, match.group(2)


@pytest.mark.parametrize("sign", ["", "-"])
def test_every_number_beyond_float_range_is_a_hardware_error_or_taken(tmp_path, sign):
    fields = _numeric_fields()
    assert len(fields) > 20  # the preset's numbers, every section
    refused = 0
    for index in fields:
        path, name = _with_value(tmp_path, index, sign + "1" + "0" * 400)
        try:
            load_system(str(path))
        except HardwareConfigError as exc:
            message = str(exc)
            assert name in message and "\n" not in message and len(message) < 300, message
            refused += 1
        # an integer field that accepts any size (a tile of rows) is taken: no other exception either way
    assert refused >= len(fields) - 2


def test_a_bandwidth_beyond_float_range_says_so(tmp_path):
    index = next(
        i
        for i in _numeric_fields()
        if PAPER.read_text(encoding="utf-8").splitlines()[i].startswith("memory_bandwidth_bytes_per_s")
    )
    path, _ = _with_value(tmp_path, index, "1" + "0" * 400)
    with pytest.raises(HardwareConfigError, match=r"gpu\.memory_bandwidth_bytes_per_s must be a positive number, "
                       r"got an integer of about 401 digits \(beyond float range\)"):  # fmt: skip
        load_system(str(path))


def test_ndp_unit_ranks_are_bounded(tmp_path):
    index = next(i for i in _numeric_fields() if PAPER.read_text(encoding="utf-8").splitlines()[i].startswith("ranks"))
    for value in ("65", "1" + "0" * 30):
        path, _ = _with_value(tmp_path, index, value)
        with pytest.raises(HardwareConfigError, match="ndp_unit.ranks must be an integer from 1 to 64"):
            load_system(str(path))


def test_an_integer_too_long_to_convert_is_not_valid_toml(tmp_path, cli):
    path, _ = _with_value(tmp_path, _numeric_fields()[0], "1" + "0" * 5000)
    with pytest.raises(HardwareConfigError, match="not valid TOML"):
        load_system(str(path))
    model = Path(__file__).resolve().parents[2] / "sample_models" / "moe_decoder.onnx"
    for value in ("1" + "0" * 5000, "1" + "0" * 400):
        path, _ = _with_value(tmp_path, _numeric_fields()[0], value)
        done = cli("run", str(model), "--hw", str(path))
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("ndp-ep run: error: "), done.stderr
