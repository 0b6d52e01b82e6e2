"""Hardware model of an edge GPU + NDP-DIMM system for MoE inference.

Pure Python/numpy: this package never imports onnx. It describes hardware (frozen dataclasses loaded from
TOML presets), costs operations with a roofline plus fixed-overhead model, and simulates MoE layers on an
event timeline under a scheduling policy.

``pip install`` may compile some modules with mypyc into extension modules that are imported in place of their
``.py`` files (:func:`compiled_modules` names them); the sources stay pure Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

# public name -> module that defines it, imported on first access: ``import hw_model.hardware`` (what a
# command line needs to list the presets) does not load the simulator and its policies
_LAZY = {
    "DEFAULT_POLICY": "hw_model.settings",
    "SettingsError": "hw_model.errors",
    "SimulationSettings": "hw_model.settings",
    "POLICIES": "hw_model.simulator",
    "ExpertShape": "hw_model.workload",
    "LayerResult": "hw_model.step_results",
    "MoELayerShape": "hw_model.workload",
    "MoESimulator": "hw_model.simulator",
    "StepResult": "hw_model.step_results",
    "Policy": "hw_model.policies",
    "WeightFormat": "hw_model.workload",
    "get_policy": "hw_model.policies",
    "policy_names": "hw_model.policies",
    "register": "hw_model.policies",
    "GpuSpec": "hw_model.hardware",
    "HardwareConfigError": "hw_model.errors",
    "HostLinkSpec": "hw_model.hardware",
    "HwModelError": "hw_model.errors",
    "NdpLinkSpec": "hw_model.hardware",
    "NdpUnitSpec": "hw_model.hardware",
    "SystemSpec": "hw_model.hardware",
    "list_presets": "hw_model.hardware",
    "load_system": "hw_model.hardware",
}
__all__ = sorted([*_LAZY, "compiled_modules"])


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hw_model' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def compiled_modules(package_dir: Path | str | None = None) -> tuple[str, ...]:
    """The names of hw_model's modules (and subpackages, such as ``policies``) that import from an extension module
    (compiled by mypyc on install), not a ``.py`` file; ``()`` in the source tree. Found by listing the package
    directory (``package_dir``, default this package's): nothing is imported."""
    from pathlib import Path

    directory = Path(__file__).parent if package_dir is None else Path(package_dir)
    names = {extension_module_name(path.name) for path in directory.iterdir() if path.is_file()}
    names.update(
        path.name
        for path in directory.iterdir()
        if path.is_dir() and any(extension_module_name(inner.name) == "__init__" for inner in path.iterdir())
    )
    return tuple(sorted(name for name in names if name is not None))


def extension_module_name(file_name: str) -> str | None:
    """The module an extension-module file holds (``simulator`` for ``simulator.cpython-311-x86_64-linux-gnu.so``),
    or None for any other file."""
    from importlib.machinery import EXTENSION_SUFFIXES

    for suffix in sorted(EXTENSION_SUFFIXES, key=len, reverse=True):  # ".cpython-311-...so" before ".so"
        if file_name.endswith(suffix) and file_name[: -len(suffix)].isidentifier():
            return file_name[: -len(suffix)]
    return None
