"""What-if placement: experts pinned per layer to the GPU or to the NDP units, and a cap on the GPU expert pool.

A placement file (TOML; the ``placement`` setting, ``--placement FILE.toml``)::

    gpu_pool_cap_bytes = 4e9       # optional: the GPU expert pool holds at most this many bytes
    [layers.all]                   # every MoE layer
    gpu = [0, 3]                   # these experts always run on the GPU, their weights resident there
    [layers.5]                     # layer 5 (its index among the MoE layers, from 0) in addition
    ndp = [1, 2]                   # these always run on the NDP units (sliced over them, or whole on their home
                                   # unit for policies without tensor parallelism)

The policy places each invocation as usual; then every pinned expert it activated is moved where the pin says
(:meth:`hw_model.layout.InvocationLayout.repin`) and the invocation's latency is the pinned one. The simulator
adds up, per invocation, the pinned latency less the policy's own (``pin_cost_s`` in its summary): what the pins
cost (positive) or saved (negative) against the policy's choice. The GPU-pinned experts' weights are taken out of
the GPU expert pool (they stay resident), after the cap. Errors name the file and the field
(:class:`~hw_model.errors.SettingsError`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hw_model.errors import SettingsError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

EVERY_LAYER = "all"
MAX_PINS_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class PlacementPins:
    """Experts pinned per layer (``every``: to every layer, ``layers``: to one MoE layer index) and the pool cap
    (0: none)."""

    gpu_every: frozenset[int] = frozenset()
    ndp_every: frozenset[int] = frozenset()
    gpu_layers: Mapping[int, frozenset[int]] = field(default_factory=dict)
    ndp_layers: Mapping[int, frozenset[int]] = field(default_factory=dict)
    gpu_pool_cap_bytes: float = 0.0
    source: str = ""

    def gpu(self, layer: int) -> frozenset[int]:
        return self.gpu_every | self.gpu_layers.get(layer, frozenset())

    def ndp(self, layer: int) -> frozenset[int]:
        return self.ndp_every | self.ndp_layers.get(layer, frozenset())

    def check(self, experts_per_layer: list[int]) -> None:
        """:class:`SettingsError` for a pin naming a layer or an expert the model does not have, or an expert
        pinned to both the GPU and the NDP units."""
        for layer in (*self.gpu_layers, *self.ndp_layers):
            if layer >= len(experts_per_layer):
                raise SettingsError(
                    f"{self.source}: layers.{layer}: the model has {len(experts_per_layer)} MoE layers", "placement"
                )
        for layer, experts in enumerate(experts_per_layer):
            gpu, ndp = self.gpu(layer), self.ndp(layer)
            both = sorted(gpu & ndp)
            if both:
                raise SettingsError(f"{self.source}: expert {both[0]} of layer {layer} pinned to both", "placement")
            beyond = sorted(e for e in gpu | ndp if e >= experts)
            if beyond:
                raise SettingsError(
                    f"{self.source}: layer {layer} has {experts} experts, expert {beyond[0]} pinned", "placement"
                )


def _experts(source: str, where: str, value: object) -> frozenset[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise SettingsError(f"{source}: {where} must be a list of expert ids (integers >= 0)", "placement")
    return frozenset(value)


def pins_from_dict(data: Mapping[str, Any], source: str = "placement") -> PlacementPins:
    """A :class:`PlacementPins` from a parsed placement file (format in the module docstring)."""
    unknown = sorted(set(data) - {"gpu_pool_cap_bytes", "layers"})
    if unknown:
        raise SettingsError(f"{source}: unknown field {unknown[0]!r} (known: gpu_pool_cap_bytes, layers)", "placement")
    cap = data.get("gpu_pool_cap_bytes", 0.0)
    if isinstance(cap, bool) or not isinstance(cap, int | float) or not 0 <= cap < float("inf"):
        raise SettingsError(f"{source}: gpu_pool_cap_bytes must be a non-negative number of bytes", "placement")
    layers = data.get("layers", {})
    if not isinstance(layers, dict):
        raise SettingsError(f"{source}: layers must be a table of layer tables", "placement")
    every: dict[str, frozenset[int]] = {"gpu": frozenset(), "ndp": frozenset()}
    per: dict[str, dict[int, frozenset[int]]] = {"gpu": {}, "ndp": {}}
    for key, table in layers.items():
        if key != EVERY_LAYER and not (key.isascii() and key.isdigit()):
            raise SettingsError(f"{source}: layers.{key}: a layer is {EVERY_LAYER!r} or an index", "placement")
        if not isinstance(table, dict) or set(table) - {"gpu", "ndp"}:
            raise SettingsError(f"{source}: layers.{key} may only hold gpu and ndp lists", "placement")
        for where in ("gpu", "ndp"):
            if where in table:
                experts = _experts(source, f"layers.{key}.{where}", table[where])
                if key == EVERY_LAYER:
                    every[where] = experts
                else:
                    per[where][int(key)] = experts
    return PlacementPins(every["gpu"], every["ndp"], per["gpu"], per["ndp"], float(cap), source)


def load_pins(path: str | os.PathLike[str]) -> PlacementPins:
    """Read a placement file; :class:`SettingsError` naming it when it is missing, too large or invalid."""
    file = Path(path)
    try:
        if file.stat().st_size > MAX_PINS_FILE_BYTES:
            raise SettingsError(f"{file}: a placement file is at most {MAX_PINS_FILE_BYTES:,} bytes", "placement")
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SettingsError(f"placement: no such file {str(file)!r}", "placement") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"{file}: not a readable TOML placement file ({exc})", "placement") from None
    return pins_from_dict(data, str(file))
