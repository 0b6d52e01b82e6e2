"""The result of a model diff: frozen records that the text, JSON and HTML renderers read.

A :class:`ModelDiff` holds one :class:`NodeDiff` per node that is not unchanged, one :class:`InitializerDiff`
per initializer group that is not unchanged, opset/io/function changes, the ndp-ep MoE block rewrites, and the
changed regions (connected sets of changed nodes, with one node of context) to draw.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

NODE_STATUSES = ("unchanged", "renamed", "changed", "removed", "added")
MATCH_BASES = ("name", "structure", "neighbours")
INITIALIZER_STATUSES = (
    "unchanged",
    "renamed",
    "values_changed",
    "reshaped",
    "retyped",
    "split",
    "merged",
    "removed",
    "added",
)
# Statuses that do not change what the graph computes.
EQUIVALENT_NODE_STATUSES = frozenset({"unchanged", "renamed"})
EQUIVALENT_INITIALIZER_STATUSES = frozenset({"unchanged", "renamed"})
DRAW_STATUSES = ("removed", "added", "changed", "renamed", "context")


def shape_text(shape: Iterable[int | str]) -> str:
    """A tensor shape as the diff writes it: ``[d0, d1, ...]``."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _check_choice(what: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{what} must be one of {allowed}, got {value!r}")


@dataclass(frozen=True)
class NodeRef:
    """A node of model A or B: its position in the graph, name and operator."""

    index: int
    name: str
    op_type: str
    domain: str

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ValueError("node index must be non-negative")

    @property
    def qualified_op(self) -> str:
        return self.op_type if self.domain in ("", "ai.onnx") else f"{self.domain}::{self.op_type}"

    def label(self) -> str:
        return f"{self.name or f'#{self.index}'} ({self.qualified_op})"


@dataclass(frozen=True)
class FieldChange:
    """One difference inside a matched node pair: field is op_type, domain, attribute, input or outputs."""

    field: str
    key: str
    a: str | None
    b: str | None

    def __post_init__(self) -> None:
        _check_choice("field", self.field, ("op_type", "domain", "attribute", "input", "outputs"))


@dataclass(frozen=True)
class NodeDiff:
    """A node that is renamed, changed, removed or added (unchanged nodes are only counted)."""

    status: str
    a: NodeRef | None
    b: NodeRef | None
    match: str | None
    changes: tuple[FieldChange, ...]
    block: str | None

    def __post_init__(self) -> None:
        _check_choice("node status", self.status, NODE_STATUSES)
        if self.match is not None:
            _check_choice("match basis", self.match, MATCH_BASES)
        if (self.a is None and self.status != "added") or (self.b is None and self.status != "removed"):
            raise ValueError(f"a {self.status} node needs the sides it exists on")


@dataclass(frozen=True)
class TensorRef:
    """An initializer header: name, dtype, shape and size in bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    size_bytes: int

    def __post_init__(self) -> None:
        if self.size_bytes < 0:
            raise ValueError("size_bytes must be non-negative")

    def shape_text(self) -> str:
        return shape_text(self.shape)


@dataclass(frozen=True)
class InitializerDiff:
    """A group of initializers of A that became a group of initializers of B (either side may be empty)."""

    status: str
    a: tuple[TensorRef, ...]
    b: tuple[TensorRef, ...]
    summary: str
    block: str | None
    basis: str | None

    def __post_init__(self) -> None:
        _check_choice("initializer status", self.status, INITIALIZER_STATUSES)
        if not self.a and not self.b:
            raise ValueError("an initializer diff needs at least one tensor")

    @property
    def a_bytes(self) -> int:
        return sum(t.size_bytes for t in self.a)

    @property
    def b_bytes(self) -> int:
        return sum(t.size_bytes for t in self.b)


@dataclass(frozen=True)
class OpsetChange:
    """An opset import whose version changed, or a domain added/removed (custom domains included)."""

    domain: str
    a: int | None
    b: int | None

    @property
    def status(self) -> str:
        return "added" if self.a is None else "removed" if self.b is None else "changed"


@dataclass(frozen=True)
class ValueChange:
    """A graph input or output that was added, removed, renamed or retyped/reshaped."""

    kind: str
    status: str
    position: int
    a: str | None
    b: str | None

    def __post_init__(self) -> None:
        _check_choice("value kind", self.kind, ("input", "output"))
        _check_choice("value status", self.status, ("added", "removed", "renamed", "changed"))


@dataclass(frozen=True)
class FunctionChange:
    """A model-local function (domain::name) added, removed or changed."""

    name: str
    status: str

    def __post_init__(self) -> None:
        _check_choice("function status", self.status, ("added", "removed", "changed"))


@dataclass(frozen=True)
class MoEBlockDiff:
    """One ndp-ep rewrite: the original nodes of a MoE block replaced by a sharded expert op."""

    block: str
    node: NodeRef
    direction: str
    num_experts: int | None
    top_k: int | None
    shards: int | None
    hidden: int | None
    ffn: int | None
    activation: str | None
    placement: Mapping[str, Any] | None
    replaced_nodes: tuple[NodeRef, ...]
    replaced_source: str
    missing_replaced_nodes: tuple[str, ...]
    new_nodes: tuple[NodeRef, ...]
    initializers: tuple[InitializerDiff, ...]
    contract_error: str | None = None  # the sharded node breaks graph_passes.sharded_op's contract: why

    def __post_init__(self) -> None:
        _check_choice("direction", self.direction, ("rewrite", "reverse"))
        _check_choice("replaced_source", self.replaced_source, ("metadata", "inferred"))


@dataclass(frozen=True)
class DrawNode:
    """A node of a region drawing: an id unique within its side, label text and a status colour."""

    node_id: str
    label: str
    op: str
    status: str
    weights: tuple[str, ...] = ()  # one line per weight (group) the node reads, e.g. its expert shards

    def __post_init__(self) -> None:
        _check_choice("draw status", self.status, DRAW_STATUSES)


@dataclass(frozen=True)
class DrawEdge:
    """A tensor from one drawn node to another (``source`` and ``target`` are node ids of the same side)."""

    source: str
    target: str
    tensor: str

    def __post_init__(self) -> None:
        if self.source == self.target:
            raise ValueError(f"edge {self.tensor!r} loops on {self.source}")


@dataclass(frozen=True)
class RegionSide:
    """The before or after subgraph of a region: its nodes and the edges between them."""

    nodes: tuple[DrawNode, ...]
    edges: tuple[DrawEdge, ...]
    omitted_nodes: int

    def __post_init__(self) -> None:
        if self.omitted_nodes < 0:
            raise ValueError("omitted_nodes must be non-negative")
        ids = {n.node_id for n in self.nodes}
        loose = [e.tensor for e in self.edges if e.source not in ids or e.target not in ids]
        if loose:
            raise ValueError(f"edges to nodes not drawn: {loose[:3]}")


@dataclass(frozen=True)
class Region:
    """A connected set of changed nodes (before: in A, after: in B), optionally one MoE block."""

    index: int
    title: str
    block: str | None
    a_nodes: tuple[NodeRef, ...]
    b_nodes: tuple[NodeRef, ...]
    before: RegionSide
    after: RegionSide


@dataclass(frozen=True)
class ModelSummary:
    """Headline facts of one model."""

    path: str
    ir_version: int
    producer: str
    opsets: Mapping[str, int]
    node_count: int
    initializer_count: int
    initializer_bytes: int


@dataclass(frozen=True)
class ModelDiff:
    """Everything one diff found; ``equivalent`` decides the exit code (0 equivalent, 1 different)."""

    a: ModelSummary
    b: ModelSummary
    node_counts: Mapping[str, int]
    initializer_counts: Mapping[str, int]
    nodes: tuple[NodeDiff, ...]
    initializers: tuple[InitializerDiff, ...]
    opsets: tuple[OpsetChange, ...]
    values: tuple[ValueChange, ...]
    functions: tuple[FunctionChange, ...]
    moe_blocks: tuple[MoEBlockDiff, ...]
    regions: tuple[Region, ...]
    hashed_bytes: int

    def __post_init__(self) -> None:
        if set(self.node_counts) != set(NODE_STATUSES):
            raise ValueError("node_counts must count every node status")
        if set(self.initializer_counts) != set(INITIALIZER_STATUSES):
            raise ValueError("initializer_counts must count every initializer status")

    @property
    def equivalent(self) -> bool:
        return (
            all(n.status in EQUIVALENT_NODE_STATUSES for n in self.nodes)
            and all(i.status in EQUIVALENT_INITIALIZER_STATUSES for i in self.initializers)
            and not self.opsets
            and not self.values
            and not self.functions
        )
