"""The output formats of ``ndp-ep diff``: one module ``ndp_ep/diff/render_<format>.py`` per format, found by name.

A renderer module declares::

    FORMAT = "text"                      # the name ``ndp-ep diff --format`` takes
    DESCRIPTION = "readable text ..."    # one line for ``--help``
    def render(diff: ModelDiff, options: RenderOptions) -> str: ...

Adding a format means adding such a module and nothing else: :func:`renderers` imports every ``render_*``
module of this package (``pkgutil`` over the package's path), and the command's ``--format`` choices and help
come from what it finds.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from ndp_ep.diff.result import ModelDiff

PREFIX = "render_"


@dataclass(frozen=True)
class RenderOptions:
    """What the command line asks of a renderer; a renderer uses the options that apply to it."""

    colour: bool = False  # ANSI colours (text)
    max_items: int = 50  # entries per section, 0 for all (text)


@dataclass(frozen=True)
class Renderer:
    format: str
    description: str
    render: Callable[[ModelDiff, RenderOptions], str]


def _renderer(module: ModuleType) -> Renderer:
    name, description, render = (getattr(module, a, None) for a in ("FORMAT", "DESCRIPTION", "render"))
    if not isinstance(name, str) or not name or not isinstance(description, str) or not callable(render):
        raise TypeError(f"{module.__name__} is not a diff renderer: it needs FORMAT, DESCRIPTION and render()")
    return Renderer(name, description, render)


def renderers() -> dict[str, Renderer]:
    """Every renderer module of this package, by format name (sorted)."""
    package = importlib.import_module(__package__)
    found: dict[str, Renderer] = {}
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith(PREFIX):
            continue
        renderer = _renderer(importlib.import_module(f"{__package__}.{info.name}"))
        if renderer.format in found:
            raise TypeError(f"two diff renderers declare the format {renderer.format!r}")
        found[renderer.format] = renderer
    return dict(sorted(found.items()))
