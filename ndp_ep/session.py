"""``ndp_ep.InferenceSession``: ONNX Runtime's session API, MoE experts run by the NDP provider.

    sess = ndp_ep.InferenceSession("model.onnx", hw="paper")
    outputs = sess.run(None, {"input_ids": ids})
    print(sess.last_report.simulated_latency_s)

Given an unconverted model, the session converts its MoE blocks in memory (the way an execution provider
claims the nodes it can run); given a converted one it runs it. Claimed expert nodes execute as custom ops
inside an ``onnxruntime.InferenceSession`` with the real numerics; each call records the routing it took,
and the report simulates exactly that routing on the configured hardware. Reports are built lazily, in
run order, when asked for, so ``run`` itself stays as fast as the numerics.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from graph_passes.convert import ConversionReport, convert, load_model
from graph_passes.rewrite import materialize_with_store
from hw_model.hardware import DTYPE_BYTES, SystemSpec, load_system
from hw_model.simulator import DEFAULT_POLICY, MoESimulator
from hw_model.workload import ExpertShape, MoELayerShape
from ndp_ep.costing import NonExpertCoster
from ndp_ep.decode_graph import MIN_OPSET, compiled_node
from ndp_ep.errors import FeedError, ModelLoadError, RunError
from ndp_ep.kernels import CUSTOM_DOMAIN, ORT_OP_TYPE, ShardedExperts, python_op_bridge
from ndp_ep.partition import annotate_placement, is_ndp_supported
from ndp_ep.report import LayerReport, RunReport

PROVIDER_NAME = "NdpExecutionProvider"
# decode steps run as ORT kernels (a second copy of the expert weights) only while that copy is small
NATIVE_DECODE_MAX_WEIGHT_BYTES = 1 << 30
ROUTING_OUTPUT = "ndp_ep/expert_ids"  # every claimed layer's expert ids of this run, flattened, in layer order
ROUTING_FLAT_SHAPE = "ndp_ep/flat_shape"
_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
    "tensor(int16)": np.int16,
}


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    values = {}
    for attribute in node.attribute:
        value = onnx.helper.get_attribute_value(attribute)
        values[attribute.name] = value.decode() if isinstance(value, bytes) else value
    return values


def has_sharded_ops(model: onnx.ModelProto) -> bool:
    return any(is_ndp_supported(n) for n in model.graph.node)


class InferenceSession:
    """An ONNX Runtime session whose MoE experts run on the (simulated) NDP provider.

    ``hw``: a preset name, a TOML file or a :class:`SystemSpec`; ``ndp_units`` overrides its unit count;
    ``policy``: a scheduling policy of :data:`hw_model.POLICIES` (default ``tp+lb+prefetch``); ``shards``:
    shards per expert when converting in memory (default: the NDP unit count); ``dtype``: the deployment
    dtype the report simulates. ``sess_options`` is copied; ``providers`` is accepted for API compatibility:
    the numerics always run on ONNX Runtime's CPU provider.
    """

    def __init__(
        self,
        model: str | Path | onnx.ModelProto,
        hw: str | Path | SystemSpec = "paper",
        *,
        ndp_units: int | None = None,
        policy: str | None = None,
        shards: int | None = None,
        dtype: str = "bf16",
        strict: bool = False,
        sess_options: ort.SessionOptions | None = None,
        providers: Sequence[str] | None = None,
    ) -> None:
        self.system = hw if isinstance(hw, SystemSpec) else load_system(hw, ndp_units)
        if isinstance(hw, SystemSpec) and ndp_units is not None:
            self.system = hw.with_ndp_units(ndp_units)
        self.dtype = dtype
        proto, base_dir = _load(model)
        if has_sharded_ops(proto):
            _load_external_data(proto, base_dir)
            converted = proto
            self.conversion_report = ConversionReport(notes=("model was already converted",))
        else:
            requested = shards or max(self.system.num_ndp_units, 1)
            rewritten, self.conversion_report = convert(proto, shards=requested, strict=strict, base_dir=base_dir)
            converted = materialize_with_store(rewritten)
        self._layers: list[MoELayerShape] = []
        self._kernel_keys: list[str] = []  # this session's Python kernels (their failures are raised by run)
        self._routing_outputs: list[str] = []
        self.native_decode_layers = 0  # claimed layers whose decode steps run as ONNX Runtime kernels
        bridge = python_op_bridge()
        ort_model = self._prepare_for_ort(converted, bridge)
        self.policy = policy or DEFAULT_POLICY
        reserved = self._non_expert_weight_bytes(converted)
        self.simulator = (
            MoESimulator(self.system, self._layers, self.policy, gpu_reserved_bytes=reserved) if self._layers else None
        )
        annotate_placement(converted, self.system, self.policy)
        self.converted_model = converted
        self._coster = NonExpertCoster(converted, self.system, dtype)
        options = _copy_session_options(sess_options)
        options.register_custom_ops_library(bridge.library_path)
        self._bridge = bridge
        self._session = _ort_session(ort_model, options)
        self._inputs = {i.name: i for i in self._session.get_inputs()}
        self._total_top_k = sum(layer.top_k for layer in self._layers)
        routing = set(self._routing_outputs)
        self._outputs = [o for o in self._session.get_outputs() if o.name not in routing]
        self._output_names = [o.name for o in self._outputs]
        self._all_output_names = self._output_names + self._routing_outputs
        self._lock = threading.Lock()
        # Runs not yet simulated: (input-shape signature id, all layers' expert ids as ONNX Runtime returned them)
        self._pending: list[tuple[int, np.ndarray | None]] = []
        self._signatures: dict[tuple, int] = {}
        self._signature_list: list[dict[str, tuple[int, ...]]] = []
        self._reports: list[RunReport] = []

    # -- preparation -------------------------------------------------------------------------------------
    def _prepare_for_ort(self, converted: onnx.ModelProto, bridge) -> onnx.ModelProto:
        """The model ONNX Runtime runs: each claimed node compiled (see :mod:`ndp_ep.decode_graph`), its
        weights taken by the kernels, and each layer's expert ids exposed as an extra output for the report."""
        model = onnx.ModelProto()
        model.CopyFrom(converted)
        graph = model.graph
        initializers = {t.name: t for t in graph.initializer}
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        claimed_weights: set[str] = set()
        rebuilt: list[onnx.NodeProto] = []
        routing_parts: list[str] = []
        is_decode: str | None = None
        for node in graph.node:
            if not is_ndp_supported(node):
                rebuilt.append(node)
                continue
            attrs = _attrs(node)
            experts = _pack_experts(node, attrs, initializers)
            claimed_weights.update(node.input[3:])
            key = bridge.registry.add(experts, owner=self)
            self._kernel_keys.append(key)
            layer_index = len(self._layers)
            self._layers.append(
                MoELayerShape(
                    name=attrs["layer"],
                    num_experts=experts.num_experts,
                    top_k=experts.top_k,
                    expert=ExpertShape(int(attrs["hidden"]), int(attrs["ffn"]), experts.gated, self.dtype),
                )
            )
            hidden, ids, weights = node.input[:3]
            prefix = f"ndp_ep/layer{layer_index}"
            flat_ids = f"{prefix}/expert_ids"  # read by the routing output and by the native decode branch
            nodes = [onnx.helper.make_node("Reshape", [ids, ROUTING_FLAT_SHAPE], [flat_ids], name=flat_ids)]
            weight_bytes = experts.first.nbytes + experts.down.nbytes
            if opset >= MIN_OPSET and weight_bytes <= NATIVE_DECODE_MAX_WEIGHT_BYTES:
                self.native_decode_layers += 1
                compiled, new_initializers, is_decode = compiled_node(
                    experts, key, prefix, hidden, ids, weights, node.output[0], is_decode, flat_ids
                )
                nodes += compiled
                graph.initializer.extend(new_initializers)
            else:  # every invocation through the Python kernel
                nodes.append(
                    onnx.helper.make_node(
                        ORT_OP_TYPE,
                        [hidden, ids, weights],
                        [node.output[0]],
                        name=node.name,
                        domain=CUSTOM_DOMAIN,
                        kernel=key,
                    )
                )
            routing_parts.append(flat_ids)
            rebuilt.extend(nodes)
        if routing_parts:  # one extra output for all layers: each fetched output costs a few microseconds
            graph.initializer.append(onnx.numpy_helper.from_array(np.array([-1], np.int64), ROUTING_FLAT_SHAPE))
            rebuilt.append(
                onnx.helper.make_node("Concat", routing_parts, [ROUTING_OUTPUT], name=ROUTING_OUTPUT, axis=0)
            )
            graph.output.append(onnx.helper.make_tensor_value_info(ROUTING_OUTPUT, onnx.TensorProto.INT64, None))
            self._routing_outputs.append(ROUTING_OUTPUT)
        del graph.node[:]
        graph.node.extend(rebuilt)
        still_used = {i for n in graph.node for i in n.input}
        for name in claimed_weights - still_used:
            graph.initializer.remove(initializers[name])
        opsets = [o for o in model.opset_import if o.domain != "ndp_ep"]
        if self._layers and not any(o.domain == CUSTOM_DOMAIN for o in opsets):
            opsets.append(onnx.helper.make_opsetid(CUSTOM_DOMAIN, 1))
        del model.opset_import[:]
        model.opset_import.extend(opsets)
        return model

    def _non_expert_weight_bytes(self, converted: onnx.ModelProto) -> float:
        """GPU memory the non-expert weights take at the simulated dtype (not available to experts)."""
        expert_weights = {i for n in converted.graph.node if is_ndp_supported(n) for i in n.input[3:]}
        elements = sum(
            int(np.prod(t.dims, dtype=np.int64)) for t in converted.graph.initializer if t.name not in expert_weights
        )
        return float(elements * DTYPE_BYTES[self.dtype])

    # -- ONNX Runtime's API ------------------------------------------------------------------------------
    def get_inputs(self):
        return self._session.get_inputs()

    def get_outputs(self):
        return list(self._outputs)

    def get_modelmeta(self):
        return self._session.get_modelmeta()

    def get_providers(self) -> list[str]:
        return [PROVIDER_NAME, *self._session.get_providers()]

    def get_session_options(self):
        return self._session.get_session_options()

    def run(self, output_names, input_feed: Mapping[str, Any], run_options=None) -> list[np.ndarray]:
        """ONNX Runtime's ``run``; feeds that do not match the inputs raise :class:`FeedError`."""
        names = list(output_names) if output_names else self._output_names
        self._bridge.install_hook()
        try:
            fetch = self._all_output_names if not output_names else names + self._routing_outputs
            results = self._session.run(fetch, input_feed, run_options)
        except (
            ort.capi.onnxruntime_pybind11_state.InvalidArgument,
            ort.capi.onnxruntime_pybind11_state.Fail,
            TypeError,
            ValueError,
            RuntimeError,
            AttributeError,  # feeds that are not a mapping (a list, None)
            ort.capi.onnxruntime_pybind11_state.RuntimeException,
        ) as exc:
            # ONNX Runtime refused: say in one line what is wrong with the feeds (FeedError) ...
            self._check_feeds(input_feed)
            # ... or, when they fit the signature, that a node failed on them (an inconsistent model)
            raise RunError(f"the model failed while running: {' '.join(str(exc).split())[:300]}") from None
        failed = self._bridge.registry.take_error(self._kernel_keys)
        if failed is not None:
            raise RunError(f"the model failed while running: {failed}")
        key = tuple((name, getattr(value, "shape", None) or np.shape(value)) for name, value in input_feed.items())
        with self._lock:
            signature = self._signatures.get(key)
            if signature is None:
                signature = self._signatures[key] = len(self._signature_list)
                self._signature_list.append(dict(key))
            self._pending.append((signature, results[-1] if self._routing_outputs else None))
        return results[: len(names)]

    def _split_routing(self, all_ids: np.ndarray) -> dict[int, np.ndarray]:
        """Per layer, the expert ids of this run (``[tokens * top_k]``), from the concatenated output."""
        tokens = all_ids.size // self._total_top_k
        routing: dict[int, np.ndarray] = {}
        start = 0
        for index, layer in enumerate(self._layers):
            stop = start + tokens * layer.top_k
            routing[index] = all_ids[start:stop]
            start = stop
        return routing

    def _check_feeds(self, input_feed: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if not isinstance(input_feed, Mapping):
            raise FeedError(f"feeds must be a mapping of input name to array, got {type(input_feed).__name__}")
        unknown = sorted(set(input_feed) - set(self._inputs))
        if unknown:
            raise FeedError(f"unknown input {unknown[0]!r}; the model's inputs are {sorted(self._inputs)}")
        missing = sorted(set(self._inputs) - set(input_feed))
        if missing:
            raise FeedError(f"missing input {missing[0]!r}; the model's inputs are {sorted(self._inputs)}")
        feeds = {}
        for name, value in input_feed.items():
            spec = self._inputs[name]
            array = np.asarray(value)
            expected = _ORT_TYPES.get(spec.type)
            if expected is not None and array.dtype != expected:
                raise FeedError(f"input {name!r} must be {np.dtype(expected).name}, got {array.dtype.name}")
            if len(spec.shape) != array.ndim:
                raise FeedError(
                    f"input {name!r} must have rank {len(spec.shape)} {spec.shape}, got shape {array.shape}"
                )
            for axis, (want, got) in enumerate(zip(spec.shape, array.shape, strict=True)):
                if isinstance(want, int) and want != got:
                    raise FeedError(f"input {name!r} dimension {axis} must be {want}, got shape {array.shape}")
            feeds[name] = array
        return feeds

    # -- reports -----------------------------------------------------------------------------------------
    @property
    def reports(self) -> list[RunReport]:
        """Reports of every run so far, in run order."""
        with self._lock:
            pending, self._pending = self._pending, []
            for signature, all_ids in pending:
                routing = self._split_routing(all_ids) if all_ids is not None else {}
                self._reports.append(self._simulate(len(self._reports), self._signature_list[signature], routing))
            return list(self._reports)

    @property
    def last_report(self) -> RunReport | None:
        reports = self.reports
        return reports[-1] if reports else None

    def _simulate(self, run_index: int, input_shapes, routing: dict[int, np.ndarray]) -> RunReport:
        layers: list[LayerReport] = []
        tokens = 0
        routing = {i: np.bincount(ids.reshape(-1), minlength=self._layers[i].num_experts) for i, ids in routing.items()}
        for layer_index in sorted(routing):
            counts = routing[layer_index]
            shape = self._layers[layer_index]
            tokens = int(counts.sum()) // shape.top_k
        phase = "prefill" if tokens > 1 else "decode"
        gpu = self._coster.cost(input_shapes)
        for layer_index in sorted(routing):
            # attention and other GPU work precede each MoE layer; prefetch copies may use that PCIe idle time
            self.simulator.advance_time_s(gpu.time_s / len(routing))
            counts = routing[layer_index]
            shape = self._layers[layer_index]
            result = self.simulator.simulate_layer(layer_index, counts.tolist(), phase)
            resources = sorted({e.resource for e in result.events})
            layers.append(
                LayerReport(
                    index=layer_index,
                    name=shape.name,
                    tokens=int(counts.sum()) // shape.top_k,
                    expert_tokens=tuple(int(c) for c in counts),
                    latency_s=result.latency_s,
                    placement=dict(result.placement),
                    busy_s={r: result.busy_s(r) for r in resources},
                    events=result.events,
                )
            )
        summary = self.simulator.summary() if self.simulator is not None else {}
        return RunReport(
            run_index=run_index,
            hardware=self.system.name,
            ndp_units=self.system.num_ndp_units,
            policy=self.policy,
            dtype=self.dtype,
            phase=phase,
            tokens=tokens,
            non_expert_gpu_s=gpu.time_s,
            layers=tuple(layers),
            simulator=summary,
        )


_COPIED_OPTIONS = (
    "intra_op_num_threads",
    "inter_op_num_threads",
    "graph_optimization_level",
    "execution_mode",
    "execution_order",
    "log_severity_level",
    "log_verbosity_level",
    "logid",
    "enable_profiling",
    "profile_file_prefix",
    "enable_cpu_mem_arena",
    "enable_mem_pattern",
    "enable_mem_reuse",
    "use_deterministic_compute",
    "optimized_model_filepath",
)


def _copy_session_options(options: ort.SessionOptions | None) -> ort.SessionOptions:
    """A fresh SessionOptions with the caller's settings: registering our op library on the caller's own
    object would make a second session created with it fail with a duplicate-kernel error."""
    fresh = ort.SessionOptions()
    if options is not None:
        for name in _COPIED_OPTIONS:
            setattr(fresh, name, getattr(options, name))
    return fresh


def _load(model: str | Path | onnx.ModelProto) -> tuple[onnx.ModelProto, Path | None]:
    """Load and check a model for running (:mod:`graph_passes.model_check`); errors become ModelLoadError."""
    from graph_passes.errors import InvalidModelError
    from graph_passes.model_check import check_runnable

    try:
        proto, base_dir = load_model(model)
        check_runnable(proto)
        return proto, base_dir
    except InvalidModelError as exc:
        raise ModelLoadError(str(exc)) from None


def _ort_session(model: onnx.ModelProto, options: ort.SessionOptions) -> ort.InferenceSession:
    """ONNX Runtime's session; a model it refuses (checked shapes, types, kernels) is a ModelLoadError."""
    try:
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except (
        ort.capi.onnxruntime_pybind11_state.Fail,
        ort.capi.onnxruntime_pybind11_state.InvalidGraph,
        ort.capi.onnxruntime_pybind11_state.InvalidArgument,
        ort.capi.onnxruntime_pybind11_state.NotImplemented,
        ort.capi.onnxruntime_pybind11_state.RuntimeException,
        ort.capi.onnxruntime_pybind11_state.InvalidProtobuf,
    ) as exc:
        text = " ".join(str(exc).split())
        raise ModelLoadError(f"ONNX Runtime cannot load the model: {text[:300]}") from None


def _load_external_data(proto: onnx.ModelProto, base_dir: Path | None) -> None:
    """Read a converted model's external weights, only from files inside its directory."""
    from graph_passes.errors import InvalidModelError
    from graph_passes.model_io import load_external_data

    try:
        load_external_data(proto, base_dir)
    except InvalidModelError as exc:
        raise ModelLoadError(str(exc)) from None


def _pack_experts(node: onnx.NodeProto, attrs: dict[str, Any], initializers) -> ShardedExperts:
    """Stack a claimed node's per-expert, per-shard weights into the kernel's arrays."""
    num_experts, shards = int(attrs["num_experts"]), int(attrs["shards"])
    count = num_experts * shards
    weights = list(node.input[3:])

    def arrays(names: list[str]) -> list[np.ndarray]:
        out = []
        for name in names:
            if name not in initializers:
                raise ModelLoadError(f"{node.name}: weight {name} is not an initializer")
            out.append(onnx.numpy_helper.to_array(initializers[name]).astype(np.float32, copy=False))
        return out

    first = np.stack(arrays(weights[:count])).reshape(num_experts, shards, *initializers[weights[0]].dims)
    down = np.stack(arrays(weights[count : 2 * count])).reshape(num_experts, shards, *initializers[weights[count]].dims)
    position = 2 * count
    first_bias = down_bias = None
    if int(attrs.get("has_first_bias", 0)):
        first_bias = np.stack(arrays(weights[position : position + count])).reshape(num_experts, shards, -1)
        position += count
    if int(attrs.get("has_down_bias", 0)):
        down_bias = np.stack(arrays(weights[position : position + num_experts]))
        position += num_experts
    if position != len(weights):
        raise ModelLoadError(f"{node.name}: expected {position} weight inputs, found {len(weights)}")
    return ShardedExperts(
        layer=str(attrs["layer"]),
        num_experts=num_experts,
        top_k=int(attrs["top_k"]),
        shards=shards,
        activation=str(attrs["activation"]),
        activation_alpha=float(attrs.get("activation_alpha", 1.702)),
        activation_limit=float(attrs.get("activation_limit", 7.0)),
        first=np.ascontiguousarray(first),
        down=np.ascontiguousarray(down),
        first_bias=first_bias,
        down_bias=down_bias,
    )
