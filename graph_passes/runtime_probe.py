"""Whether the installed ONNX Runtime builds a small model, asked without importing onnx.

:func:`runtime_builds` builds a session of the given model with the options of a probe (errors unlogged, one
thread, no graph optimizations): :func:`graph_passes.model_check.runtime_loads_opset` asks it about a one-node
model of the opset in question. :data:`WARM_UP_MODEL` is such a probe serialized ahead (an ``Identity`` of ai.onnx
opset 17, which every ONNX Runtime the provider supports loads; tests/core/test_startup.py checks the bytes
against :func:`graph_passes.model_check._probe_model`): building it before onnx is even imported does ONNX
Runtime's one-time set-up of a process's first session (about 3 ms, without the GIL) on a thread of its own
(:func:`ndp_ep.ep.warm_up`), which the opset probe would otherwise pay on the caller's thread.
"""

from __future__ import annotations

WARM_UP_OPSET = 17
WARM_UP_MODEL = bytes.fromhex(
    "080a3a3b0a100a017812017922084964656e74697479120570726f62655a0f0a0178120a0a08080112040a020801620f0a0179"
    "120a0a08080112040a02080142040a001011"
)


def runtime_builds(model: bytes) -> bool:
    """Whether ONNX Runtime builds a session of ``model`` on its CPU provider (any refusal: False)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.intra_op_num_threads = 1  # no thread pool to start and stop for a probe
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - any refusal means "no"
        return False
    return True
