"""Check the cost model against kernel and transfer times measured on a real machine.

Four CSV layouts are understood (the header decides which, see :func:`csv_layout`):

- kernel rows ``kind,dtype,d,f,tokens,shards,median_us,p10_us,p90_us,flops,bytes`` with kinds
  ``shard_graph`` (one SwiGLU expert shard replayed from a CUDA graph), ``shard_eager`` (the same shard
  launched eagerly) and ``moe_layer_e{E}_k{K}`` (a naive eager top-K MoE layer of E experts);
- transfer rows ``direction,memory,bytes,median_us,p10_us,p90_us`` (host<->device copies), reported as
  kind ``transfer_{direction}_{memory}``.

- DRAM size-sweep rows ``standard,mapping,scope,refresh,bytes,time_ns_mean,...`` (Ramulator2 streams of one
  NDP rank, a 2-rank NDP-DIMM or a host channel): ``time_ns_mean`` predicted, kind = the row's ``scope``;
- DRAM contention rows ``standard,mapping,refresh,dimm_data_path,case,...,host_GBps,ndp_GBps``: the host and
  NDP bandwidths predicted, kind ``contention``.

DRAM rows are predicted from the JEDEC-derived model of :mod:`hw_model.dram` (no hardware preset needed);
rows with the row-sequential mapping (``RoBaRaCoCh``) get the kind suffix ``/row-sequential``.

Every kernel/transfer row is predicted from the shape alone with :mod:`hw_model.cost` and the chosen hardware
preset; nothing is fitted. Per kind the report gives the median and maximum relative error
``|predicted - measured| / measured``.

Rows that contradict another row of the same kind are reported but kept out of the statistics (unless
asked otherwise): a row is *inconsistent* when a run with more work (same kind and shape, at least as many
tokens or bytes, at most as many shards, one of them strictly) was measured clearly faster: its slowest decile
(p90), plus ``INCONSISTENCY_MARGIN``, below this row's fastest decile (p10). No cost model that charges more
for more work can match both rows; the report lists them with their errors.
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hw_model.cost import expert_shard_time_s, moe_layer_eager_time_s
from hw_model.errors import CalibrationDataError, HwModelError
from hw_model.figures import save_png
from hw_model.hardware import DTYPE_BYTES, SystemSpec
from hw_model.validate_energy import DRAM_ENERGY_COLUMNS, load_energy_predictions
from hw_model.workload import ExpertShape, MoELayerShape
from ndp_io.limits import MAX_CSV_FIELD_BYTES, MAX_CSV_INTEGER_DIGITS, MAX_KIND_NAME_CHARS, limit_note

DRAM_SWEEP_COLUMNS = ("standard", "mapping", "scope", "refresh", "bytes", "time_ns_mean")
DRAM_CONTENTION_COLUMNS = (
    "standard",
    "mapping",
    "refresh",
    "dimm_data_path",
    "case",
    "host_vs_ndp_rank",
    "host_to_ndp_request_ratio",
    "host_GBps",
    "ndp_GBps",
)
DRAM_MAPPINGS = {"MOP4CLXOR": "interleaved", "RoBaRaCoCh": "row-sequential"}
DRAM_SCOPE_RANKS = {"rank_ndp": 1, "dimm_ndp_2rank": 2, "channel_host_2rank": 1}
KERNEL_COLUMNS = ("kind", "dtype", "d", "f", "tokens", "shards", "median_us", "p10_us", "p90_us", "flops", "bytes")
TRANSFER_COLUMNS = ("direction", "memory", "bytes", "median_us", "p10_us", "p90_us")
MOE_LAYER_KIND = re.compile(r"^moe_layer_e(\d{1,6})_k(\d{1,6})$")
SHARD_KINDS = ("shard_graph", "shard_eager")
TRANSFER_DIRECTIONS = ("h2d", "d2h")
TRANSFER_MEMORY = ("pinned", "pageable")
INCONSISTENCY_MARGIN = 0.10  # relative; well above the p10-p90 spread of graph-replayed kernels (< 2%)


@dataclass(frozen=True)
class MeasuredRow:
    """One measured row (kernel or transfer), times in seconds; ``work`` orders rows of one group."""

    kind: str
    label: str
    group: tuple[Any, ...]
    size: float
    shards: int
    median_s: float
    p10_s: float
    p90_s: float
    line: int
    dtype: str = ""
    hidden: int = 0
    ffn: int = 0
    tokens: int = 0
    num_bytes: float = 0.0
    direction: str = ""
    memory: str = ""

    def has_at_least_the_work_of(self, other: MeasuredRow) -> bool:
        """True when this run does strictly more work than ``other`` (same group)."""
        if self.group != other.group:
            return False
        no_less = self.size >= other.size and self.shards <= other.shards
        return no_less and (self.size > other.size or self.shards < other.shards)


@dataclass(frozen=True)
class RowPrediction:
    row: MeasuredRow
    predicted_s: float
    inconsistent: bool = False

    @property
    def rel_err(self) -> float:
        """Signed relative error (predicted - measured) / measured."""
        return (self.predicted_s - self.row.median_s) / self.row.median_s


@dataclass(frozen=True)
class KindStats:
    """Error statistics of one row kind over its consistent rows, plus the worst error over all rows."""

    rows: int
    median_rel_err: float
    max_rel_err: float
    excluded_rows: int
    max_rel_err_all_rows: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "median_rel_err": None if math.isnan(self.median_rel_err) else self.median_rel_err,
            "max_rel_err": None if math.isnan(self.max_rel_err) else self.max_rel_err,
            "excluded_rows": self.excluded_rows,
            "max_rel_err_all_rows": self.max_rel_err_all_rows,
        }


@dataclass(frozen=True)
class ValidationReport:
    hardware: str
    sources: tuple[str, ...]
    predictions: tuple[RowPrediction, ...]
    kinds: Mapping[str, KindStats] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", MappingProxyType(dict(self.kinds)))

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "hardware": self.hardware,
            "data": list(self.sources),
            "kinds": {kind: stats.to_dict() for kind, stats in self.kinds.items()},
            "excluded": [
                {
                    "kind": p.row.kind,
                    "row": p.row.label,
                    "line": p.row.line,
                    "measured_us": p.row.median_s * 1e6,
                    "predicted_us": p.predicted_s * 1e6,
                    "rel_err": p.rel_err,
                }
                for p in self.predictions
                if p.inconsistent
            ],
        }


def csv_layout(path: str | Path) -> str:
    """``kernel``, ``transfer``, ``dram_sweep``, ``dram_contention`` or ``dram_energy`` (DRAMPower stream energies,
    :mod:`hw_model.validate_energy`), from the CSV's header."""
    path = Path(path)
    try:
        with _open_csv(path) as handle:
            header = {name.strip() for name in (next(csv.reader(handle), None) or ())}
    except UnicodeDecodeError as exc:
        raise CalibrationDataError(f"{path}: not a UTF-8 text file ({exc.reason})") from None
    except csv.Error as exc:
        raise _csv_error(path, exc) from None
    for layout, columns in (
        ("kernel", KERNEL_COLUMNS),
        ("transfer", TRANSFER_COLUMNS),
        ("dram_sweep", DRAM_SWEEP_COLUMNS),
        ("dram_contention", DRAM_CONTENTION_COLUMNS),
        ("dram_energy", DRAM_ENERGY_COLUMNS),
    ):
        if set(columns) <= header:
            return layout
    raise CalibrationDataError(
        f"{path}: header {','.join(sorted(header)) or '(empty)'} matches no known layout: kernel "
        f"({','.join(KERNEL_COLUMNS)}), transfer ({','.join(TRANSFER_COLUMNS)}), DRAM size sweep "
        f"({','.join(DRAM_SWEEP_COLUMNS)}), DRAM contention ({','.join(DRAM_CONTENTION_COLUMNS)}) or DRAM energy "
        f"({','.join(DRAM_ENERGY_COLUMNS)})"
    )


@dataclass(frozen=True)
class DramPrediction:
    """One predicted DRAM quantity (a stream time in seconds or a bandwidth in bytes/s) of one CSV row."""

    kind: str
    label: str
    measured: float
    predicted: float
    line: int
    unit: str

    @property
    def rel_err(self) -> float:
        return (self.predicted - self.measured) / self.measured


def load_dram_predictions(path: str | Path) -> list[DramPrediction]:
    """Read a DRAM size-sweep or contention CSV and predict each row with :mod:`hw_model.dram` (a DRAMPower
    energy CSV: with :mod:`hw_model.energy`, see :mod:`hw_model.validate_energy`)."""
    path = Path(path)
    layout = csv_layout(path)
    if layout == "dram_energy":
        return [DramPrediction(*row) for row in load_energy_predictions(path)]
    if layout not in ("dram_sweep", "dram_contention"):
        raise CalibrationDataError(f"{path}: not a DRAM calibration CSV")
    out: list[DramPrediction] = []
    try:
        return _predict_dram_rows(path, layout, out)
    except UnicodeDecodeError as exc:
        raise CalibrationDataError(f"{path}: not a UTF-8 text file ({exc.reason})") from None
    except csv.Error as exc:
        raise _csv_error(path, exc) from None


def _predict_dram_rows(path: Path, layout: str, out: list[DramPrediction]) -> list[DramPrediction]:
    from hw_model.dram import get_standard

    with _open_csv(path) as handle:
        for line, raw in enumerate(csv.DictReader(handle), start=2):
            row = {k.strip(): (v or "").strip() for k, v in raw.items() if k}
            try:
                standard = get_standard(row["standard"])
            except HwModelError as exc:
                raise CalibrationDataError(f"{path}:{line}: {exc}") from None
            mapping = row["mapping"]
            if mapping not in DRAM_MAPPINGS:
                raise CalibrationDataError(
                    f"{path}:{line}: unknown mapping {mapping!r} (known: {', '.join(DRAM_MAPPINGS)})"
                )
            dram_layout = DRAM_MAPPINGS[mapping]
            suffix = "" if dram_layout == "interleaved" else "/row-sequential"
            refresh = row["refresh"].lower() not in ("none", "off", "")
            if layout == "dram_sweep":
                scope = row["scope"]
                if scope not in DRAM_SCOPE_RANKS:
                    raise CalibrationDataError(
                        f"{path}:{line}: unknown scope {scope!r} (known: {', '.join(DRAM_SCOPE_RANKS)})"
                    )
                num_bytes = _number(path, line, row, "bytes")
                measured = _number(path, line, row, "time_ns_mean") * 1e-9
                predicted = standard.stream_time_s(num_bytes, DRAM_SCOPE_RANKS[scope], dram_layout, refresh)
                label = f"{row['standard']} {mapping} {int(num_bytes)} B"
                out.append(DramPrediction(scope + suffix, label, measured, predicted, line, "s"))
                continue
            for stream, value in zip(
                ("host", "ndp"), _contention_gbps(row, standard, dram_layout, refresh), strict=True
            ):
                measured_text = row[f"{stream}_GBps"]
                try:
                    measured = float(measured_text) * 1e9
                except ValueError:
                    raise CalibrationDataError(
                        f"{path}:{line}: column '{stream}_GBps' must be a number, got {measured_text!r}"
                    ) from None
                if measured <= 0:
                    continue  # this stream did not run in the row
                label = (
                    f"{row['standard']} {mapping} {row['case']} {row['host_vs_ndp_rank'] or '-'} rank "
                    f"{row['host_to_ndp_request_ratio'] or '-'} {row['dimm_data_path']}: {stream}"
                )
                out.append(DramPrediction("contention" + suffix, label, measured, value, line, "B/s"))
    if not out:
        raise CalibrationDataError(f"{path}: no data rows")
    return out


def _contention_gbps(row: Mapping[str, str], standard: Any, layout: str, refresh: bool) -> tuple[float, float]:
    """Predicted (host, NDP) bandwidth of a contention row, bytes/s.

    One rank streams ``eta x peak``. Host and NDP on the same rank, or on two ranks sharing one data bus, split
    that by their request ratio; on two ranks with their own data paths each gets a full rank, and the
    injection ratio throttles the smaller stream to the larger one's share.
    """
    full = standard.rank_peak_bytes_per_s * standard.streaming_efficiency(layout, refresh)
    case = row["case"]
    if case == "host_alone":
        return full, 0.0
    if case == "ndp_alone":
        return 0.0, full
    try:
        host_part, ndp_part = (float(x) for x in row["host_to_ndp_request_ratio"].split(":"))
    except ValueError:
        raise CalibrationDataError(f"bad host_to_ndp_request_ratio {row['host_to_ndp_request_ratio']!r}") from None
    host_share = host_part / (host_part + ndp_part)
    shared = row["host_vs_ndp_rank"] == "same" or "shared" in row["dimm_data_path"]
    if shared:
        return full * host_share, full * (1 - host_share)
    larger = max(host_part, ndp_part)
    return full * host_part / larger, full * ndp_part / larger


@dataclass(frozen=True)
class DramValidationReport:
    """Error statistics of the DRAM model per kind over the predicted rows."""

    sources: tuple[str, ...]
    predictions: tuple[DramPrediction, ...]
    kinds: Mapping[str, KindStats] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", MappingProxyType(dict(self.kinds)))


def validate_dram(paths: Sequence[str | Path]) -> DramValidationReport:
    """Predict every row of the DRAM CSVs ``paths`` and summarise the relative errors per kind."""
    predictions = tuple(p for path in paths for p in load_dram_predictions(path))
    kinds: dict[str, KindStats] = {}
    for kind in sorted({p.kind for p in predictions}, key=lambda k: ("/" in k, k)):
        errors = [abs(p.rel_err) for p in predictions if p.kind == kind]
        kinds[kind] = KindStats(len(errors), statistics.median(errors), max(errors), 0, max(errors))
    return DramValidationReport(tuple(str(p) for p in paths), predictions, kinds)


def format_dram_report(report: DramValidationReport, worst_per_kind: int = 2) -> str:
    """One line per kind, then the worst rows of each kind."""
    lines = [f"DRAM model (hw_model/dram.py, JEDEC-derived; energy: hw_model/energy.py) vs {', '.join(report.sources)}"]
    lines.append(f"{'kind':<32} {'rows':>5} {'median err':>11} {'max err':>9}")
    for kind, stats in report.kinds.items():
        lines.append(f"{kind:<32} {stats.rows:>5} {stats.median_rel_err:>11.1%} {stats.max_rel_err:>9.1%}")
    lines.append("worst rows (signed error = predicted / measured - 1):")
    for kind in report.kinds:
        worst = sorted((p for p in report.predictions if p.kind == kind), key=lambda p: -abs(p.rel_err))
        for p in worst[:worst_per_kind]:
            scale, unit = {"s": (1e9, "ns"), "J": (1e6, "uJ")}.get(p.unit, (1e-9, "GB/s"))
            lines.append(
                f"  {kind:<30} {p.label:<70} measured {p.measured * scale:10.2f} {unit}  predicted "
                f"{p.predicted * scale:10.2f} {unit}  {p.rel_err:+6.1%}  (line {p.line})"
            )
    return "\n".join(lines)


def load_measurements(path: str | Path) -> list[MeasuredRow]:
    """Read a kernel or transfer CSV (see the module docstring); errors name the file, line and column."""
    path = Path(path)
    try:
        with _open_csv(path) as handle:
            reader = csv.DictReader(handle)
            header = tuple(name.strip() for name in (reader.fieldnames or ()))
            if set(KERNEL_COLUMNS) <= set(header):
                parse = _parse_kernel_row
            elif set(TRANSFER_COLUMNS) <= set(header):
                parse = _parse_transfer_row
            else:
                raise CalibrationDataError(
                    f"{path}: header {','.join(header) or '(empty)'} has neither the kernel columns "
                    f"({','.join(KERNEL_COLUMNS)}) nor the transfer columns ({','.join(TRANSFER_COLUMNS)})"
                )
            rows = [
                parse(path, line, {k.strip(): (v or "").strip() for k, v in raw.items() if k})
                for line, raw in enumerate(reader, start=2)
            ]
    except UnicodeDecodeError as exc:
        raise CalibrationDataError(f"{path}: not a UTF-8 text file ({exc.reason})") from None
    except csv.Error as exc:
        raise _csv_error(path, exc) from None
    if not rows:
        raise CalibrationDataError(f"{path}: no data rows")
    return rows


def _open_csv(path: Path) -> Any:
    """A calibration CSV opened as text: UTF-8, a leading byte-order mark dropped (spreadsheets write one)."""
    return path.open(newline="", encoding="utf-8-sig")


def _csv_error(path: Path, exc: csv.Error) -> CalibrationDataError:
    if "field larger than field limit" in str(exc):  # the csv module's own bound, which is ours
        return CalibrationDataError(
            f"{path}: a field is over {MAX_CSV_FIELD_BYTES:,} bytes {limit_note('MAX_CSV_FIELD_BYTES')}"
        )
    return CalibrationDataError(f"{path}: not a valid CSV file ({exc})")


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:57] + "...") + f" ({len(text):,} characters)"


def _number(path: Path, line: int, raw: Mapping[str, str], column: str, integer: bool = False) -> float:
    text = raw.get(column, "")
    if integer and len(text.lstrip("+-")) > MAX_CSV_INTEGER_DIGITS:
        raise CalibrationDataError(
            f"{path}:{line}: column '{column}' has {len(text):,} digits {limit_note('MAX_CSV_INTEGER_DIGITS')}"
        )
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise CalibrationDataError(f"{path}:{line}: column '{column}' must be {kind}, got {_shown(text)}") from None
    if not math.isfinite(value) or value <= 0:
        raise CalibrationDataError(f"{path}:{line}: column '{column}' must be positive, got {_shown(text)}")
    return value


def _times(path: Path, line: int, raw: Mapping[str, str]) -> tuple[float, float, float]:
    median, p10, p90 = (_number(path, line, raw, c) * 1e-6 for c in ("median_us", "p10_us", "p90_us"))
    if not p10 <= median <= p90:
        raise CalibrationDataError(f"{path}:{line}: expected p10_us <= median_us <= p90_us")
    return median, p10, p90


def _parse_kernel_row(path: Path, line: int, raw: Mapping[str, str]) -> MeasuredRow:
    kind, dtype = raw["kind"], raw["dtype"]
    if len(kind) > MAX_KIND_NAME_CHARS:
        raise CalibrationDataError(
            f"{path}:{line}: kind {_shown(kind)} is too long {limit_note('MAX_KIND_NAME_CHARS')}"
        )
    if kind not in SHARD_KINDS and not MOE_LAYER_KIND.match(kind):
        raise CalibrationDataError(
            f"{path}:{line}: unknown kind {kind!r} (known: {', '.join(SHARD_KINDS)}, moe_layer_e<E>_k<K>, "
            "E and K of at most 6 digits)"
        )
    if dtype not in DTYPE_BYTES:
        raise CalibrationDataError(f"{path}:{line}: unknown dtype {_shown(dtype)} (known: {', '.join(DTYPE_BYTES)})")
    hidden, ffn, tokens, shards = (
        int(_number(path, line, raw, c, integer=True)) for c in ("d", "f", "tokens", "shards")
    )
    for column in ("flops", "bytes"):
        _number(path, line, raw, column)
    match = MOE_LAYER_KIND.match(kind)
    if match and not 0 < int(match.group(2)) <= int(match.group(1)):
        raise CalibrationDataError(f"{path}:{line}: kind {kind!r} needs 0 < K <= E")
    median, p10, p90 = _times(path, line, raw)
    return MeasuredRow(
        kind=kind,
        label=f"{dtype} d={hidden} f={ffn} tokens={tokens} shards={shards}",
        group=(kind, dtype, hidden, ffn),
        size=tokens,
        shards=shards,
        median_s=median,
        p10_s=p10,
        p90_s=p90,
        line=line,
        dtype=dtype,
        hidden=hidden,
        ffn=ffn,
        tokens=tokens,
    )


def _parse_transfer_row(path: Path, line: int, raw: Mapping[str, str]) -> MeasuredRow:
    direction, memory = raw["direction"], raw["memory"]
    if direction not in TRANSFER_DIRECTIONS:
        raise CalibrationDataError(f"{path}:{line}: direction must be one of {TRANSFER_DIRECTIONS}, got {direction!r}")
    if memory not in TRANSFER_MEMORY:
        raise CalibrationDataError(f"{path}:{line}: memory must be one of {TRANSFER_MEMORY}, got {memory!r}")
    num_bytes = _number(path, line, raw, "bytes")
    median, p10, p90 = _times(path, line, raw)
    kind = f"transfer_{direction}_{memory}"
    return MeasuredRow(
        kind=kind,
        label=f"{direction} {memory} {int(num_bytes)} B",
        group=(kind,),
        size=num_bytes,
        shards=1,
        median_s=median,
        p10_s=p10,
        p90_s=p90,
        line=line,
        num_bytes=num_bytes,
        direction=direction,
        memory=memory,
    )


def predict_row_s(system: SystemSpec, row: MeasuredRow) -> float:
    """Predicted time of one measured row on ``system``'s GPU (or host link), in seconds."""
    if row.kind.startswith("transfer_"):
        return system.host_link.transfer_time_s(row.num_bytes, pinned=row.memory == "pinned")
    gpu = system.gpu
    expert = ExpertShape(hidden=row.hidden, ffn=row.ffn, gated=True, dtype=row.dtype)
    if row.kind == "shard_graph":  # replayed from a graph, many runs per timing: no host cost per run
        return expert_shard_time_s(gpu, expert, row.tokens, row.shards)
    if row.kind == "shard_eager":  # one timed region per run: one host<->device round trip on top
        return gpu.sync_overhead_s + expert_shard_time_s(gpu, expert, row.tokens, row.shards, eager=True)
    match = MOE_LAYER_KIND.match(row.kind)
    if match is None:
        raise CalibrationDataError(f"line {row.line}: unknown kind {row.kind!r}")
    layer = MoELayerShape(row.kind, num_experts=int(match.group(1)), top_k=int(match.group(2)), expert=expert)
    return gpu.sync_overhead_s + moe_layer_eager_time_s(gpu, layer, row.tokens)


def find_inconsistent(rows: Sequence[MeasuredRow]) -> set[int]:
    """Indices of rows measured slower (p10) than a run with more work (p90); see the module docstring.

    O(n log n): per group, rows are swept from the most work (size) down; a prefix-minimum tree over the shard
    counts holds the fastest p90 of the rows with more size seen so far (at most as many shards), and rows of
    the same size are compared with those of strictly fewer shards. A row is flagged when the fastest p90 among
    the rows that do more work than it, plus the margin, is below its p10 (the same rows the pairwise
    definition, :meth:`MeasuredRow.has_at_least_the_work_of`, picks)."""
    by_group: dict[tuple[Any, ...], list[int]] = {}
    for index, row in enumerate(rows):
        by_group.setdefault(row.group, []).append(index)
    flagged: set[int] = set()
    for members in by_group.values():
        flagged.update(_inconsistent_in_group(rows, members))
    return flagged


def _inconsistent_in_group(rows: Sequence[MeasuredRow], members: list[int]) -> list[int]:
    scale = 1 + INCONSISTENCY_MARGIN
    shard_values = sorted({rows[i].shards for i in members})
    rank = {value: position + 1 for position, value in enumerate(shard_values)}  # 1-based for the tree
    tree = [math.inf] * (len(shard_values) + 1)  # Fenwick tree of prefix minima of p90 over shard ranks

    def fastest_up_to(position: int) -> float:
        best = math.inf
        while position > 0:
            best = min(best, tree[position])
            position -= position & -position
        return best

    def add(position: int, value: float) -> None:
        while position < len(tree):
            tree[position] = min(tree[position], value)
            position += position & -position

    order = sorted(members, key=lambda i: -rows[i].size)
    flagged: list[int] = []
    start = 0
    while start < len(order):
        end = start
        while end < len(order) and rows[order[end]].size == rows[order[start]].size:
            end += 1
        same_size = sorted(order[start:end], key=lambda i: rows[i].shards)
        fewer_shards = math.inf  # fastest p90 of this size's rows with strictly fewer shards
        position = 0
        while position < len(same_size):
            last = position
            shards = rows[same_size[position]].shards
            while last < len(same_size) and rows[same_size[last]].shards == shards:
                last += 1
            for i in same_size[position:last]:
                best = min(fastest_up_to(rank[shards]), fewer_shards)
                if best * scale < rows[i].p10_s:
                    flagged.append(i)
            for i in same_size[position:last]:
                fewer_shards = min(fewer_shards, rows[i].p90_s)
            position = last
        for i in same_size:  # now rows of smaller size see these (more size, at most as many shards)
            add(rank[rows[i].shards], rows[i].p90_s)
        start = end
    return flagged


def validate(
    system: SystemSpec, rows: Iterable[MeasuredRow], *, sources: Sequence[str] = (), exclude_inconsistent: bool = True
) -> ValidationReport:
    """Predict every row and summarise the relative errors per kind."""
    rows = list(rows)
    flagged = find_inconsistent(rows) if exclude_inconsistent else set()
    try:
        predictions = tuple(
            RowPrediction(row, predict_row_s(system, row), inconsistent=i in flagged) for i, row in enumerate(rows)
        )
    except CalibrationDataError:
        raise
    except HwModelError as exc:
        raise CalibrationDataError(str(exc)) from None
    kinds: dict[str, KindStats] = {}
    for kind in sorted({p.row.kind for p in predictions}, key=_kind_order):
        of_kind = [p for p in predictions if p.row.kind == kind]
        kept = [abs(p.rel_err) for p in of_kind if not p.inconsistent]
        every = [abs(p.rel_err) for p in of_kind]
        kinds[kind] = KindStats(
            rows=len(kept),
            median_rel_err=statistics.median(kept) if kept else math.nan,
            max_rel_err=max(kept) if kept else math.nan,
            excluded_rows=len(of_kind) - len(kept),
            max_rel_err_all_rows=max(every),
        )
    return ValidationReport(system.name, tuple(str(s) for s in sources), predictions, kinds)


def _kind_order(kind: str) -> tuple[int, str]:
    order = {"shard_graph": 0, "shard_eager": 1}
    if kind in order:
        return order[kind], kind
    return (2 if kind.startswith("moe_layer") else 3), kind


def format_report(report: ValidationReport, worst_per_kind: int = 3) -> str:
    """A plain-text summary: one line per kind, then the worst rows of each kind and any excluded rows."""
    lines = [f"cost model vs measurements on '{report.hardware}' ({', '.join(report.sources) or 'rows given'})"]
    lines.append(f"{'kind':<22} {'rows':>5} {'median err':>11} {'max err':>9}   excluded")
    for kind, stats in report.kinds.items():
        excluded = (
            f"{stats.excluded_rows} (max err incl. them {stats.max_rel_err_all_rows:.1%})"
            if stats.excluded_rows
            else "-"
        )
        lines.append(f"{kind:<22} {stats.rows:>5} {stats.median_rel_err:>11.1%} {stats.max_rel_err:>9.1%}   {excluded}")
    lines.append("")
    lines.append("worst rows (signed error = predicted / measured - 1):")
    for kind in report.kinds:
        kept = sorted(
            (p for p in report.predictions if p.row.kind == kind and not p.inconsistent), key=lambda p: -abs(p.rel_err)
        )
        for p in kept[:worst_per_kind]:
            lines.append(f"  {kind:<20} {_describe(p)}")
    excluded = [p for p in report.predictions if p.inconsistent]
    if excluded:
        lines.append("excluded from the statistics (a run with more work was measured faster):")
        lines.extend(f"  {p.row.kind:<20} {_describe(p)}" for p in excluded)
    return "\n".join(lines)


def _describe(p: RowPrediction) -> str:
    return (
        f"{p.row.label:<40} measured {p.row.median_s * 1e6:10.1f} us  predicted {p.predicted_s * 1e6:10.1f} us  "
        f"{p.rel_err:+7.1%}  (line {p.row.line})"
    )


def write_scatter_png(report: ValidationReport, path: str | Path, band: float = 0.35) -> None:
    """Predicted-vs-measured scatter plot (log-log, one colour per kind, a +-``band`` corridor) as PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise HwModelError("the scatter plot needs matplotlib (pip install 'ndp-ep[plot]')") from None
    path = Path(path)
    directory = path.resolve().parent
    if not directory.is_dir():
        raise CalibrationDataError(f"cannot write {path}: directory {directory} does not exist")
    fig, ax = plt.subplots(figsize=(7.5, 6.5), dpi=110)
    for kind, stats in report.kinds.items():
        of_kind = [p for p in report.predictions if p.row.kind == kind]
        kept = [p for p in of_kind if not p.inconsistent]
        ax.scatter(
            [p.row.median_s * 1e6 for p in kept],
            [p.predicted_s * 1e6 for p in kept],
            s=14,
            alpha=0.75,
            label=f"{kind} (n={stats.rows}, median {stats.median_rel_err:.1%}, max {stats.max_rel_err:.1%})",
        )
        odd = [p for p in of_kind if p.inconsistent]
        if odd:
            ax.scatter(
                [p.row.median_s * 1e6 for p in odd], [p.predicted_s * 1e6 for p in odd], marker="x", s=36, c="black"
            )
    values = [v for p in report.predictions for v in (p.row.median_s * 1e6, p.predicted_s * 1e6)]
    low, high = min(values) / 1.5, max(values) * 1.5
    ax.plot([low, high], [low, high], color="black", linewidth=1, label="predicted = measured")
    for factor in (1 - band, 1 + band):
        ax.plot([low, high], [low * factor, high * factor], color="grey", linewidth=0.8, linestyle="--")
    ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high))
    ax.set_xlabel("measured median (us)")
    ax.set_ylabel("predicted (us)")
    ax.set_title(f"cost model on '{report.hardware}': dashed = +-{band:.0%}; x = excluded (inconsistent) rows")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    save_png(fig, path)
