"""``ndp_ep.convert_model``: rewrite a model's MoE blocks into sharded expert ops and save it atomically.

A model inside an ONNX Runtime GenAI folder (``genai_config.json`` beside it) stays a GenAI folder: the
config, tokenizer and other side files are copied beside the output, with ``decoder.filename`` pointing at
the converted model, so ``onnxruntime_genai.Model(output_dir)`` loads the converted model; what is copied,
and what is refused, is :mod:`ndp_ep.genai_folder`'s (all or nothing with the model).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import onnx

from graph_passes.convert import BackgroundChecks, ConversionReport, convert
from graph_passes.model_io import CommitRefused, output_files, save_rewritten
from graph_passes.sharded_op import DOMAIN, OP_TYPE, is_sharded_node
from hw_model.hardware import SystemSpec
from hw_model.settings import SimulationSettings
from ndp_ep.errors import ConversionError, graph_pass_errors
from ndp_ep.genai_folder import plan_genai_folder
from ndp_ep.partition import annotate_placement
from ndp_ep.text import plural
from ndp_io import FileSafetyError, check_no_clobber, check_output_path


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
    prove_every_block: bool = False,
) -> ConversionResult:
    """Convert ``source`` and write it to ``output_path`` (weights to ``<output>.data`` when large).

    ``source`` is a path, serialized bytes or an ``onnx.ModelProto``, as :class:`ndp_ep.InferenceSession` takes.
    The experts are placed under ``settings`` (a :class:`hw_model.SimulationSettings`; or ``hw``, default ``paper``,
    and ``ndp_units``, as for :class:`ndp_ep.InferenceSession`). ``shards`` defaults to the number of NDP units.
    Raises :class:`hw_model.SettingsError` for an ``ndp_units`` outside 1 to 64, :class:`NdpEpError` for a shard
    count or a system's unit count below 1 (the experts are placed on the NDP units, so the system needs one,
    even with ``shards`` given), :class:`ModelLoadError` for an input that is missing or not ONNX and
    :class:`ConversionError` when ``strict`` and a block was skipped or none was converted.

    The numeric proof runs once per block signature (:mod:`graph_passes.proof_sharing`): a block with the signature
    of a block already checked is covered by that check once its shards, as written, prove to be exact byte views
    of its own weights (checked before anything is committed; when one is not, the model is converted again with
    every block checked on its own). ``prove_every_block``: check every block on its own from the start.
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
    genai = None if isinstance(source, onnx.ModelProto) else plan_genai_folder(Path(source), output_path, inputs)
    requested = shards if shards is not None else system.num_ndp_units
    with graph_pass_errors():
        # the numeric checks of blocks too large to check whole run while the conversion is written
        rewritten, report = convert(
            source, shards=requested, strict=strict, defer_checks=True, prove_every_block=prove_every_block
        )
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
    refuted: list[str] = []

    def confirmed() -> bool:
        """Every pending check confirmed its block's reading, and every covered block's shards are its own bytes."""
        with graph_pass_errors():
            settled = checks.settled()
        if settled is None:
            return False
        refuted.extend(rewritten.refuted_views(b.name for b in settled.blocks if b.proven_by))
        return not refuted

    try:
        side_files = genai.write() if genai is not None else []  # before the model; removed if its save fails
        try:
            files = _save(rewritten, output_path, settings, inputs, external_data, confirmed)
            report = checks.settled()
        except CommitRefused:  # a check did not confirm the reading a block was rewritten on, or a covered block's
            with graph_pass_errors():  # shards were not its own bytes: convert again, every block checked first
                rewritten, report = convert(source, shards=requested, strict=strict)
            if refuted:
                notes = (*report.notes, *(f"{r}: every block checked on its own instead" for r in refuted))
                report = dataclasses.replace(report, notes=notes)
            files = _save(rewritten, output_path, settings, inputs, external_data, None)
    except BaseException:
        if genai is not None:
            genai.roll_back()
        raise
    files = [*files, *side_files]
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
