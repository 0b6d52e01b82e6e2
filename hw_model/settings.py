"""One run's simulation settings: a frozen, validated :class:`SimulationSettings`, built once where a run starts and
passed down whole.

Every entry builds it once: the ``ndp-ep`` commands from their options (:func:`ndp_ep.cli_args.settings_from_args`),
``ndp_ep.InferenceSession``, ``ndp_ep.session_options`` and a plain session's reports from their keyword arguments
or provider options (:func:`ndp_ep.ep.settings_of`), ``ndp_ep.GenerationReports``, ``bench`` (one per job) and
``sweep`` (one per point). The simulator reads its policy and tuning knobs from it
(:meth:`hw_model.simulator.MoESimulator.from_settings`). Each setting is checked here and only here, raising
:class:`~hw_model.errors.SettingsError` (an :class:`~hw_model.errors.HwModelError`: the command line's one-line
exit 2), and has its default here; a field's ``metadata["help"]`` is the help text of its command-line option.

The tuning knobs are declared in :class:`hw_model.tuning.SimulatorTuning`, the base class, which the policies
read without importing this module (which imports theirs to check a policy's name). How to add a setting:
docs/settings.md.
"""

from __future__ import annotations

import os
from dataclasses import InitVar, dataclass, field, fields, replace
from typing import Any

from hw_model.errors import SettingsError
from hw_model.hardware import DTYPE_BYTES, MAX_NDP_UNITS, SystemSpec, load_system
from hw_model.tuning import SimulatorTuning, setting

DEFAULT_HW = "paper"
DEFAULT_POLICY = "tp+lb+prefetch"

__all__ = ["DEFAULT_HW", "DEFAULT_POLICY", "SimulationSettings", "SimulatorTuning", "check_ndp_units"]


def check_ndp_units(value: object, name: str = "ndp_units") -> int:
    """``value`` when it is a count of NDP units, 1 to :data:`hw_model.hardware.MAX_NDP_UNITS` (the bound every
    hardware system has), else :class:`SettingsError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingsError(f"{name}: expected an integer from 1 to {MAX_NDP_UNITS}, got {value!r}", "ndp_units")
    if not 1 <= value <= MAX_NDP_UNITS:
        raise SettingsError(f"{name}: expected an integer from 1 to {MAX_NDP_UNITS}, got {value:,}", "ndp_units")
    return value


@dataclass(frozen=True, kw_only=True)
class SimulationSettings(SimulatorTuning):
    """What one run simulates: the hardware, its NDP units, the scheduling policy, the dtype experts are costed in,
    and the simulator's tuning knobs (:class:`SimulatorTuning`). ``system`` is the hardware loaded, with
    ``ndp_units`` applied (a bad preset name or hardware file raises :class:`~hw_model.errors.HardwareConfigError`)."""

    hw: str | os.PathLike[str] | SystemSpec = setting(
        DEFAULT_HW, "hardware: a preset ({presets}) or a TOML file with the same fields", metavar="NAME|FILE.toml"
    )
    ndp_units: int | None = setting(
        None, "number of NDP units (1-{max_units}; default: the preset's own count)", metavar="N"
    )
    policy: str = setting(DEFAULT_POLICY, "scheduling policy the simulator applies: {policies}", metavar="POLICY")
    dtype: str | None = setting(
        None,
        "cost every expert's weights in this dtype (default: quantized experts as stored, float experts in bf16, "
        "the deployment dtype)",
    )
    placement: str | os.PathLike[str] | None = setting(
        None,
        "a placement file (TOML) pinning experts per MoE layer to the GPU or the NDP units and/or capping the GPU "
        "expert pool; reports say what the pins cost against the policy's own placement (docs/settings.md)",
        metavar="FILE.toml",
    )
    system: SystemSpec = field(init=False, repr=False, compare=False)
    pins: Any = field(init=False, repr=False, compare=False)  # hw_model.pins.PlacementPins of ``placement``, or None
    # the system already loaded from the same ``hw`` and ``ndp_units`` (:meth:`replace` hands it on)
    loaded: InitVar[SystemSpec | None] = None

    def __post_init__(self, loaded: SystemSpec | None = None) -> None:
        super().__post_init__()
        if self.ndp_units is not None:
            check_ndp_units(self.ndp_units)
        if not isinstance(self.policy, str):
            raise SettingsError(f"policy must be a policy's name, got {self.policy!r}", "policy")
        if self.policy != DEFAULT_POLICY:  # the policies are imported only to check another (a session imports
            from hw_model.policies import get_policy  # them while ONNX Runtime builds its own: issue 9)

            get_policy(self.policy)
        if self.dtype is not None and self.dtype not in DTYPE_BYTES:
            raise SettingsError(f"unknown dtype {self.dtype!r} (known: {', '.join(sorted(DTYPE_BYTES))})", "dtype")
        hw = self.hw
        if loaded is not None:
            system = loaded
        elif isinstance(hw, SystemSpec):
            system = hw if self.ndp_units is None else hw.with_ndp_units(self.ndp_units)
        elif isinstance(hw, str | os.PathLike):
            system = load_system(os.fspath(hw), self.ndp_units)
        else:
            raise SettingsError(f"hw must be a preset name, a hardware TOML file or a SystemSpec, got {hw!r}", "hw")
        object.__setattr__(self, "system", system)  # derived field of a frozen dataclass
        pins = None
        if self.placement is not None:
            if not isinstance(self.placement, str | os.PathLike):
                raise SettingsError(f"placement must be a placement file's path, got {self.placement!r}", "placement")
            from hw_model.pins import load_pins

            pins = load_pins(self.placement)
        object.__setattr__(self, "pins", pins)

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled (to a bench or sweep worker) without the loaded system, which is loaded again from ``hw``
        return (_rebuild, ({f.name: getattr(self, f.name) for f in fields(self) if f.init},))

    def replace(self, **changes: Any) -> SimulationSettings:
        """A copy with ``changes`` applied (validated again; the hardware is not loaded again unless ``hw`` or
        ``ndp_units`` changes)."""
        same_system = "hw" not in changes and "ndp_units" not in changes
        return replace(self, loaded=self.system if same_system else None, **changes)

    @classmethod
    def option_fields(cls) -> tuple[Any, ...]:
        """The fields a command line may set (all but the derived ``system``), in declaration order."""
        return tuple(f for f in fields(cls) if f.init and f.metadata.get("cli", True))


def _rebuild(values: dict[str, Any]) -> SimulationSettings:
    return SimulationSettings(**values)
