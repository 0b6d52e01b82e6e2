"""Reading and writing routing-trace files (:mod:`hw_model.routing_trace`; the format: docs/trace_format.md).

A trace file is a zip archive (``.npz``) holding ``header.json`` (UTF-8 JSON, first) and one ``.npy`` member per
array (format 1.0, little-endian, C order), in the order of :data:`hw_model.routing_trace.ARRAY_SPECS`, deflated,
every member dated 1980-01-01 00:00:00 with mode 0644: the bytes depend on the content only, so save -> load ->
save is byte-identical. Writes are atomic (:func:`ndp_io.atomic_write`).

Reading refuses, with one :class:`~hw_model.errors.TraceFormatError` line each: a file that is not a zip archive
(foreign), one whose zip directory is missing or whose members fail their CRC (truncated or corrupt), members it
does not know, a missing header or array, a header that is not JSON, nests deeper than :data:`MAX_JSON_DEPTH`,
names another format or version, or has a field of the wrong type, arrays of the wrong dtype, shape or content,
an archive whose members would inflate past ``max_bytes`` (checked from the zip directory before anything is
decompressed; a member never inflates past the size its entry states).
"""

from __future__ import annotations

import io
import json
import math
import zipfile
import zlib
from pathlib import Path

import numpy as np

from hw_model.errors import TraceFormatError
from hw_model.routing_trace import ARRAY_SPECS, SLOT_ARRAYS, STEP_PHASES, CapturedTrace, RoutingSteps, TraceHeader

HEADER_MEMBER = "header.json"
MAX_HEADER_BYTES = 1 << 20  # a header of 10,000 layers is ~2 MB... of 4,000 ~0.8 MB: ample for any MoE model
MAX_JSON_DEPTH = 16  # the header nests 3 deep
DEFAULT_MAX_BYTES = 4 << 30  # what the members may inflate to, together, unless the caller states a limit
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
_ZIP_LEVEL = 6
_ZIP_MAGIC = b"PK\x03\x04"


def encode_trace(trace: CapturedTrace) -> bytes:
    """The file's bytes (deterministic: see the module docstring)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        header = json.dumps(trace.header.to_json(), sort_keys=True, indent=1, allow_nan=False) + "\n"
        _add_member(archive, HEADER_MEMBER, header.encode("utf-8"))
        for name, array in trace.steps.arrays().items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(array), version=(1, 0), allow_pickle=False)
            _add_member(archive, f"{name}.npy", member.getvalue())
    return buffer.getvalue()


def _add_member(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.create_system = 3
    info.external_attr = 0o100644 << 16
    archive.writestr(info, data, compresslevel=_ZIP_LEVEL)


def save_trace(trace: CapturedTrace, path: str | Path) -> Path:
    """Write ``trace`` to ``path`` (``.npz``) atomically; returns the path."""
    from ndp_io import write_bytes

    path = Path(path)
    if path.suffix.lower() != ".npz":
        raise TraceFormatError(f"a routing trace file must end in .npz: {path}")
    return write_bytes(path, encode_trace(trace))


def load_captured(path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> CapturedTrace:
    """Read a trace file; :class:`TraceFormatError` (its message starts with the path) when it is not ours."""
    path = Path(path)
    try:
        return _load(path, max_bytes)
    except TraceFormatError as exc:
        raise TraceFormatError(f"{path}: {exc}") from None


def _load(path: Path, max_bytes: int) -> CapturedTrace:
    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except FileNotFoundError:
        raise TraceFormatError("no such file") from None
    except OSError as exc:
        raise TraceFormatError(f"cannot read it ({exc.strerror or exc})") from None
    if magic != _ZIP_MAGIC:
        what = "an empty file" if not magic else "not a zip archive"
        raise TraceFormatError(f"not an ndp-ep routing trace ({what})")
    try:
        with zipfile.ZipFile(path) as archive:
            return _read_archive(archive, max_bytes)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError, RuntimeError) as exc:
        if isinstance(exc, TraceFormatError):
            raise
        raise TraceFormatError(f"truncated or corrupt ({type(exc).__name__}: {exc})") from None


def _read_archive(archive: zipfile.ZipFile, max_bytes: int) -> CapturedTrace:
    known = {HEADER_MEMBER, *(f"{name}.npy" for name in (*ARRAY_SPECS, *SLOT_ARRAYS))}
    infos: dict[str, zipfile.ZipInfo] = {}
    total = 0
    members = archive.infolist()
    if HEADER_MEMBER not in {info.filename for info in members}:
        raise TraceFormatError(f"not an ndp-ep routing trace (no {HEADER_MEMBER})")
    for info in members:
        if info.filename not in known:
            raise TraceFormatError(f"not an ndp-ep routing trace (unknown member {info.filename!r})")
        if info.filename in infos:
            raise TraceFormatError(f"member {info.filename!r} appears twice")
        infos[info.filename] = info
        total += info.file_size
    if total > max_bytes:
        raise TraceFormatError(f"its members inflate to {total:,} bytes, over the limit of {max_bytes:,}")
    header_info = infos[HEADER_MEMBER]
    if header_info.file_size > MAX_HEADER_BYTES:
        raise TraceFormatError(f"its header is {header_info.file_size:,} bytes, over {MAX_HEADER_BYTES:,}")
    header = parse_header(archive.read(header_info))
    present = [name for name in SLOT_ARRAYS if f"{name}.npy" in infos]
    if present and len(present) != len(SLOT_ARRAYS):
        raise TraceFormatError(f"the slot arrays {', '.join(SLOT_ARRAYS)} come together (found {', '.join(present)})")
    arrays: dict[str, np.ndarray] = {}
    for name, (dtype, ndim) in {**ARRAY_SPECS, **(SLOT_ARRAYS if present else {})}.items():
        member = f"{name}.npy"
        if member not in infos:
            raise TraceFormatError(f"it lacks the array {name!r}")
        arrays[name] = _read_array(name, archive.read(infos[member]), dtype, ndim)
    return CapturedTrace(header, RoutingSteps(**arrays))


def parse_header(data: bytes) -> TraceHeader:
    """The :class:`TraceHeader` of a ``header.json`` member's bytes."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceFormatError("its header is not UTF-8 text") from None
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise TraceFormatError(f"its header nests {depth} deep, more than {MAX_JSON_DEPTH}")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise TraceFormatError(f"its header is not JSON ({exc})") from None
    return TraceHeader.from_json(doc)


def json_depth(text: str) -> int:
    """How deep the arrays and objects of a JSON text nest (brackets inside strings not counted)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _read_array(name: str, data: bytes, dtype: str, ndim: int) -> np.ndarray:
    """One ``.npy`` member's array, checked against its expected dtype and rank before it is built."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, found = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, found = np.lib.format.read_array_header_2_0(stream)
        else:
            raise TraceFormatError(f"array {name!r}: .npy version {version} not read")
    except TraceFormatError:
        raise
    except Exception as exc:  # noqa: BLE001 - numpy parses the header dict with tokenize and literal_eval
        raise TraceFormatError(f"array {name!r} is not a .npy array ({type(exc).__name__})") from None
    if found != np.dtype(dtype) or fortran or len(shape) != ndim:
        raise TraceFormatError(f"array {name!r} must be {dtype} with {ndim} dimension(s), got {found} {shape}")
    body = len(data) - stream.tell()
    if math.prod(shape) * np.dtype(dtype).itemsize != body:
        raise TraceFormatError(f"array {name!r} holds {body:,} bytes, not the {shape} its header states")
    return np.frombuffer(data, dtype=np.dtype(dtype), offset=stream.tell()).reshape(shape)


def export_jsonl(trace: CapturedTrace, path: str | Path) -> Path:
    """Write ``trace`` as JSON lines, atomically: the header object first (``{"header": ...}``), then one object
    per (step, layer) that ran: ``step``, ``phase``, ``layer``, ``name``, ``tokens``, ``experts`` and ``counts``
    (non-zero counts), with ``expert_ids`` and ``routing_weights`` of every slot when the trace has them."""
    from ndp_io import atomic_write

    header = trace.header
    steps = trace.steps
    layers = len(header.layers)
    names = [layer.name for layer in header.layers]
    with atomic_write(path, "w", encoding="utf-8") as handle:
        handle.write(json.dumps({"header": header.to_json()}, sort_keys=True) + "\n")
        offsets = steps.cell_offsets.tolist()
        slot_offsets = steps.slot_offsets.tolist() if steps.slot_offsets is not None else None
        tokens = steps.layer_tokens.tolist()
        phases = steps.phase.tolist()
        for step in range(steps.num_steps):
            for layer in range(layers):
                if tokens[step][layer] < 0:
                    continue
                cell = step * layers + layer
                lo, hi = offsets[cell], offsets[cell + 1]
                line: dict[str, object] = {
                    "step": step,
                    "phase": STEP_PHASES[phases[step]],
                    "layer": layer,
                    "name": names[layer],
                    "tokens": tokens[step][layer],
                    "experts": steps.experts[lo:hi].tolist(),
                    "counts": steps.counts[lo:hi].tolist(),
                }
                if slot_offsets is not None and steps.expert_ids is not None and steps.routing_weights is not None:
                    s_lo, s_hi = slot_offsets[cell], slot_offsets[cell + 1]
                    line["expert_ids"] = steps.expert_ids[s_lo:s_hi].tolist()
                    line["routing_weights"] = steps.routing_weights[s_lo:s_hi].tolist()
                handle.write(json.dumps(line) + "\n")
    return Path(path)
