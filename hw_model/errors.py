"""Typed errors raised by hw_model (bad hardware files, bad workloads)."""


class HwModelError(ValueError):
    """Base class of every error hw_model raises on bad input."""


class HardwareConfigError(HwModelError):
    """A hardware preset name is unknown or a hardware TOML file is invalid (the message names the field)."""


class WorkloadError(HwModelError):
    """A workload (model shape, routing trace) is inconsistent."""


class TraceFormatError(WorkloadError):
    """A routing-trace file (:mod:`hw_model.routing_trace`) is not one ndp-ep reads: truncated, foreign, another
    format version, a field of the wrong type or size, or larger than the stated limit (the message names which)."""


class CalibrationDataError(HwModelError):
    """A measured-timing CSV (``ndp-ep validate --data``) is missing, malformed or has an unknown row kind."""


class SettingsError(HwModelError):
    """A simulation setting (:class:`hw_model.settings.SimulationSettings`) is out of range or unknown; the message
    names it, and ``setting`` is its field's name (a command line names its option instead)."""

    def __init__(self, message: str, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting
