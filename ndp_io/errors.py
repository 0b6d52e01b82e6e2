"""Typed errors of :mod:`ndp_io`; the CLI prints each as one line with exit code 2."""

from __future__ import annotations


class FileSafetyError(ValueError):
    """Base class: an output cannot be written safely."""


class ClobberError(FileSafetyError):
    """An output path is (or resolves to) one of the command's input files."""


class OutputWriteError(FileSafetyError):
    """Writing an output failed (full disk, read-only file system, permission denied, bad name)."""
