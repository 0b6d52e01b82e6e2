"""Compare initializers by name, shape, dtype and content hash, and explain splits the way a person would.

Matching order: same name (then: unchanged / values_changed / reshaped / retyped), same content under another
name (renamed: only tensors with a same-dtype, same-shape counterpart are hashed), ndp-ep expert shards,
generic splits/merges by name prefix and element totals, and what is left is removed or added.

ndp-ep expert shards in B are named ``{block}.experts.{e}.shard{s}.{kind}`` (read with
:func:`graph_passes.sharded_op.parse_shard_name`, the op contract's parser); the stacked tensors of A they
came from are found among the removed initializers consumed by the block's replaced nodes (or named under the
block), by kind (gate/up vs down) and element totals::

    A: model.layers.0.mlp.experts.gate_up_proj [8, 128, 64]
    B: model.layers.0.mlp.experts.{0..7}.shard{0,1}.gate_up [64, 64]
    => "model.layers.0.mlp experts gate_up [8, 128, 64] → 8 experts × 2 shards of [64, 64]"
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from graph_passes.sharded_op import parse_shard_name
from ndp_ep.diff.loading import ContentHasher, InitializerRecord, ModelSnapshot
from ndp_ep.diff.result import InitializerDiff, TensorRef, shape_text

SPLIT_SEPARATORS = (".", "_", "/", ":")


def tensor_ref(record: InitializerRecord) -> TensorRef:
    return TensorRef(record.name, record.dtype, record.shape, record.size_bytes)


def normalise_name(name: str) -> str:
    """'/model/layers.0/mlp/experts/MatMul' and 'model.layers.0.mlp.experts.MatMul' normalise alike."""
    return re.sub(r"[/:]+", ".", name).strip(".")


@dataclass(frozen=True)
class InitializerMatching:
    """Initializer pairs across A and B, canonical ids for node labels, and what stayed unpaired."""

    pairs: Mapping[str, str]
    diffs: tuple[InitializerDiff, ...]
    unchanged_count: int
    removed: tuple[str, ...]
    added: tuple[str, ...]
    ids_a: Mapping[str, str]
    ids_b: Mapping[str, str]


def match_initializers(a: ModelSnapshot, b: ModelSnapshot, hasher: ContentHasher) -> InitializerMatching:
    pairs: dict[str, str] = {}
    diffs: list[InitializerDiff] = []
    unchanged = 0
    for name, record_a in a.initializers.items():
        record_b = b.initializers.get(name)
        if record_b is None:
            continue
        pairs[name] = name
        refs = ((tensor_ref(record_a),), (tensor_ref(record_b),))
        if record_a.dtype != record_b.dtype:
            diffs.append(InitializerDiff("retyped", *refs, f"{name} {record_a.dtype} → {record_b.dtype}", None, "name"))
        elif record_a.shape != record_b.shape:
            summary = f"{name} {shape_text(record_a.shape)} → {shape_text(record_b.shape)}"
            diffs.append(InitializerDiff("reshaped", *refs, summary, None, "name"))
        elif hasher.same_content(a, name, b, name):
            unchanged += 1
        else:
            diffs.append(InitializerDiff("values_changed", *refs, f"{name} values changed", None, "name"))

    # Same content under a new name: hash only tensors whose (dtype, shape) exists on the other side too.
    removed_by_header: dict[tuple[str, tuple[int, ...]], list[str]] = defaultdict(list)
    for name, record in a.initializers.items():
        if name not in b.initializers:
            removed_by_header[(record.dtype, record.shape)].append(name)
    added_by_header: dict[tuple[str, tuple[int, ...]], list[str]] = defaultdict(list)
    for name, record in b.initializers.items():
        if name not in a.initializers:
            added_by_header[(record.dtype, record.shape)].append(name)
    for header, names_a in removed_by_header.items():
        names_b = added_by_header.get(header)
        if not names_b:
            continue
        by_digest: dict[str, list[str]] = defaultdict(list)
        for name_b in names_b:
            by_digest[hasher.digest(b, name_b)].append(name_b)
        for name_a in names_a:
            candidates = by_digest.get(hasher.digest(a, name_a))
            if candidates:
                name_b = candidates.pop(0)
                pairs[name_a] = name_b
                refs = ((tensor_ref(a.initializers[name_a]),), (tensor_ref(b.initializers[name_b]),))
                diffs.append(InitializerDiff("renamed", *refs, f"{name_a} → {name_b}", None, "content"))

    ids_a = {name_a: f"i{k}" for k, name_a in enumerate(pairs)}
    ids_b = {name_b: ids_a[name_a] for name_a, name_b in pairs.items()}
    paired_b = set(pairs.values())
    return InitializerMatching(
        pairs=MappingProxyType(pairs),
        diffs=tuple(diffs),
        unchanged_count=unchanged,
        removed=tuple(n for n in a.initializers if n not in pairs),
        added=tuple(n for n in b.initializers if n not in paired_b),
        ids_a=MappingProxyType(ids_a),
        ids_b=MappingProxyType(ids_b),
    )


def expert_kind(name: str) -> str | None:
    """The role of an expert tensor from the words of its name: gate_up (gate/up/w1/w3/fc1/fc3), down
    (down/w2/fc2), with a ``_bias`` suffix for biases; None when the name says nothing."""
    words = set(re.split(r"[^a-z0-9]+", name.lower()))
    suffix = "_bias" if words & {"bias", "biases", "b"} else ""
    if words & {"down", "w2", "fc2"}:
        return "down" + suffix
    if words & {"gate", "up", "w1", "w3", "fc1", "fc3"}:
        return "gate_up" + suffix
    return None


def _describe_group(refs: Iterable[TensorRef]) -> str:
    shapes = [r.shape for r in refs]
    if len(shapes) == 1:
        return shape_text(shapes[0])
    if len(set(shapes)) == 1:
        return f"{len(shapes)} × {shape_text(shapes[0])}"
    return " + ".join(shape_text(s) for s in shapes[:4]) + (" + …" if len(shapes) > 4 else "")


def summarise_unpaired(
    a: ModelSnapshot,
    b: ModelSnapshot,
    removed: Iterable[str],
    added: Iterable[str],
    block_sources: Mapping[str, frozenset[str]],
) -> tuple[InitializerDiff, ...]:
    """Explain removed/added initializers as ndp-ep shard splits, generic splits/merges, or plain removals.

    ``block_sources`` maps an MoE block name to the A initializers consumed by the nodes it replaced.
    """
    removed_left = dict.fromkeys(removed)
    added_left = dict.fromkeys(added)
    diffs: list[InitializerDiff] = []

    diffs.extend(_shard_groups(a, b, removed_left, added_left, block_sources, "split"))
    diffs.extend(_shard_groups(b, a, added_left, removed_left, block_sources, "merged"))
    diffs.extend(_generic_splits(a, b, removed_left, added_left, "split"))
    diffs.extend(_generic_splits(b, a, added_left, removed_left, "merged"))
    for name in removed_left:
        ref = tensor_ref(a.initializers[name])
        diffs.append(InitializerDiff("removed", (ref,), (), f"{name} {ref.shape_text()}", None, None))
    for name in added_left:
        ref = tensor_ref(b.initializers[name])
        diffs.append(InitializerDiff("added", (), (ref,), f"{name} {ref.shape_text()}", None, None))
    return tuple(diffs)


def _shard_groups(
    whole_side: ModelSnapshot,
    shard_side: ModelSnapshot,
    wholes_left: dict[str, None],
    shards_left: dict[str, None],
    block_sources: Mapping[str, frozenset[str]],
    status: str,
) -> list[InitializerDiff]:
    """ndp-ep expert shards on ``shard_side`` explained by stacked tensors on ``whole_side``.

    status "split": A holds the stacked tensors, B the shards; "merged": the reverse (B is the original).
    Used names are removed from ``wholes_left`` and ``shards_left``.
    """
    groups: dict[tuple[str, str], list[tuple[int, int, str]]] = defaultdict(list)
    for name in shards_left:
        found = parse_shard_name(name)
        if found is not None:
            shard = found.shard if found.shard is not None else -1
            groups[(found.block, found.kind)].append((found.expert, shard, name))
    diffs = []
    for (block, kind), members in sorted(groups.items(), key=lambda kv: (kv[0][0], _kind_order(kv[0][1]))):
        members.sort()
        shard_refs = tuple(tensor_ref(shard_side.initializers[name]) for _, _, name in members)
        role = kind.replace("up", "gate_up", 1) if kind.startswith("up") else kind
        consumed = block_sources.get(block, frozenset())
        sources = _find_shard_sources(whole_side, block, role, shard_refs, wholes_left, consumed)
        experts = len({e for e, _, _ in members})
        shards = len({s for _, s, _ in members})
        shapes = {r.shape for r in shard_refs}
        sharded = members[0][1] >= 0
        shard_text = f"{experts} experts × {shards} shards of " if sharded else f"{experts} experts of "
        shard_text += shape_text(next(iter(shapes))) if len(shapes) == 1 else "mixed shapes"
        if experts * shards != len(members):
            shard_text += f" ({len(members)} shards present, incomplete)"
        if sources is None:
            other = "A" if status == "split" else "B"
            lone = "added" if status == "split" else "removed"
            whole_text = f"(no stacked source found in {other})"
            summary = f"{block} experts {kind}: " + (
                f"{whole_text} → {shard_text}" if status == "split" else f"{shard_text} → {whole_text}"
            )
            refs = ((), shard_refs) if status == "split" else (shard_refs, ())
            diffs.append(InitializerDiff(lone, *refs, summary, block, None))
        else:
            whole_refs, basis = sources
            whole_text = _describe_group(whole_refs)
            if status == "split":
                summary = f"{block} experts {kind} {whole_text} → {shard_text}"
                diffs.append(InitializerDiff("split", whole_refs, shard_refs, summary, block, basis))
            else:
                summary = f"{block} experts {kind} {shard_text} → {whole_text}"
                diffs.append(InitializerDiff("merged", shard_refs, whole_refs, summary, block, basis))
            for ref in whole_refs:
                wholes_left.pop(ref.name, None)
        for _, _, name in members:
            shards_left.pop(name, None)
    return diffs


def _kind_order(kind: str) -> tuple[int, int, str]:
    """First-layer weights, then their bias, scales and zero points; then the down projection's, in that order."""
    layer = 1 if kind.startswith("down") else 0 if kind.startswith(("gate_up", "up")) else 2
    base = kind.removeprefix("gate_up").removeprefix("up").removeprefix("down")
    variants = ("", "_bias", "_scales", "_zero_points")
    return (layer, variants.index(base) if base in variants else len(variants), kind)


def _find_shard_sources(
    a: ModelSnapshot,
    block: str,
    kind: str,
    refs_b: tuple[TensorRef, ...],
    removed_left: Mapping[str, None],
    consumed_by_block: frozenset[str],
) -> tuple[tuple[TensorRef, ...], str] | None:
    total_elements = sum(_elements(r.shape) for r in refs_b)
    dtypes = {r.dtype for r in refs_b}
    prefix = normalise_name(block) + "."
    pools = (
        [n for n in removed_left if n in consumed_by_block],
        [n for n in removed_left if normalise_name(n).startswith(prefix)],
    )
    for pool in pools:
        records = [a.initializers[n] for n in pool if a.initializers[n].dtype in dtypes]
        same_kind = [r for r in records if expert_kind(r.name.removeprefix(block)) == kind]
        if same_kind and sum(r.element_count for r in same_kind) == total_elements:
            return tuple(tensor_ref(r) for r in same_kind), "name+size"
        exact = [r for r in records if r.element_count == total_elements]
        if len(exact) == 1:
            return (tensor_ref(exact[0]),), "size"
    return None


def _elements(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _generic_splits(
    whole_side: ModelSnapshot,
    parts_side: ModelSnapshot,
    wholes: dict[str, None],
    parts: dict[str, None],
    status: str,
) -> list[InitializerDiff]:
    """A tensor X whose elements reappear as >= 2 tensors named X.<...> / X_<...> on the other side."""
    diffs: list[InitializerDiff] = []
    sorted_parts = sorted(parts)
    for whole in list(wholes):
        record = whole_side.initializers[whole]
        found: list[str] = []
        for separator in SPLIT_SEPARATORS:
            prefix = whole + separator
            start = bisect.bisect_left(sorted_parts, prefix)
            while start < len(sorted_parts) and sorted_parts[start].startswith(prefix):
                if sorted_parts[start] in parts:
                    found.append(sorted_parts[start])
                start += 1
        piece_records = [parts_side.initializers[n] for n in found]
        if len(found) < 2 or any(p.dtype != record.dtype for p in piece_records):
            continue
        if sum(p.element_count for p in piece_records) != record.element_count:
            continue
        whole_ref = (tensor_ref(record),)
        piece_refs = tuple(tensor_ref(p) for p in piece_records)
        if status == "split":
            summary = f"{whole} {shape_text(record.shape)} → {len(found)} shards of {_describe_group(piece_refs)}"
            diffs.append(InitializerDiff("split", whole_ref, piece_refs, summary, None, "name+size"))
        else:
            summary = f"{len(found)} tensors {_describe_group(piece_refs)} → {whole} {shape_text(record.shape)}"
            diffs.append(InitializerDiff("merged", piece_refs, whole_ref, summary, None, "name+size"))
        wholes.pop(whole)
        for name in found:
            parts.pop(name)
    return diffs
