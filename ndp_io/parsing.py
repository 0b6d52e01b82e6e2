"""Reading the JSON and TOML files ndp-ep takes (genai_config.json, hardware, grids, traces) within the limits of
:mod:`ndp_io.limits`: at most :data:`MAX_CONFIG_FILE_BYTES`, nested at most :data:`MAX_PARSE_DEPTH` deep, UTF-8
(a leading byte-order mark is accepted and said nothing about). Every failure is one ``error(message)`` naming
the file: the caller's typed exception (``HardwareConfigError``, ``ModelLoadError``, ...), never a
``RecursionError`` or ``OverflowError``.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ndp_io.limits import MAX_CONFIG_FILE_BYTES, MAX_PARSE_DEPTH, limit_note

ErrorType = Callable[[str], Exception]
BOM = "\ufeff"


def nesting_depth(value: Any) -> int:
    """How deep ``value``'s dicts and lists nest (a scalar is 0), walked without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > MAX_PARSE_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _too_deep(path: Path | str) -> str:
    return f"{path}: nested more than {MAX_PARSE_DEPTH} levels deep {limit_note('MAX_PARSE_DEPTH')}"


def read_config_text(path: Path, error: ErrorType) -> str:
    """``path``'s text: a regular file of at most :data:`MAX_CONFIG_FILE_BYTES`, UTF-8, a leading BOM dropped."""
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            if stat.S_ISDIR(info.st_mode):
                raise error(f"{path}: is a directory, not a file")
            if not stat.S_ISREG(info.st_mode):
                raise error(f"{path}: not a regular file")
            if info.st_size > MAX_CONFIG_FILE_BYTES:
                raise error(f"{path}: {info.st_size:,} bytes, too large {limit_note('MAX_CONFIG_FILE_BYTES')}")
            data = handle.read(MAX_CONFIG_FILE_BYTES + 1)
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a file") from None
    except OSError as exc:
        raise error(f"{path}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    if len(data) > MAX_CONFIG_FILE_BYTES:
        raise error(f"{path}: too large {limit_note('MAX_CONFIG_FILE_BYTES')}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start})") from None
    return text[1:] if text.startswith(BOM) else text


def parse_json(text: str, origin: Path | str, error: ErrorType) -> Any:
    """``text`` parsed as JSON, nested at most :data:`MAX_PARSE_DEPTH` deep; ``error`` otherwise."""
    text = text[1:] if text.startswith(BOM) else text
    try:
        value = json.loads(text)
    except RecursionError:
        raise error(_too_deep(origin)) from None
    except ValueError as exc:  # JSONDecodeError; also Python's 4,300-digit integer guard
        raise error(f"{origin}: not valid JSON ({str(exc).splitlines()[0][:200]})") from None
    if nesting_depth(value) > MAX_PARSE_DEPTH:
        raise error(_too_deep(origin))
    return value


def parse_toml(
    text: str, origin: Path | str, error: ErrorType, loads: Callable[[str], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """``text`` parsed as TOML (by ``loads``, default the standard library's ``tomllib``; Python 3.10 callers pass
    ``tomli.loads``), nested at most :data:`MAX_PARSE_DEPTH` deep; ``error`` otherwise."""
    if loads is None:
        import tomllib  # Python 3.11+; ndp_io imports only the standard library

        loads = tomllib.loads
    text = text[1:] if text.startswith(BOM) else text
    try:
        value = loads(text)
    except RecursionError:
        raise error(_too_deep(origin)) from None
    except ValueError as exc:  # TOMLDecodeError is one; also Python's 4,300-digit integer guard
        raise error(f"{origin}: not valid TOML ({str(exc).splitlines()[0][:200]})") from None
    if nesting_depth(value) > MAX_PARSE_DEPTH:
        raise error(_too_deep(origin))
    return value


def read_json(path: Path, error: ErrorType) -> Any:
    """The JSON file at ``path`` (:func:`read_config_text`, :func:`parse_json`)."""
    return parse_json(read_config_text(path, error), path, error)


def read_toml(path: Path, error: ErrorType, loads: Callable[[str], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The TOML file at ``path`` (:func:`read_config_text`, :func:`parse_toml`)."""
    return parse_toml(read_config_text(path, error), path, error, loads)
