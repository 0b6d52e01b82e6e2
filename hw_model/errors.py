"""Typed errors raised by hw_model (bad hardware files, bad workloads)."""


class HwModelError(ValueError):
    """Base class of every error hw_model raises on bad input."""


class HardwareConfigError(HwModelError):
    """A hardware preset name is unknown or a hardware TOML file is invalid (the message names the field)."""


class WorkloadError(HwModelError):
    """A workload (model shape, routing trace) is inconsistent."""


class CalibrationDataError(HwModelError):
    """A measured-timing CSV (``ndp-ep validate --data``) is missing, malformed or has an unknown row kind."""
