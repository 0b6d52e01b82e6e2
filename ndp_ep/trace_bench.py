"""``ndp-ep bench --trace CAPTURED.npz`` and ``ndp-ep bench --model-from MODEL.onnx``: the bench on one model's
own shapes (:mod:`hw_model.bench_trace`).

A captured routing trace (``--save-routing``) carries the model's MoE shapes, its routing and the non-expert GPU
seconds of each step. ``--model-from`` reads the shapes from a converted model, or from an unconverted one
converted in memory (the graph passes' dry run: nothing written), and drives them with seeded synthetic routing at
the calibrated skew of the built-in model with the same experts and top-k (else qwen3-30b-a3b's mild range); each
step's non-expert GPU time is costed from the model's graph (:class:`ndp_ep.costing.NonExpertCoster`) at the
step's input shapes (a GenAI folder's KV-cache shapes when ``genai_config.json`` sits beside the model).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hw_model.routing_trace import CapturedTrace, TraceHeader


def is_captured_trace(path: str) -> bool:
    """Whether ``path`` is a zip archive holding ``header.json`` (a routing trace, as opposed to the older
    ``ndp-ep-trace/1`` token traces ``bench --trace`` also reads); a truncated zip archive counts as one, so its
    error is the routing-trace reader's."""
    import zipfile

    try:
        with open(path, "rb") as handle:
            if handle.read(4) != b"PK\x03\x04":
                return False
        with zipfile.ZipFile(path) as archive:
            return "header.json" in archive.namelist()
    except OSError:
        return False
    except zipfile.BadZipFile:  # a truncated archive: the routing-trace reader says so in its words
        return True


def model_name_of(header: TraceHeader, fallback: str) -> str:
    """A short name for the table: the model path's folder or stem in the header's source, else ``fallback``."""
    words = header.source.split()
    if len(words) >= 3 and words[0] == "ndp-ep":  # "ndp-ep generate DIR" / "ndp-ep run MODEL.onnx"
        path = Path(words[2])
        return path.name if words[1] == "generate" else path.stem
    return fallback


def _shaped_model(path: str, shards: int):
    """The model's graph with its MoE blocks as sharded ops (converted in memory when they are not), plus
    initializer headers (no bytes) for the tensors the conversion would write."""
    import onnx

    from graph_passes.convert import convert
    from ndp_ep.errors import graph_pass_errors
    from ndp_ep.partition import claim

    model = onnx.load(path, load_external_data=False)
    if claim(model):
        return model
    with graph_pass_errors():
        rewritten, _report = convert(path, shards=shards)
    model = rewritten.model
    for lazy in rewritten.lazy.values():
        tensor = model.graph.initializer.add()
        tensor.name, tensor.data_type = lazy.name, lazy.data_type
        tensor.dims.extend(lazy.dims)
    return model


def trace_from_model(
    path: str, settings, *, prompt_tokens: int, new_tokens: int, level: str, skew: float | None, seed: int
) -> tuple[CapturedTrace, list[str]]:
    """A synthetic trace of the model at ``path`` (see the module docstring) and the notes for the user."""
    from hw_model.bench_trace import calibrated_skew_of, synthetic_captured_trace
    from hw_model.routing_trace import TraceLayer
    from hw_model.trace_replay import settings_json
    from hw_model.traces import TraceKnobs
    from ndp_ep.errors import NdpEpError
    from ndp_ep.partition import claim
    from ndp_ep.reporter import DEPLOYMENT_DTYPE, non_expert_weight_bytes, stored_weight_formats
    from ndp_ep.routing import versions

    model = _shaped_model(path, max(settings.system.num_ndp_units, 1))
    claimed = claim(model)
    if not claimed:
        raise NdpEpError(f"{path}: no MoE block the provider can run (nothing converted): nothing to bench")
    dtype = settings.dtype or DEPLOYMENT_DTYPE
    formats = stored_weight_formats(model, claimed)
    layers = tuple(
        TraceLayer(
            name=c.spec.layer,
            num_experts=c.spec.num_experts,
            top_k=c.spec.top_k,
            hidden=c.spec.hidden,
            ffn=c.spec.ffn,
            gated=bool(c.spec.gated),
            weight_dtype=c.spec.weight_dtype,
            block_size=f.block_size if f is not None else 0,
            scale_dtype=f.scale_dtype if f is not None else "",
        )
        for c, f in zip(claimed, formats, strict=True)
    )
    chosen, like = (
        (skew, "given") if skew is not None else calibrated_skew_of(layers[0].num_experts, layers[0].top_k, level)
    )
    notes = [
        f"synthetic routing, Zipf skew {chosen:g} ({level} of {like}), seed {seed}"
        if skew is None
        else f"synthetic routing, Zipf skew {chosen:g}, seed {seed}"
    ]
    header = TraceHeader(
        layers=layers,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        settings=settings_json(settings),
        dtype=dtype,
        costed_as_stored=settings.dtype is None,
        gpu_reserved_bytes=non_expert_weight_bytes(model, claimed, dtype),
        versions=versions(),
        source=f"ndp-ep bench --model-from {path}",
        notes=tuple(notes),
    )
    prefill_s, decode_s, cost_note = _non_expert_seconds(model, path, settings, dtype, prompt_tokens, new_tokens)
    knobs = TraceKnobs(skew=chosen, shift_at=None, seed=seed)
    return synthetic_captured_trace(header, prefill_s, decode_s, knobs), [cost_note] if cost_note else []


def _non_expert_seconds(model, path: str, settings, dtype: str, prompt: int, new: int) -> tuple[float, float, str]:
    """Non-expert GPU seconds of the prefill and of a decode step (at the middle of the generation's context)."""
    from ndp_ep.costing import NonExpertCoster

    config_path = Path(path).parent / "genai_config.json"
    try:
        if config_path.is_file():
            from ndp_ep.genai import read_config, step_shapes

            shapes = step_shapes(model, read_config(Path(path).parent))
            prefill_shapes, decode_shapes = shapes(prompt, 0), shapes(1, prompt + new // 2)
        else:
            prefill_shapes, decode_shapes = _plain_shapes(model, prompt), _plain_shapes(model, 1)
        coster = NonExpertCoster(model, settings.system, dtype)
        return coster.cost(prefill_shapes).time_s, coster.cost(decode_shapes).time_s, ""
    except Exception as exc:  # noqa: BLE001 - a graph the costing cannot read: the expert side still benches
        return 0.0, 0.0, f"non-expert GPU work not costed ({type(exc).__name__}): the table is the experts' side"


def _plain_shapes(model, tokens: int) -> dict[str, tuple[int, ...]]:
    """Input shapes of a run of ``tokens`` tokens, batch 1: fixed dims kept, the first symbolic dim 1 (the batch)
    when there are two or more, every other symbolic dim ``tokens``."""
    shapes: dict[str, tuple[int, ...]] = {}
    initializers = {t.name for t in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = list(value.type.tensor_type.shape.dim)
        symbolic = [i for i, d in enumerate(dims) if not d.HasField("dim_value")]
        out = []
        for i, dim in enumerate(dims):
            if dim.HasField("dim_value"):
                out.append(int(dim.dim_value))
            else:
                out.append(1 if len(symbolic) > 1 and i == symbolic[0] else tokens)
        shapes[value.name] = tuple(out)
    return shapes


def run_model_bench(args, trace: CapturedTrace, name: str, notes: list[str], ndp_units, policies) -> dict[str, Any]:
    """The records and the text of a bench of one model's trace."""
    from hw_model.bench import ProgressBar
    from hw_model.bench_trace import format_trace_table, run_trace_bench

    records = run_trace_bench(
        trace, name, args.hw, ndp_units, policies, args.jobs, ProgressBar(), placement=args.placement
    )
    header = trace.header
    title = (
        f"{name} ({len(header.layers)} MoE layers, {header.layers[0].num_experts} experts top-{header.layers[0].top_k},"
        f" {trace.num_steps} steps: {header.prompt_tokens} prompt tokens, {header.new_tokens} new)"
    )
    text = format_trace_table(records, title)
    for note in (*header.notes, *notes):
        text += f"\nnote: {note}"
    return {"records": records, "text": text}
