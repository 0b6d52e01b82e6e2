"""``ndp-ep run MODEL.onnx``: run a model through the provider and print the simulated-latency report.

A model converted for another shard count than the simulated hardware's NDP units still runs: the outputs
use the model's shards; the simulator splits every expert over all the hardware's units, as a conversion
for that hardware would (a warning says so).

Start-up: once ONNX Runtime is imported, its one-time work (registering the provider library, the process's
first session) starts on a thread of its own (:func:`ndp_ep.ep.warm_up`) while the session imports onnx and
checks the model.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from ndp_ep.cli_args import (
    add_dtype_arg,
    add_feed_args,
    add_hardware_args,
    add_json_args,
    add_policy_arg,
    add_tuning_args,
    output_file,
    settings_from_args,
)

if TYPE_CHECKING:
    from graph_passes.sharded_op import ShardedOpSpec

HELP = "run an ONNX model (converted or not) through the NDP provider and report simulated latency"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="ONNX model (converted by ndp-ep convert, or an exported MoE model)")
    parser.add_argument(
        "--inputs", metavar="FEEDS.npz", help=".npz of input feeds (default: random feeds from the input signature)"
    )
    parser.add_argument("--outputs", type=output_file, metavar="OUT.npz", help="write the outputs to this .npz file")
    add_hardware_args(parser)
    add_policy_arg(parser)
    add_dtype_arg(parser)
    add_tuning_args(parser)
    from ndp_ep.cli_args import add_placement_arg

    add_placement_arg(parser)
    add_feed_args(parser)
    add_json_args(parser, what="the run's report and the outputs' shapes")
    parser.add_argument(
        "--trace",
        type=output_file,
        metavar="FILE.json",
        help="write the simulated timeline as Chrome trace-event JSON (Perfetto)",
    )
    from ndp_ep.cli_args import add_save_routing_arg

    add_save_routing_arg(parser)


def shard_mismatch(specs: Iterable[ShardedOpSpec], ndp_units: int) -> str | None:
    """A sentence for the user when a converted node's shard count (``specs``: the contracts of the model's
    converted nodes) differs from the simulated NDP unit count, else None."""
    specs = list(specs)
    shards = sorted({spec.shards for spec in specs})
    if not shards or shards == [ndp_units] or ndp_units == 0:  # a GPU-only system splits nothing over units
        return None
    from ndp_ep.text import plural

    counts = " and ".join(str(s) for s in shards)
    counts += " shard" if shards == [1] else " shards"
    advice = ""
    # as a conversion splits: the FFN width evenly, on quantization-block boundaries for quantized experts
    if all(
        spec.ffn % ndp_units == 0 and (not spec.quantized or (spec.ffn // ndp_units) % spec.quant_block_size == 0)
        for spec in specs
    ):
        advice = f" (convert with --shards {ndp_units} to run the numerics that way too)"
    return (
        f"the model's experts are split into {counts} but the hardware has {plural(ndp_units, 'NDP unit')}: "
        f"the outputs use the model's shards; the simulated latency splits each expert over the hardware's "
        f"{plural(ndp_units, 'unit')}{advice}"
    )


def _quiet_run_options():
    """Run options that keep ONNX Runtime's own log of a failing run (coloured, several lines) off stderr: the
    failure reaches the user once, as the command's one-line error (:class:`ndp_ep.RunError`)."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.log_severity_level = 4  # fatal messages only
    return options


def check_fits_in_memory(session, feeds) -> None:
    """:class:`ndp_ep.RunError` when the run on ``feeds`` needs more memory than the machine has available, by a
    lower bound: the largest node's inputs and outputs together, from shape inference at the feeds' shapes
    (:class:`ndp_ep.costing.GpuCost`; the report reuses it). Refused before ONNX Runtime allocates it: a
    65,536-token prompt of ``moe_decoder`` needs 32 GiB in one attention node, which the OOM killer would end."""
    from ndp_ep.errors import RunError
    from ndp_ep.text import human_bytes
    from ndp_io import available_memory_bytes

    cost = session.reporter.non_expert_cost({name: value.shape for name, value in feeds.items()})
    available = available_memory_bytes()
    if cost.working_set_bytes > available:
        raise RunError(
            f"the run needs at least {human_bytes(cost.working_set_bytes)} (the inputs and outputs of "
            f"{cost.working_set_node} at these input shapes) and {human_bytes(available)} of memory is available"
        )


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused inside the block, then as it was.

    A run allocates long-lived objects (the modules it imports, the model, the session, the report) and leaves
    no cyclic garbage (building a session leaves none: tests/core/test_startup.py), which the collector would
    traverse several times over while the imports grow the heap (10-15 ms of a ~0.25 s ``ndp-ep run``);
    reference counting frees everything else as usual.

    What the block allocated is moved to the oldest generation before the collector is turned back on
    (``gc.freeze`` then ``gc.unfreeze``: two list splices): left in the youngest one, all of it would be traversed
    by the first collection after the block (about 5 ms after a ~0.25 s ``ndp-ep run``, as the program exits)."""
    import gc

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if was_enabled:
            gc.enable()


def run(args: argparse.Namespace) -> int:
    with cyclic_gc_paused():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    import sys

    from ndp_ep.blas import single_threaded_blas_load

    with single_threaded_blas_load():  # numpy's OpenBLAS: nothing here multiplies matrices in Python
        import numpy  # noqa: F401

    from ndp_ep.cli import warn
    from ndp_ep.ep import warm_up
    from ndp_ep.feeds_io import load_feeds, save_arrays
    from ndp_ep.session import InferenceSession, one_run_session_options

    settings = settings_from_args(args)  # every simulation option checked, before any work
    outputs = [args.outputs, args.trace, args.save_routing]
    if args.save_routing:
        from ndp_ep.cli_args import check_trace_path

        check_trace_path(args.save_routing)
    if any(outputs):  # never clobber an input (the model, its data files, feeds, a hardware file): before any work
        from graph_passes.model_io import model_files
        from ndp_io import check_no_clobber

        check_no_clobber(outputs, [*model_files(args.model), args.inputs, args.hw, args.placement])
    feeds = load_feeds(args.inputs) if args.inputs else None
    options = one_run_session_options()  # imports ONNX Runtime
    warm_up()  # its one-time work on a thread of its own while the session imports onnx and checks the model
    session = InferenceSession(
        args.model,
        options,
        settings=settings,
        input_shapes={name: value.shape for name, value in feeds.items()} if feeds is not None else None,
        capture_routing=bool(args.save_routing),
    )
    # the session's claimed nodes are the model's converted nodes, each already parsed and contract-checked
    mismatch = shard_mismatch((c.spec for c in session.reporter.claimed), session.system.num_ndp_units)
    if mismatch:
        warn("run", mismatch)
    if feeds is None:
        from graph_passes.feeds import is_kv_cache_decoder, random_feeds, read_genai_config

        config = read_genai_config(args.model)
        if config is not None and config.context_length is not None and args.seq_len > config.context_length:
            from pathlib import Path

            from graph_passes.feeds import GENAI_CONFIG
            from ndp_ep.errors import FeedError

            raise FeedError(  # ONNX Runtime would fail in an attention node ("cos_cache dimension 0 ...")
                f"--seq-len {args.seq_len} exceeds the context length {config.context_length:,} of "
                f"{Path(args.model).parent / GENAI_CONFIG} (model.context_length); pass --seq-len "
                f"{config.context_length} or less"
            )
        model = session.converted_model
        feeds = random_feeds(model, seed=args.seed, seq_len=args.seq_len, config=config)
        kind = "first-step decoder feeds (empty KV cache)" if is_kv_cache_decoder(model) else "feeds"
        source = " and genai_config.json" if config is not None else ""
        print(f"ndp-ep run: no --inputs: random {kind} from the model's inputs{source}", file=sys.stderr)
    check_fits_in_memory(session, feeds)
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(names, feeds, _quiet_run_options()), strict=True))
    report = session.last_report
    if report is None:  # every run is reported (a zero-token one too): the routing log lost this one
        from ndp_ep.errors import RunError

        raise RunError("the run's routing was not recorded, so it has no report; nothing written")
    if args.outputs:
        save_arrays(args.outputs, outputs)
    if args.trace:
        from hw_model.chrome_trace import write_chrome_trace

        write_chrome_trace(args.trace, report.chrome_trace())
    if args.save_routing:
        from hw_model.routing_trace_io import save_trace
        from ndp_ep.routing import reporter_trace

        save_trace(reporter_trace(session.reporter, source=f"ndp-ep run {args.model}"), args.save_routing)
    if args.json:
        import json

        payload = {
            "model": args.model,
            **report.to_json(),
            "outputs": {k: {"shape": list(v.shape), "dtype": v.dtype.name} for k, v in outputs.items()},
            "conversion": session.conversion_report.to_json(),
        }
        print(json.dumps(payload))
        return 0
    for name, value in outputs.items():
        print(f"output {name}: {value.dtype.name}{list(value.shape)}")
    print(report.format_text())
    return 0
