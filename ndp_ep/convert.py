"""``ndp_ep.convert_model``: rewrite a model's MoE blocks into sharded expert ops and save it atomically.

A model inside an ONNX Runtime GenAI folder (``genai_config.json`` beside it) stays a GenAI folder: the
config, tokenizer and other side files are copied beside the output, with ``decoder.filename`` pointing at
the converted model, so ``onnxruntime_genai.Model(output_dir)`` loads the converted model.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import onnx

from graph_passes.convert import BackgroundChecks, ConversionReport, convert
from graph_passes.model_io import CommitRefused, output_files, save_rewritten
from graph_passes.sharded_op import DOMAIN, OP_TYPE, is_sharded_node
from hw_model.hardware import SystemSpec
from hw_model.settings import SimulationSettings
from ndp_ep.errors import ConversionError, graph_pass_errors
from ndp_ep.partition import annotate_placement
from ndp_ep.text import plural
from ndp_io import FileSafetyError, atomic_write, check_no_clobber, check_output_path, write_text


@dataclass(frozen=True)
class ConversionResult:
    report: ConversionReport
    files: tuple[Path, ...]
    system: SystemSpec
    shards: int
    already_converted: int = 0  # sharded expert ops the input already held (nothing left to convert)

    def to_json(self) -> dict:
        return {
            "hardware": self.system.name,
            "ndp_units": self.system.num_ndp_units,
            "shards": self.shards,
            "files": [str(f) for f in self.files],
            "already_converted": self.already_converted,
            **self.report.to_json(),
        }


def convert_model(
    source: str | Path | bytes | onnx.ModelProto,
    output_path: str | Path,
    *,
    settings: SimulationSettings | None = None,
    hw: str | Path | SystemSpec | None = None,
    ndp_units: int | None = None,
    shards: int | None = None,
    strict: bool = False,
    external_data: bool | None = None,
) -> ConversionResult:
    """Convert ``source`` and write it to ``output_path`` (weights to ``<output>.data`` when large).

    ``source`` is a path, serialized bytes or an ``onnx.ModelProto``, as :class:`ndp_ep.InferenceSession` takes.
    The experts are placed under ``settings`` (a :class:`hw_model.SimulationSettings`; or ``hw``, default ``paper``,
    and ``ndp_units``, as for :class:`ndp_ep.InferenceSession`). ``shards`` defaults to the number of NDP units.
    Raises :class:`hw_model.SettingsError` for an ``ndp_units`` outside 1 to 64, :class:`NdpEpError` for a shard
    count or a system's unit count below 1 (the experts are placed on the NDP units, so the system needs one,
    even with ``shards`` given), :class:`ModelLoadError` for an input that is missing or not ONNX and
    :class:`ConversionError` when ``strict`` and a block was skipped or none was converted.
    """
    from ndp_ep.ep import check_positive, settings_of
    from ndp_ep.session import model_source

    source = model_source(source)
    settings = settings_of(settings, hw=hw, ndp_units=ndp_units)
    system = settings.system
    check_positive("shards", shards)
    check_positive(
        f"num_ndp_units of {system.name!r} (conversion places the experts on the NDP units)", system.num_ndp_units
    )
    output_path = Path(output_path)
    inputs = [] if isinstance(source, onnx.ModelProto) else [Path(source)]
    if isinstance(settings.hw, str | os.PathLike):  # a hardware TOML file is an input too (a preset name matches
        inputs.append(Path(settings.hw))  # no file)
    try:  # never clobber an input: checked before any work, and again with the input's data files
        check_output_path(output_path)
        check_no_clobber(output_files(output_path), inputs)
    except FileSafetyError as exc:
        raise ConversionError(str(exc)) from None
    genai = None if isinstance(source, onnx.ModelProto) else genai_folder_config(Path(source), output_path)
    requested = shards if shards is not None else system.num_ndp_units
    with graph_pass_errors():
        # the numeric checks of blocks too large to check whole run while the conversion is written
        rewritten, report = convert(source, shards=requested, strict=strict, defer_checks=True)
    already = 0 if report.blocks else sum(1 for node in rewritten.model.graph.node if is_sharded_node(node))
    if strict and not report.blocks:
        name = "the model" if isinstance(source, onnx.ModelProto) else str(source)
        found = (
            f"{name} is already converted ({plural(already, f'{DOMAIN}::{OP_TYPE} node')})"
            if already
            else "no MoE block found"
        )
        raise ConversionError(f"strict: nothing to convert: {found}")
    checks = BackgroundChecks(report)

    def confirmed() -> bool:
        with graph_pass_errors():
            return checks.settled() is not None

    try:
        files = _save(rewritten, output_path, settings, inputs, external_data, confirmed)
        report = checks.settled()
    except CommitRefused:  # a check did not confirm the reading a block was rewritten on: convert again, checked
        with graph_pass_errors():
            rewritten, report = convert(source, shards=requested, strict=strict)
        files = _save(rewritten, output_path, settings, inputs, external_data, None)
    if genai is not None:
        files = [*files, *copy_genai_folder(Path(source), output_path, genai, list(files))]
    return ConversionResult(report, tuple(files), system, requested, already)


def _save(rewritten, output_path: Path, settings: SimulationSettings, inputs: list[Path], external_data, before_commit):
    """Annotate the placement and write ``rewritten`` (``before_commit``: see :func:`save_rewritten`)."""
    annotate_placement(rewritten.model, settings.system, settings.policy)
    data_files = rewritten.store.data_files if rewritten.store is not None else []
    try:
        check_no_clobber(output_files(output_path), [*inputs, *data_files])
        return save_rewritten(rewritten, output_path, external=external_data, before_commit=before_commit)
    except FileSafetyError as exc:
        raise ConversionError(str(exc)) from None


GENAI_CONFIG = "genai_config.json"
NOT_COPIED_SUFFIXES = (".onnx", ".onnx.data", ".data", ".npz")


def genai_folder_config(source: Path, output: Path) -> dict | None:
    """The GenAI config to write beside ``output`` (``decoder.filename`` pointing at it), or None.

    None without a ``genai_config.json`` beside ``source`` or when the output is in the same folder (the
    original config must keep pointing at the original model). Read before anything is written, so that an
    unreadable config fails the conversion cleanly.
    """
    config_path = source.parent / GENAI_CONFIG
    if not config_path.is_file() or source.parent.resolve() == output.parent.resolve():
        return None
    try:
        config = json.loads(config_path.read_text())
        config["model"]["decoder"]["filename"] = output.name
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise ConversionError(f"{config_path} is not a readable GenAI config ({type(exc).__name__})") from None
    existing = output.parent / GENAI_CONFIG
    if existing.is_file():  # replaced only when it is this output's own (a conversion again)
        try:
            owner = json.loads(existing.read_text())["model"]["decoder"]["filename"]
        except (ValueError, KeyError, TypeError, OSError):
            owner = None
        if owner != output.name:
            raise ConversionError(
                f"{existing} is another model's GenAI config ({'decoder ' + repr(owner) if owner else 'unreadable'}): "
                "converting a GenAI model writes its own there; convert into another folder"
            )
    return config


def copy_genai_folder(source: Path, output: Path, config: dict, written: list[Path]) -> list[Path]:
    """Copy the GenAI side files of ``source``'s folder beside ``output`` and write ``config``; returns the files
    written. Model and data files are not copied (``written`` already holds the converted ones)."""
    copied: list[Path] = []
    taken = {p.resolve() for p in written}
    for path in sorted(source.parent.iterdir()):
        target = output.parent / path.name
        if not path.is_file() or path.name == GENAI_CONFIG or path.name.endswith(NOT_COPIED_SUFFIXES):
            continue
        if target.resolve() in taken:
            continue
        with open(path, "rb") as source_file, atomic_write(target) as target_file:
            shutil.copyfileobj(source_file, target_file)
        copied.append(target)
    target = write_text(output.parent / GENAI_CONFIG, json.dumps(config, indent=4))
    return [*copied, target]
