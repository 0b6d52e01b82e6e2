"""Hardware model of an edge GPU + NDP-DIMM system for MoE inference.

Pure Python/numpy: this package never imports onnx. It describes hardware (frozen dataclasses loaded from
TOML presets), costs operations with a roofline plus fixed-overhead model, and simulates MoE layers on an
event timeline under a scheduling policy.
"""

from hw_model.errors import HardwareConfigError, HwModelError
from hw_model.hardware import (
    GpuSpec,
    HostLinkSpec,
    NdpLinkSpec,
    NdpUnitSpec,
    SystemSpec,
    list_presets,
    load_system,
)
from hw_model.policies import Policy, get_policy, policy_names, register
from hw_model.simulator import DEFAULT_POLICY, POLICIES, LayerResult, MoESimulator, StepResult
from hw_model.workload import ExpertShape, MoELayerShape, WeightFormat

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "ExpertShape",
    "LayerResult",
    "MoELayerShape",
    "MoESimulator",
    "StepResult",
    "Policy",
    "WeightFormat",
    "get_policy",
    "policy_names",
    "register",
    "GpuSpec",
    "HardwareConfigError",
    "HostLinkSpec",
    "HwModelError",
    "NdpLinkSpec",
    "NdpUnitSpec",
    "SystemSpec",
    "list_presets",
    "load_system",
]
