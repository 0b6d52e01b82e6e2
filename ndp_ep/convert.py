"""``ndp_ep.convert_model``: rewrite a model's MoE blocks into sharded expert ops and save it atomically."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from graph_passes.convert import ConversionReport, convert
from graph_passes.model_io import output_files, save_rewritten
from hw_model.hardware import SystemSpec, load_system
from ndp_ep.errors import ConversionError, graph_pass_errors
from ndp_ep.partition import annotate_placement
from ndp_io import FileSafetyError, check_no_clobber, check_output_path

DEFAULT_POLICY = "tp+lb+prefetch"


@dataclass(frozen=True)
class ConversionResult:
    report: ConversionReport
    files: tuple[Path, ...]
    system: SystemSpec
    shards: int

    def to_json(self) -> dict:
        return {
            "hardware": self.system.name,
            "ndp_units": self.system.num_ndp_units,
            "shards": self.shards,
            "files": [str(f) for f in self.files],
            **self.report.to_json(),
        }


def convert_model(
    source: str | Path | onnx.ModelProto,
    output_path: str | Path,
    *,
    hw: str | Path | SystemSpec = "paper",
    ndp_units: int | None = None,
    shards: int | None = None,
    strict: bool = False,
    external_data: bool | None = None,
) -> ConversionResult:
    """Convert ``source`` and write it to ``output_path`` (weights to ``<output>.data`` when large).

    ``shards`` defaults to the number of NDP units of ``hw``. Raises :class:`ModelLoadError` for an input
    that is missing or not ONNX and :class:`ConversionError` when ``strict`` and a block was skipped or none
    was converted.
    """
    system = hw if isinstance(hw, SystemSpec) else load_system(hw, ndp_units)
    output_path = Path(output_path)
    inputs = [] if isinstance(source, onnx.ModelProto) else [Path(source)]
    if isinstance(hw, str | Path):  # a hardware TOML file is an input too (a preset name matches no file)
        inputs.append(Path(hw))
    try:  # never clobber an input: checked before any work, and again with the input's data files
        check_output_path(output_path)
        check_no_clobber(output_files(output_path), inputs)
    except FileSafetyError as exc:
        raise ConversionError(str(exc)) from None
    requested = shards if shards is not None else max(system.num_ndp_units, 1)
    with graph_pass_errors():
        rewritten, report = convert(source, shards=requested, strict=strict)
    if strict and not report.blocks:
        raise ConversionError("strict: nothing to convert: no MoE block found")
    annotate_placement(rewritten.model, system, DEFAULT_POLICY)
    data_files = rewritten.store.data_files if rewritten.store is not None else []
    try:
        check_no_clobber(output_files(output_path), [*inputs, *data_files])
        files = save_rewritten(rewritten, output_path, external=external_data)
    except FileSafetyError as exc:
        raise ConversionError(str(exc)) from None
    return ConversionResult(report, tuple(files), system, requested)
