"""A bounded-memory recorder of routing, step by step: what a session's routing capture appends to.

:class:`RoutingCapture` keeps each step's routing compressed-sparse (per MoE layer, the non-zero expert counts:
``top_k`` entries for a one-token decode step, whatever the expert count; the steps held in memory are kept dense,
``[layers, experts]`` each, and made sparse together), in memory up to ``resident_bytes``;
beyond that the chunk held is appended to an anonymous temporary file (the spool, deleted when the capture is
closed or collected) and memory starts over, so a long generation holds at most ``resident_bytes`` (plus one step)
in memory however long it runs. :meth:`RoutingCapture.steps` reads everything back as
:class:`hw_model.routing_trace.RoutingSteps` (what a trace file holds).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from typing import IO

import numpy as np

from hw_model.errors import WorkloadError
from hw_model.routing_trace import ABSENT, STEP_PHASES, RoutingSteps

DEFAULT_RESIDENT_BYTES = 1 << 20  # routing held in memory before it is spooled to disk
# the per-step arrays and the per-entry arrays, in spool order: (name, dtype)
_STEP_FIELDS = (("phase", np.uint8), ("gap_s", np.float64), ("reported_s", np.float64))


class RoutingCapture:
    """Routing of ``num_layers`` MoE layers (at most ``width`` experts each), appended one step at a time."""

    def __init__(self, num_layers: int, width: int, resident_bytes: int = DEFAULT_RESIDENT_BYTES) -> None:
        if num_layers < 0 or width < 0 or resident_bytes < 1:
            raise WorkloadError("a routing capture needs non-negative layers and width and a positive memory bound")
        self.num_layers = num_layers
        self.width = width
        self.resident_bytes_limit = resident_bytes
        self._chunk: dict[str, list] = {}
        self._resident = 0
        self._spool: IO[bytes] | None = None
        self._spooled: list[tuple[int, int]] = []  # (steps, entries) of each chunk in the spool, in order
        self.spooled_bytes = 0
        self.num_steps = 0
        self._reset_chunk()

    def _reset_chunk(self) -> None:
        # per step held in memory: its phase, seconds, tokens per layer and dense counts [layers, width] (made
        # sparse, all steps at once, when the chunk is spooled or read)
        self._chunk = {"phase": [], "gap_s": [], "reported_s": [], "layer_tokens": [], "dense": []}
        self._resident = 0

    @property
    def resident_bytes(self) -> int:
        """Bytes of routing held in memory now (what the bound applies to)."""
        return self._resident

    def add_step(
        self,
        phase: str,
        layers: Sequence[int] | None,
        layer_tokens: Sequence[int],
        counts: np.ndarray | None,
        gap_s: float,
        reported_s: float,
    ) -> None:
        """One step: its ``phase``, the layers that ran (None: none did) with their tokens and dense counts
        (``[len(layers), >= their experts]``), the non-expert seconds it was costed with and the latency reported."""
        if phase not in STEP_PHASES:
            raise WorkloadError(f"step phase must be one of {STEP_PHASES}, got {phase!r}")
        num_layers, width = self.num_layers, self.width
        if layers is not None and counts is not None and len(layers) == num_layers and layers[-1] == num_layers - 1:
            tokens = list(layer_tokens)  # the usual step: every layer, in order (the rows are distinct and sorted)
            dense = np.array(counts[:, :width] if counts.shape[1] > width else counts, dtype=np.int32)
        else:
            tokens = [ABSENT] * num_layers
            dense = np.zeros((num_layers, width), dtype=np.int32)
            if layers is not None and counts is not None:
                for row, layer in enumerate(layers):
                    tokens[int(layer)] = int(layer_tokens[row])
                    dense[int(layer)] = counts[row, :width]
        chunk = self._chunk
        chunk["phase"].append(STEP_PHASES.index(phase))
        chunk["gap_s"].append(float(gap_s))
        chunk["reported_s"].append(float(reported_s))
        chunk["layer_tokens"].append(tokens)
        chunk["dense"].append(dense)
        self._resident += 17 + 4 * num_layers + dense.nbytes
        self.num_steps += 1
        if self._resident > self.resident_bytes_limit:
            self._spill()

    def _chunk_arrays(self) -> list[np.ndarray]:
        """The chunk's arrays: phase, gap_s, reported_s, layer_tokens, cell sizes, experts, counts."""
        chunk = self._chunk
        arrays = [np.array(chunk[name], dtype=dtype) for name, dtype in _STEP_FIELDS]
        arrays.append(np.array(chunk["layer_tokens"], dtype=np.int32).reshape(-1, self.num_layers))
        dense = np.stack(chunk["dense"]) if chunk["dense"] else np.zeros((0, self.num_layers, self.width), np.int32)
        steps, layers, experts = np.nonzero(dense)  # C order: by step, then layer, then expert
        cells = steps * self.num_layers + layers
        size = dense.shape[0] * self.num_layers
        arrays.append(np.bincount(cells, minlength=size).astype(np.int64).reshape(-1, self.num_layers))
        arrays.append(experts.astype(np.int32))
        arrays.append(dense[steps, layers, experts].astype(np.int32))
        return arrays

    def _spill(self) -> None:
        """Append the chunk held in memory to the spool (sparse)."""
        if not self._chunk["phase"]:
            return
        if self._spool is None:
            self._spool = tempfile.TemporaryFile(prefix="ndp-ep-routing-")  # noqa: SIM115 - closed by close()
        arrays = self._chunk_arrays()
        for array in arrays:
            self._spool.write(np.ascontiguousarray(array).tobytes())
            self.spooled_bytes += array.nbytes
        self._spooled.append((len(self._chunk["phase"]), int(arrays[-1].shape[0])))
        self._reset_chunk()

    def steps(self) -> RoutingSteps:
        """Every step so far (read back from the spool), as a trace file's arrays."""
        parts: list[list[np.ndarray]] = []
        if self._spool is not None:
            self._spool.seek(0)
            for steps, entries in self._spooled:
                shapes = [(steps,), (steps,), (steps,), (steps, self.num_layers), (steps, self.num_layers)]
                dtypes = [np.uint8, np.float64, np.float64, np.int32, np.int64]
                part = [self._read(shape, dtype) for shape, dtype in zip(shapes, dtypes, strict=True)]
                part += [self._read((entries,), np.int32), self._read((entries,), np.int32)]
                parts.append(part)
            self._spool.seek(0, 2)
        if self._chunk["phase"]:
            parts.append(self._chunk_arrays())
        if not parts:
            parts.append(self._chunk_arrays())  # an empty chunk: every array empty
        joined = [np.concatenate([part[i] for part in parts]) for i in range(7)]
        offsets = np.zeros(joined[4].size + 1, dtype=np.int64)
        offsets[1:] = np.cumsum(joined[4].reshape(-1))
        return RoutingSteps(
            phase=joined[0],
            gap_s=joined[1],
            reported_s=joined[2],
            layer_tokens=joined[3].reshape(-1, self.num_layers),
            cell_offsets=offsets,
            experts=joined[5],
            counts=joined[6],
        )

    def _read(self, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        assert self._spool is not None
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return np.frombuffer(self._spool.read(size), dtype=dtype).reshape(shape)

    def close(self) -> None:
        """Delete the spool (the capture is empty afterwards)."""
        if self._spool is not None:
            self._spool.close()
            self._spool = None
        self._spooled = []
        self.spooled_bytes = 0
        self.num_steps = 0
        self._reset_chunk()
