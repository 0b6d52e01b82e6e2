"""Running a check's probe model once on ONNX Runtime's CPU provider, with its weights read from a
:class:`graph_passes.weights.WeightStore`, handed over as arrays, fed as inputs or mapped by ONNX Runtime from the
model's own files; fused nodes stock ONNX Runtime refuses are computed by :mod:`graph_passes.fused_reference`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from graph_passes import fused_reference
from graph_passes.weights import WeightStore


def _capture(
    probe: onnx.ModelProto,
    store: WeightStore,
    feeds: dict[str, np.ndarray],
    arrays: Mapping[str, np.ndarray] | None = None,
    background: bool = False,
    map_files: bool = False,
) -> dict[str, np.ndarray]:
    """Run ``probe`` once on ``feeds``; every weight array it loaded is released on return. External
    initializers are read from ``store`` unless ``arrays`` holds their values; with ``map_files`` ONNX Runtime
    reads those ``arrays`` does not hold from their files in the model's folder itself (it maps them: float32
    weights are used in place, nothing is copied here). ``background``: the run
    overlaps the caller's writing (a deferred check), so it takes one thread that never spins. A fused node stock
    ONNX Runtime's CPU kernels refuse (:func:`graph_passes.fused_reference.needs_reference`) is computed by the
    float64 reading of its documented semantics instead, from what ONNX Runtime computed of its inputs."""
    referenced = [n for n in probe.graph.node if fused_reference.needs_reference(n)]
    if not referenced:
        return _capture_with_onnxruntime(probe, store, feeds, arrays, background, map_files)
    held = {t.name: t for t in probe.graph.initializer}
    rest = _without_nodes(probe, referenced)
    captured = (
        _capture_with_onnxruntime(rest, store, feeds, arrays, background, map_files)
        if rest.graph.output
        else dict(feeds)
    )

    def value(name: str) -> np.ndarray:
        if name in captured:
            return captured[name]
        if arrays and name in arrays:
            return arrays[name]
        tensor = held[name]
        return store.full(name) if tensor.data_location == onnx.TensorProto.EXTERNAL else numpy_helper.to_array(tensor)

    for node in referenced:
        inputs = {label: value(name) for label, name in fused_reference.input_labels(node).items()}
        captured[node.output[0]] = fused_reference.evaluate(node, inputs.get).astype(np.asarray(inputs["x"]).dtype)
    return captured


def _without_nodes(probe: onnx.ModelProto, removed: list[onnx.NodeProto]) -> onnx.ModelProto:
    """``probe`` without ``removed``: their outputs are no longer produced, the values they read that the rest
    computes become outputs, and the initializers only they read are dropped."""
    out = onnx.ModelProto()
    out.CopyFrom(probe)
    names = {n.name for n in removed}
    kept = [n for n in probe.graph.node if n.name not in names]
    del out.graph.node[:]
    out.graph.node.extend(kept)
    made = {o for n in kept for o in n.output if o}
    reads = {i for n in kept for i in n.input if i}
    gone = {o for n in removed for o in n.output}
    outputs = [o for o in probe.graph.output if o.name not in gone]
    outputs += [onnx.helper.make_empty_tensor_value_info(i) for n in removed for i in n.input if i in made]
    del out.graph.output[:]
    out.graph.output.extend({o.name: o for o in outputs}.values())
    initializers = [t for t in probe.graph.initializer if t.name in reads]
    del out.graph.initializer[:]
    out.graph.initializer.extend(initializers)
    return out


def _capture_with_onnxruntime(
    probe: onnx.ModelProto,
    store: WeightStore,
    feeds: dict[str, np.ndarray],
    arrays: Mapping[str, np.ndarray] | None,
    background: bool,
    map_files: bool = False,
) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if background:
        # ORT's default pool takes every core and its idle workers spin: on a small machine they would
        # compete with the writer for CPU they do not need (a probe runs 2 tokens)
        options.intra_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # no arena: the large per-slot weight copies a gathered block makes are returned to the system at once
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    # basic fusions only: the extended ones' constant folding and layout passes cost more than the one run
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    # external weights are handed over as arrays (no copy into the proto); a model loaded from bytes
    # could not resolve their relative file names anyway
    arrays = arrays or {}
    original = probe
    external = [t.name for t in probe.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    map_files = map_files and store is not None and store.base_dir is not None
    if map_files:
        options.add_session_config_entry(MODEL_FOLDER_CONFIG, str(store.base_dir))
        external = [n for n in external if n in arrays]  # the rest: read by ONNX Runtime from their files
    weights = {n: np.ascontiguousarray(arrays[n] if n in arrays else store.full(n)) for n in external}
    fed = _fed_weights(probe, external)
    if fed:
        probe = _weights_as_inputs(probe, fed)
    handed = [n for n in external if n not in fed]
    if handed:
        options.add_external_initializers(handed, [ort.OrtValue.ortvalue_from_numpy(weights[n]) for n in handed])
    try:
        session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception:
        if not map_files:
            raise
        # an ONNX Runtime that cannot read a model's data from a folder: hand the values over instead
        return _capture_with_onnxruntime(original, store, feeds, arrays, background, map_files=False)
    names = [o.name for o in session.get_outputs()]
    run_feeds = {i.name: weights[i.name] if i.name in fed else feeds[i.name] for i in session.get_inputs()}
    outputs = dict(zip(names, session.run(names, run_feeds), strict=True))
    return {**{n: v for n, v in run_feeds.items() if n not in fed}, **outputs}


MODEL_FOLDER_CONFIG = "session.model_external_initializers_file_folder_path"  # where a model from bytes has its data

FED_WEIGHT_TYPES = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
    onnx.TensorProto.DOUBLE,
}


def _fed_weights(probe: onnx.ModelProto, external: list[str]) -> set[str]:
    """The external float initializers of ``probe`` that only standard ONNX ops read: they can be run-time inputs.

    ONNX Runtime copies every initializer handed over with ``add_external_initializers`` when the session is
    created (a second copy of the sampled experts), while it reads a fed array in place. Standard ops compute
    the same from an input as from an initializer; contrib ops (a fused MoE, ``MatMulNBits``) may need constant
    weights, and a node with a subgraph may read an initializer implicitly, so neither has its weights fed.
    """
    if any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in probe.graph.node for a in n.attribute
    ):
        return set()
    types = {t.name: t.data_type for t in probe.graph.initializer}
    fed = {n for n in external if types[n] in FED_WEIGHT_TYPES} - {i.name for i in probe.graph.input}
    for node in probe.graph.node:
        if node.domain not in ("", "ai.onnx"):
            fed.difference_update(node.input)
    return fed


def _weights_as_inputs(probe: onnx.ModelProto, fed: set[str]) -> onnx.ModelProto:
    """A copy of ``probe`` whose initializers ``fed`` are graph inputs of the same type and shape."""
    copy = onnx.ModelProto()
    copy.CopyFrom(probe)
    kept = [t for t in copy.graph.initializer if t.name not in fed]
    inputs = [
        onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in copy.graph.initializer
        if t.name in fed
    ]
    del copy.graph.initializer[:]
    copy.graph.initializer.extend(kept)
    copy.graph.input.extend(inputs)
    return copy
