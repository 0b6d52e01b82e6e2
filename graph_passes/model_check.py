"""Check a model before any work: structure, tensor headers, external data, opsets, ``onnx.checker``.

:func:`check_model` is what :func:`graph_passes.model_io.load_model` runs; every failure is an
:class:`InvalidModelError` (or :class:`UnsafeModelError`) whose message names the node, tensor or opset:

* names, op types, domains and metadata are UTF-8 text;
* the graph has no cycle and no value is produced twice (by two nodes, or by a node and an input);
* every initializer's dims are non-negative and its bytes (inline, typed fields or external range) are
  exactly what its dims and dtype need — so no later reader allocates from a size the file does not back;
* external data is contained in the model's directory (:func:`graph_passes.tensors.external_range`);
* the default-domain opset is one this ONNX Runtime loads (:func:`runtime_loads_opset`: a one-node probe);
* ``onnx.checker`` (structure and operator schemas; ONNX Runtime checks shapes) on a copy whose weights
  are graph inputs of the same type and shape, and its tensor rules on each inline weight apart
  (:func:`check_schemas`).

:func:`check_runnable` adds what only running needs: every operator is known to ONNX Runtime, is ours,
or is a model-local function.
"""

from __future__ import annotations

import functools
import os

import onnx
from onnx import TensorProto

from graph_passes.errors import InvalidModelError
from graph_passes.runtime_probe import runtime_builds
from graph_passes.sharded_op import DOMAIN as SHARDED_DOMAIN
from graph_passes.sharded_op import ShardedOpError, ShardedOpSpec, is_sharded_node, parse_node
from graph_passes.tensors import PACKED_BITS, element_count, external_range, tensor_nbytes

# initializers larger than this reach onnx.checker's model check as graph inputs (:func:`_stub_copy`)
STUB_ABOVE_BYTES = 256
_TYPED_FIELDS = {
    TensorProto.FLOAT: "float_data",
    TensorProto.COMPLEX64: "float_data",
    TensorProto.DOUBLE: "double_data",
    TensorProto.COMPLEX128: "double_data",
    TensorProto.INT64: "int64_data",
    TensorProto.UINT32: "uint64_data",
    TensorProto.UINT64: "uint64_data",
    TensorProto.STRING: "string_data",
}
_DEFAULT_DOMAINS = ("", "ai.onnx")


def check_model(model: onnx.ModelProto, base_dir: str | os.PathLike[str] | None, *, schemas: bool = True) -> None:
    """Raise :class:`InvalidModelError` naming the first problem of ``model`` (see the module docstring).

    ``schemas=False`` leaves the last check, ``onnx.checker``'s (:func:`check_schemas`), to the caller: what
    comes before it is what makes a model safe to hand to ONNX Runtime (text, structure, initializer sizes,
    external data inside the model's folder, an opset it loads), so a caller may run it while ONNX Runtime
    builds a session of the model, and drop that session if it fails."""
    check_text(model)
    check_structure(model.graph)
    check_initializers(model, base_dir)
    check_opsets(model)
    if schemas:
        check_schemas(model)


def _texts(model: onnx.ModelProto):
    """``(where, value)`` for every name-like string field (protobuf hands invalid UTF-8 back as bytes)."""
    graph = model.graph
    yield "graph name", graph.name
    for opset in model.opset_import:
        yield "opset domain", opset.domain
    for entry in model.metadata_props:
        yield "model metadata", entry.key
        yield "model metadata", entry.value
    for value in [*graph.input, *graph.output, *graph.value_info]:
        yield "value name", value.name
    for tensor in graph.initializer:
        yield "initializer name", tensor.name
        for entry in tensor.external_data:
            yield f"external data of {tensor.name!r}", entry.key
            yield f"external data of {tensor.name!r}", entry.value
    for position, node in enumerate(graph.node):
        where = f"node #{position}"
        yield where, node.name
        yield where, node.op_type
        yield where, node.domain
        yield from ((where, name) for name in [*node.input, *node.output])
        yield from ((where, attribute.name) for attribute in node.attribute)
        for entry in node.metadata_props:
            yield where, entry.key
            yield where, entry.value


def check_text(model: onnx.ModelProto) -> None:
    """Every name, domain, op type and metadata entry is text (protobuf strings must be UTF-8)."""
    for where, value in _texts(model):
        if not isinstance(value, str):
            raise InvalidModelError(f"{where}: a name or metadata entry is not UTF-8 text ({bytes(value)[:40]!r})")


def check_structure(graph: onnx.GraphProto) -> None:
    """No value produced twice and no cycle among the graph's nodes (order may be arbitrary)."""
    producer: dict[str, str] = {}
    for value in graph.input:
        producer[value.name] = "graph input"
    for tensor in graph.initializer:
        producer.setdefault(tensor.name, "initializer")
    for position, node in enumerate(graph.node):
        label = node.name or f"#{position} ({node.op_type})"
        for output in node.output:
            if not output:
                continue
            if output in producer:
                raise InvalidModelError(f"value {output!r} is produced twice (by {producer[output]} and node {label})")
            producer[output] = f"node {label}"
    # Kahn's algorithm over node dependencies: anything left over lies on a cycle
    produced_by = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    waiting = [0] * len(graph.node)
    users: dict[int, list[int]] = {}
    for index, node in enumerate(graph.node):
        sources = {produced_by[i] for i in node.input if i in produced_by}
        waiting[index] = len(sources)
        for source in sources:
            users.setdefault(source, []).append(index)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    done = 0
    while ready:
        index = ready.pop()
        done += 1
        for user in users.get(index, ()):
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    if done != len(graph.node):
        stuck = next(n for i, n in enumerate(graph.node) if waiting[i] > 0)
        raise InvalidModelError(f"the graph has a cycle through node {stuck.name or stuck.op_type!r}")


def check_initializers(model: onnx.ModelProto, base_dir: str | os.PathLike[str] | None) -> None:
    """Each initializer's stored bytes match its dims and dtype; external data is contained and in range."""
    for tensor in model.graph.initializer:
        check_tensor(tensor, base_dir)


def check_tensor(tensor: TensorProto, base_dir: str | os.PathLike[str] | None) -> None:
    if tensor.data_location == TensorProto.EXTERNAL:
        if base_dir is not None:
            external_range(tensor, base_dir)
        return
    if tensor.data_type == TensorProto.STRING:
        count = element_count(tensor)
        if len(tensor.string_data) != count:
            raise InvalidModelError(f"initializer {tensor.name!r}: {len(tensor.string_data)} strings for {count}")
        return
    needed = tensor_nbytes(tensor)  # validates dims and dtype
    if tensor.HasField("raw_data") or not _typed_length(tensor):
        if len(tensor.raw_data) != needed:
            raise InvalidModelError(
                f"initializer {tensor.name!r}: raw_data has {len(tensor.raw_data)} bytes, "
                f"dims {list(tensor.dims)} need {needed}"
            )
        return
    # typed fields: one entry per element, or per packed byte for sub-byte types, two per complex element
    count = needed if tensor.data_type in PACKED_BITS else element_count(tensor)
    stored = _typed_length(tensor)
    if tensor.data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128):
        stored //= 2
    if stored != count:
        raise InvalidModelError(
            f"initializer {tensor.name!r}: {stored} values stored, dims {list(tensor.dims)} need {count}"
        )


def _typed_length(tensor: TensorProto) -> int:
    field = _TYPED_FIELDS.get(tensor.data_type, "int32_data")
    return len(getattr(tensor, field))


def _probe_model(version: int) -> bytes:
    """A one-node model importing ai.onnx opset ``version``: what ONNX Runtime is asked to load to learn whether it
    supports that opset."""
    value = onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    out = onnx.helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "probe", [value], [out])
    probe = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", version)])
    probe.ir_version = min(onnx.IR_VERSION, 10)
    return probe.SerializeToString()


@functools.lru_cache(maxsize=64)
def runtime_loads_opset(version: int) -> bool:
    """Whether the installed ONNX Runtime loads a model of ai.onnx opset ``version`` (one probe per version asked,
    a one-node model: about a millisecond, where finding the newest supported opset takes several)."""
    return runtime_builds(_probe_model(version))


@functools.lru_cache(maxsize=1)
def max_runtime_opset() -> int:
    """The newest default-domain opset the installed ONNX Runtime loads (probed from a few versions above the
    onnx package's newest downwards; asked only to word the error for a model beyond it)."""
    for version in range(onnx.defs.onnx_opset_version() + 4, 6, -1):
        if runtime_loads_opset(version):
            return version
    return onnx.defs.onnx_opset_version()


def _default_opset(model: onnx.ModelProto) -> int | None:
    """The model's ai.onnx opset version (None when it imports none)."""
    return next((o.version for o in model.opset_import if (o.domain or "") in _DEFAULT_DOMAINS), None)


def check_opsets(model: onnx.ModelProto) -> None:
    """Each domain is imported once; the default domain's opset is positive and one ONNX Runtime supports."""
    seen: dict[str, int] = {}
    for opset in model.opset_import:
        domain = opset.domain or ""
        domain = "" if domain in _DEFAULT_DOMAINS else domain
        if domain in seen and seen[domain] != opset.version:
            raise InvalidModelError(f"opset of domain {domain or 'ai.onnx'!r} is imported twice")
        seen[domain] = opset.version
        if domain == "" and opset.version < 1:  # other domains version as they like
            raise InvalidModelError(f"opset {opset.version} of domain 'ai.onnx' is not a version")
    version = seen.get("")
    if version is not None and not runtime_loads_opset(version) and version > max_runtime_opset():
        raise InvalidModelError(
            f"the model needs ai.onnx opset {version}; this ONNX Runtime supports opsets up to {max_runtime_opset()}"
        )


def _is_large(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL or tensor.ByteSize() > STUB_ABOVE_BYTES


def _stub_copy(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[TensorProto]]:
    """A copy for ``onnx.checker`` in which large or external initializers become graph inputs of the same
    type and shape, and the inline ones among them (their tensor rules are checked one by one).

    The checker and shape inference see every value, and the model check does not serialize the weights:
    a converted model's weights are hundreds of tensors of a few kilobytes, which the checker would copy
    and parse once more. Without any such initializer the copy is a plain copy (one protobuf copy, about ten
    times faster than copying a few hundred small initializers one by one)."""
    from graph_passes.graph_index import copy_without_initializers

    if not any(_is_large(tensor) for tensor in model.graph.initializer):
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        return probe, []
    probe = copy_without_initializers(model)
    inputs = {v.name for v in probe.graph.input}
    small = []
    stubbed = []
    for tensor in model.graph.initializer:
        if not _is_large(tensor):
            small.append(tensor)
            continue
        if tensor.data_location != TensorProto.EXTERNAL:
            stubbed.append(tensor)
        if tensor.name not in inputs:
            probe.graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
    probe.graph.initializer.extend(small)  # one call: the initializers keep their order
    return probe, stubbed


_RUNTIME_ONLY_DOMAIN = "ndp_ep.onnxruntime_default_domain"


def check_schemas(model: onnx.ModelProto) -> None:
    """``onnx.checker`` on the model, the last check of :func:`check_model` (structure and operator schemas):
    its tensor rules on each inline initializer the stub copy leaves out (first, as the checker checks
    initializers before nodes), then its model check on the stub copy. External initializers are left to
    :func:`check_tensor` (the checker would look for their files relative to the working directory)."""
    stub, stubbed = _stub_copy(model)
    # ONNX Runtime registers a few operators in the default domain that onnx does not know (GenAI exports use
    # SimplifiedLayerNormalization): the checker sees those nodes under a custom domain, checked by ORT itself
    runtime_only = [
        node
        for node in stub.graph.node
        if node.domain in _DEFAULT_DOMAINS
        and not onnx.defs.has(node.op_type)
        and ("", node.op_type) in _runtime_operators()
    ]
    for node in runtime_only:
        node.domain = _RUNTIME_ONLY_DOMAIN
    if runtime_only:
        stub.opset_import.append(onnx.helper.make_opsetid(_RUNTIME_ONLY_DOMAIN, 1))
    try:
        for tensor in stubbed:  # the same rules as inside check_model, on a few kilobytes at a time
            onnx.checker.check_tensor(tensor)
        # structure and schemas only: strict shape inference rejects models ONNX Runtime runs (GenAI exports
        # declare shapes its inference disagrees with); ONNX Runtime checks shapes when it loads the model
        onnx.checker.check_model(stub, full_check=False)
    except Exception as exc:  # noqa: BLE001 - ValidationError, InferenceError, UnicodeDecodeError...: all "invalid"
        text = " ".join(str(exc).split()) or type(exc).__name__  # the checker's message spans several lines
        raise InvalidModelError(f"not a valid ONNX model: {text if len(text) <= 300 else text[:297] + '...'}") from None


@functools.lru_cache(maxsize=1)
def _runtime_operators() -> frozenset[tuple[str, str]]:
    from onnxruntime.capi import _pybind_state

    return frozenset(((s.domain or ""), s.name) for s in _pybind_state.get_all_operator_schema())


def check_runnable(model: onnx.ModelProto) -> None:
    """Every node's operator is known to ONNX Runtime, is ``ndp_ep``'s (a converted node that obeys the op
    contract), or is a model-local function.

    A default-domain operator the onnx package defines at or below the model's opset is known to an ONNX Runtime
    that loads that opset (it carries the standard's schemas up to it), so ONNX Runtime's own schema list (about
    ten milliseconds to list) is read only for the other operators (contrib ops, another domain's, unknown ones).
    """
    local = {(f.domain or "", f.name) for f in model.functions}
    version = _default_opset(model)
    standard_up_to = version if version is not None and runtime_loads_opset(version) else None
    initializers = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        domain = "" if node.domain in _DEFAULT_DOMAINS else node.domain
        key = (domain, node.op_type)
        if is_sharded_node(node):
            check_sharded_node(node, initializers)
            continue
        standard = domain == "" and standard_up_to is not None and onnx.defs.has(node.op_type, standard_up_to, "")
        if domain != SHARDED_DOMAIN and (key in local or standard or key in _runtime_operators()):
            continue
        raise InvalidModelError(
            f"node {node.name or node.op_type!r}: operator {domain or 'ai.onnx'}::{node.op_type} is not known to "
            "ONNX Runtime"
        )


def check_converted_nodes(model: onnx.ModelProto) -> None:
    """Every converted node obeys the op contract (the part of :func:`check_runnable` that needs neither onnx's
    schemas nor ONNX Runtime's operator list: what the provider's kernels rely on)."""
    initializers = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if is_sharded_node(node):
            check_sharded_node(node, initializers)


def check_sharded_node(node: onnx.NodeProto, initializers: dict[str, TensorProto]) -> ShardedOpSpec:
    """A converted node obeys the op contract and its float weights are initializers of the contract's shapes."""
    try:
        spec = parse_node(node)
    except ShardedOpError as exc:
        raise InvalidModelError(f"converted node is not valid: {exc}") from None
    groups = spec.split_inputs(list(node.input[3:]))
    expected = {group: spec.float_shape(group) for group in ("first", "down", "first_bias", "down_bias")}
    for group, names in groups.items():
        for name in names:
            tensor = initializers.get(name)
            if tensor is None:
                raise InvalidModelError(f"{node.name}: weight {name!r} is not an initializer")
            if spec.quantized or group not in expected:
                continue
            if tuple(tensor.dims) != expected[group]:
                raise InvalidModelError(
                    f"{node.name}: weight {name!r} has shape {list(tensor.dims)}, the node's attributes need "
                    f"{list(expected[group])}"
                )
    return spec
