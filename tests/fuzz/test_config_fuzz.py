"""Fuzz (c): mutated configuration and data files never cause a traceback (issue 32).

Seeded, generated mutations of the files ndp-ep reads besides models — ``genai_config.json``, hardware TOML,
sweep grid TOML, validation CSVs and routing-trace files (JSON and ``.npz``) — each loaded by the API that
reads it (and a few through the CLI). Every outcome must be a success or the documented typed error
(``hw_model.errors.HwModelError``, ``ndp_ep.errors.NdpEpError``, ``ndp_io.FileSafetyError``); any other
exception fails the test and names the seed and the mutation. The mutations: a value replaced by a hostile
literal (integers of 400 and 5,000 digits, NaN, infinities, 5e-324, 10 KB strings, escape sequences, arrays
nested 40 and 1,000 deep, wrong types), a line or key dropped or duplicated, an unknown key, a byte-order mark,
truncation and flipped bytes. Sizes are bounded (every file < 64 KB but the ones built to exceed a limit).

``NDP_FUZZ_CONFIGS`` sets the examples per file kind (default 60; ``NDP_FUZZ_CONFIGS=2000`` locally).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from hw_model.errors import HwModelError
from ndp_ep.errors import NdpEpError
from ndp_io import FileSafetyError

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("NDP_FUZZ_CONFIGS", "60"))
TYPED = (HwModelError, NdpEpError, FileSafetyError)
GENAI = REPO / "sample_models" / "genai" / "gpt_oss_int4"
PRESET = REPO / "hw_model" / "presets" / "paper.toml"
GRID = REPO / "docs" / "sweep_example.toml"
KERNEL_CSV = REPO / "hw_model" / "calibration" / "h200" / "expert_ffn.csv"

TOML_VALUES = [
    "1" + "0" * 400,
    "9" * 5000,
    "-1",
    "0",
    "nan",
    "inf",
    "-inf",
    "5e-324",
    "1e308",
    '""',
    '"' + "x" * 10_000 + '"',
    '"\\u001b]0;t\\u0007\\u001b[2J"',
    "[" * 40 + "]" * 40,
    "[" * 1000 + "]" * 1000,
    "true",
    "[1, 2, 3]",
    "[]",
    "{a = 1}",
    '"paper"',
    "1.5",
    "0.999999",
    "1e-30",
]
JSON_VALUES = [
    10**400,
    -1,
    0,
    float("nan"),
    float("inf"),
    5e-324,
    "",
    "x" * 10_000,
    "\x1b]0;t\x07",
    "../../etc/passwd",
    "/etc/passwd",
    "a\x00b",
    True,
    None,
    [],
    {},
    [1, 2],
    {"a": 1},
]
CSV_VALUES = ["", "-1", "0", "nan", "inf", "1e400", "5e-324", "9" * 400, "k" * 200_000, "x" * 5000, "\x1b[2J", '"']


def _text_mutation(rng: np.random.Generator, text: str, values: list[str]) -> tuple[str, str]:
    """``text`` with one mutation applied (and a description of it)."""
    lines = text.splitlines()
    assignments = [i for i, line in enumerate(lines) if re.match(r"^\s*[A-Za-z_][\w.]*\s*=", line)]
    choice = int(rng.integers(8))
    if choice <= 2 and assignments:  # a value replaced (the most common mutation)
        i = int(rng.choice(assignments))
        value = values[int(rng.integers(len(values)))]
        lines[i] = lines[i].split("=", 1)[0] + "= " + value
        return "\n".join(lines) + "\n", f"line {i + 1} = {value[:40]!r}"
    if choice == 3 and lines:
        i = int(rng.integers(len(lines)))
        del lines[i]
        return "\n".join(lines) + "\n", f"line {i + 1} dropped"
    if choice == 4 and lines:
        i = int(rng.integers(len(lines)))
        lines.insert(i, lines[i])
        return "\n".join(lines) + "\n", f"line {i + 1} duplicated"
    if choice == 5:
        return "\ufeff" + text, "byte-order mark"
    if choice == 6:
        cut = int(rng.integers(len(text) + 1))
        return text[:cut], f"truncated at {cut}"
    data = bytearray(text.encode("utf-8"))
    for _ in range(int(rng.integers(1, 4))):
        data[int(rng.integers(len(data)))] = int(rng.integers(256))
    return data.decode("utf-8", errors="surrogateescape"), "bytes flipped"


def _write(path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8", errors="surrogateescape"))


def _expect_typed(call, what: str) -> object:
    try:
        return call()
    except TYPED:
        return None
    except Exception as exc:  # noqa: BLE001 - the finding: report the case
        pytest.fail(f"{what}: {type(exc).__name__}: {str(exc)[:300]}")


def _json_paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _json_paths(child, (*prefix, key))


def _set(document, path, value):
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


@pytest.mark.parametrize("seed", range(EXAMPLES))
def test_genai_config(tmp_path, seed):
    from ndp_ep.commands.generate import check_fits
    from ndp_ep.genai import GENAI_CONFIG, read_config

    rng = np.random.default_rng(seed)
    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("genai_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(GENAI / name, folder / name)
    (folder / "model.onnx").write_bytes(b"")  # the decoder must be a file; its content is not read here
    original = json.loads((GENAI / GENAI_CONFIG).read_text())
    if rng.random() < 0.6:
        paths = [p for p in _json_paths(original) if p]
        path = paths[int(rng.integers(len(paths)))]
        value = JSON_VALUES[int(rng.integers(len(JSON_VALUES)))]
        document = json.loads(json.dumps(original))
        if rng.random() < 0.2:
            value = json.loads('{"a": ' * 60 + "1" + "}" * 60)
        _set(document, path, value)
        text, what = json.dumps(document), f"{'.'.join(path)} = {str(value)[:40]!r}"
    else:
        text, what = _text_mutation(rng, json.dumps(original, indent=1), [json.dumps(v)[:20_000] for v in JSON_VALUES])
    _write(folder / GENAI_CONFIG, text)
    config = _expect_typed(lambda: read_config(folder), f"seed {seed}: {what}")
    if config is not None:
        _expect_typed(lambda: check_fits(folder, config, 4, 2), f"seed {seed} (check_fits): {what}")


@pytest.mark.parametrize("seed", range(EXAMPLES))
def test_hardware_toml(tmp_path, seed, capsys):
    from hw_model.hardware import load_system
    from hw_model.settings import SimulationSettings

    rng = np.random.default_rng(1000 + seed)
    text, what = _text_mutation(rng, PRESET.read_text(encoding="utf-8"), TOML_VALUES)
    path = tmp_path / "hw.toml"
    _write(path, text)
    system = _expect_typed(lambda: load_system(path), f"seed {seed}: {what}")
    if system is not None:
        _expect_typed(lambda: SimulationSettings(hw=str(path)), f"seed {seed} (settings): {what}")
    if system is not None and seed % 6 == 0:  # a few that load are run end to end
        from ndp_ep.cli import main

        code = main(["run", str(REPO / "sample_models" / "moe_block.onnx"), "--hw", str(path)])
        err = capsys.readouterr().err
        assert code in (0, 2) and "Traceback" not in err, f"seed {seed}: {what}: {err[-500:]}"


@pytest.mark.xfail(reason="the grid loader's fixes land after hw_model/sweep.py's split (issue 32 item 5)")
@pytest.mark.parametrize("seed", range(EXAMPLES))
def test_sweep_grid(tmp_path, seed):
    from hw_model.sweep import load_grid

    rng = np.random.default_rng(2000 + seed)
    text, what = _text_mutation(rng, GRID.read_text(encoding="utf-8"), TOML_VALUES)
    path = tmp_path / "grid.toml"
    _write(path, text)
    _expect_typed(lambda: load_grid(path), f"seed {seed}: {what}")


@pytest.mark.parametrize("seed", range(EXAMPLES))
def test_validation_csv(tmp_path, seed):
    from hw_model.hardware import load_system
    from hw_model.validate import load_measurements, validate

    rng = np.random.default_rng(3000 + seed)
    lines = KERNEL_CSV.read_text(encoding="utf-8").splitlines()[:12]
    if rng.random() < 0.6:
        row = int(rng.integers(1, len(lines)))
        cells = lines[row].split(",")
        column = int(rng.integers(len(cells)))
        cells[column] = CSV_VALUES[int(rng.integers(len(CSV_VALUES)))]
        if rng.random() < 0.2:
            cells[0] = f"moe_layer_e{int(rng.integers(0, 10**6))}_k{int(rng.integers(0, 10**6))}"
        lines[row] = ",".join(cells)
        text, what = "\n".join(lines) + "\n", f"row {row} column {column} = {cells[column][:40]!r}"
    else:
        text, what = _text_mutation(rng, "\n".join(lines) + "\n", CSV_VALUES)
    path = tmp_path / "kernels.csv"
    _write(path, text)
    rows = _expect_typed(lambda: load_measurements(path), f"seed {seed}: {what}")
    if rows:
        _expect_typed(lambda: validate(load_system("h200"), rows), f"seed {seed} (validate): {what}")


@pytest.mark.parametrize("seed", range(EXAMPLES))
def test_routing_trace(tmp_path, seed):
    from hw_model.traces import load_trace

    rng = np.random.default_rng(4000 + seed)
    ids = np.stack([np.stack([rng.permutation(8)[:2] for _ in range(5)]) for _ in range(3)]).astype(np.int64)
    fields = {"num_experts": 8, "prompt_tokens": 2, "expert_ids": ids}
    key = ["num_experts", "prompt_tokens", "expert_ids"][int(rng.integers(3))]
    hostile = [
        10**400,
        -1,
        "8",
        None,
        2.5,
        [[[1, 1]]],
        np.zeros((2, 2), np.float32),
        np.arange(3),
        np.zeros((1, 1, 1), np.uint64) + 2**63,
        np.array([1, 2], dtype=object),
    ]
    value = hostile[int(rng.integers(len(hostile)))]
    fields[key] = value
    what = f"{key} = {str(value)[:40]!r}"
    if seed % 2:  # JSON

        def plain(v):
            return v.tolist() if isinstance(v, np.ndarray) else v

        doc = {"format": "ndp-ep-trace/1", **{k: plain(v) for k, v in fields.items()}}
        path = tmp_path / "trace.json"
        try:
            text = json.dumps(doc)
        except TypeError:
            text = json.dumps({**doc, key: str(value)})
        if rng.random() < 0.3:
            text, extra = _text_mutation(
                rng, text, [json.dumps(v) if not isinstance(v, np.ndarray) else "[]" for v in hostile[:6]]
            )
            what += f", {extra}"
        _write(path, text)
    else:
        path = tmp_path / "trace.npz"
        arrays = {
            k: np.asarray(v, dtype=object if v is None or isinstance(v, int) and abs(v) > 2**62 else None)
            for k, v in fields.items()
        }
        np.savez(path, **arrays)
    _expect_typed(lambda: load_trace(path), f"seed {seed}: {what}")
