"""``ndp-ep generate MODEL_DIR``: greedy generation with ONNX Runtime GenAI on the NDP provider, with reports.

MODEL_DIR is an ONNX Runtime GenAI model folder (``genai_config.json`` + the decoder ONNX file), converted by
``ndp-ep convert`` or not (then it is converted into a temporary folder first and itself serves as the
reference). The library is registered with GenAI (``og.register_execution_provider_library``) and appended as
its provider; a prompt of ``--prompt-tokens`` token ids (seeded, in the vocabulary) is followed by
``--new-tokens`` greedy steps. The routing each step took, captured by the provider, is simulated in step order on
one simulator (the prefetcher's state evolves across steps): the prefill report and per-token decode latency.
With a reference (the unconverted folder, or ``--reference``), GenAI also generates without the provider and
the tokens are compared.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

HELP = "greedy generation of a GenAI model folder on the NDP provider, with prefill and per-token simulated latency"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ndp_ep.cli_args import (
        MAX_SEQ_LEN,
        add_hardware_args,
        add_json_args,
        add_policy_arg,
        add_seed_arg,
        add_shards_arg,
        bounded_int,
    )

    parser.add_argument("model_dir", help="ONNX Runtime GenAI model folder (converted by ndp-ep convert, or not)")
    for flag, what in (("--prompt-tokens", "prompt length in tokens"), ("--new-tokens", "tokens to generate")):
        parser.add_argument(
            flag, type=bounded_int(1, MAX_SEQ_LEN), default=512, metavar="N", help=f"{what}, 1-{MAX_SEQ_LEN:,}"
        )
    parser.add_argument("--reference", help="the unconverted GenAI folder to compare tokens with (no provider)")
    parser.add_argument("--no-check", action="store_true", help="do not generate the reference tokens")
    add_hardware_args(parser)
    add_policy_arg(parser)
    add_shards_arg(parser, purpose="shards per expert when converting")
    add_seed_arg(parser, of="the prompt's token ids")
    add_json_args(parser, what="the tokens and the simulated latency")


def run(args: argparse.Namespace) -> int:
    from ndp_ep.errors import NdpEpError

    try:
        import onnxruntime_genai as og
    except ImportError:
        raise NdpEpError("ndp-ep generate needs onnxruntime-genai: pip install 'ndp-ep[genai]'") from None
    model_dir = Path(args.model_dir)
    config = _genai_config(model_dir)
    context = config["model"].get("context_length")
    if isinstance(context, int) and args.prompt_tokens + args.new_tokens > context:
        raise NdpEpError(
            f"--prompt-tokens {args.prompt_tokens} + --new-tokens {args.new_tokens} exceed the model's context length "
            f"{context}"
        )
    with tempfile.TemporaryDirectory(prefix="ndp-ep-generate-") as tmp:
        reference = Path(args.reference) if args.reference else None
        if not _is_converted(model_dir, config):
            reference = reference or model_dir
            model_dir = _convert_folder(model_dir, config, Path(tmp) / "model", args)
        if reference is not None:
            _genai_config(reference)
        result = _generate(og, model_dir, config, args)
        if reference is not None and not args.no_check:
            expected = _greedy(og, reference, result["prompt"], args.new_tokens, provider_options=None)
            result["reference_tokens_identical"] = expected == result["tokens"]
        _print(result, args)
        return 0 if result.get("reference_tokens_identical", True) else 1


def _genai_config(folder: Path) -> dict:
    from ndp_ep.errors import ModelLoadError

    path = folder / "genai_config.json"
    if not path.is_file():
        raise ModelLoadError(f"{folder} is not an ONNX Runtime GenAI model folder (no genai_config.json)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        decoder = config["model"]["decoder"]
        if not (folder / decoder["filename"]).is_file():
            raise ModelLoadError(f"{folder}: the decoder file {decoder['filename']} is missing")
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{path}: not a GenAI config ({type(exc).__name__}: {exc})") from None
    return config


def _decoder(folder: Path, config: dict) -> Path:
    return folder / config["model"]["decoder"]["filename"]


def _is_converted(folder: Path, config: dict) -> bool:
    import onnx

    from ndp_ep.partition import is_ndp_supported

    model = onnx.load(str(_decoder(folder, config)), load_external_data=False)
    return any(is_ndp_supported(n) for n in model.graph.node)


def _convert_folder(source: Path, config: dict, target: Path, args) -> Path:
    """A converted copy of a GenAI folder: the decoder rewritten, every other file copied."""
    from ndp_ep.convert import convert_model
    from ndp_ep.errors import ConversionError

    decoder = _decoder(source, config)
    target.mkdir(parents=True)
    for item in source.iterdir():
        if item.is_file() and not item.name.startswith(decoder.name):
            shutil.copy2(item, target / item.name)
    result = convert_model(decoder, target / decoder.name, hw=args.hw, ndp_units=args.ndp_units, shards=args.shards)
    if not result.report.blocks:
        raise ConversionError(f"{source}: no MoE block converted ({len(result.report.skipped)} skipped)")
    return target


def _greedy(og, folder: Path, prompt: list[int], new_tokens: int, provider_options: dict | None):
    """Greedy tokens of a GenAI folder, on the provider when ``provider_options`` is given; and the model."""
    import numpy as np

    from graph_passes.feeds import GENAI_CONFIG, read_genai_config
    from ndp_ep.ep import EP_NAME
    from ndp_ep.errors import NdpEpError

    try:
        config = og.Config(str(folder))
        config.clear_providers()
        # ONNX Runtime's own log of a failing run stays off stderr (fatal only): the one-line error below says it
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"log_severity_level": 4}}}}))
        if provider_options is not None:
            config.append_provider(EP_NAME)
            for key, value in provider_options.items():
                config.set_provider_option(EP_NAME, key, str(value))
        model = og.Model(config)
        params = og.GeneratorParams(model)
        # a sliding-window cache is as long as max_length, and GroupQueryAttention refuses one shorter than its window;
        # a longer one changes no token: the loop stops after new_tokens
        decoder = read_genai_config(folder / GENAI_CONFIG)
        window = decoder.sliding_window if decoder is not None and decoder.sliding_window is not None else 0
        params.set_search_options(max_length=max(len(prompt) + new_tokens, window), do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(np.asarray(prompt, dtype=np.int32))
        tokens: list[int] = []
        while not generator.is_done() and len(tokens) < new_tokens:
            generator.generate_next_token()
            tokens.append(int(generator.get_next_tokens()[0]))
    except RuntimeError as exc:  # onnxruntime-genai reports every failure as RuntimeError
        lines = str(exc).strip().splitlines()
        raise NdpEpError(f"onnxruntime-genai ({folder}): {lines[0] if lines else type(exc).__name__}") from None
    if provider_options is None:
        return tokens
    return tokens, model


def _generate(og, folder: Path, config: dict, args) -> dict:
    import time

    import numpy as np
    import onnx

    from hw_model.hardware import load_system
    from ndp_ep.cli import warn
    from ndp_ep.commands.run import shard_mismatch
    from ndp_ep.ep import EP_NAME, get_library_path, new_session_key, register
    from ndp_ep.reporter import SessionReporter

    register()
    og.register_execution_provider_library(EP_NAME, get_library_path())
    system = load_system(args.hw, args.ndp_units)
    vocab = int(config["model"].get("vocab_size", 2))
    prompt = np.random.default_rng(args.seed).integers(0, vocab, args.prompt_tokens).tolist()
    key = new_session_key()
    options = {"session_key": key, "hw": system.name, "ndp_units": system.num_ndp_units, "routing_capacity": 1 << 20}
    graph_model = onnx.load(str(_decoder(folder, config)), load_external_data=False)
    shapes = _step_shapes(graph_model, len(prompt), config)
    reporter = SessionReporter(
        graph_model, system, key, policy=args.policy, report_ring=args.new_tokens + 1, untagged_shapes=shapes
    )
    mismatch = shard_mismatch((c.spec for c in reporter.claimed), system.num_ndp_units)
    if mismatch:  # as ndp-ep run says it
        warn("generate", mismatch)
    start = time.perf_counter()
    tokens, model = _greedy(og, folder, prompt, args.new_tokens, options)
    wall_s = time.perf_counter() - start
    reports = reporter.reports  # read while the model (and the provider's routing log) is alive
    del model
    prefill, steps = (reports[0], reports[1:]) if reports else (None, [])
    decode_s = [r.simulated_latency_s for r in steps]
    return {
        "model_dir": str(folder),
        "prompt": prompt,
        "tokens": tokens,
        "wall_s": wall_s,
        "hardware": system.name,
        "ndp_units": system.num_ndp_units,
        "policy": reporter.policy,
        "prefill": prefill.to_json() if prefill else None,
        "decode_steps": len(steps),
        "decode_s_per_token": decode_s,
        "simulated_total_s": sum(r.simulated_latency_s for r in reports),
        "simulator": reports[-1].simulator if reports else {},
        "notes": sorted({n for r in reports for n in r.notes}),
    }


def _step_shapes(model, prompt_len: int, config: dict):
    """Input shapes of generation step n (0 = prefill), from the decoder's symbolic input dims, as
    :func:`graph_passes.feeds.random_feeds` names them: batch 1; a past length (``past_sequence_length``) the
    tokens before the step, the total length those and the step's; a window cache (``past_sliding_length``) its
    capacity, the config's window plus its cache slack; a KV cache's last dim the config's head size; any other
    the step's tokens."""
    import re

    from graph_passes.feeds import BATCH_DIM_NAMES, PAST_LENGTH_DIMS, SLIDING_DIMS, TOTAL_LENGTH_DIMS

    decoder = config["model"]["decoder"]
    window = decoder.get("sliding_window") or {}
    capacity = int(window.get("window_size", 0)) + int(window.get("cache_slack", 0))
    names = decoder.get("inputs", {})
    patterns = [names[key] for key in ("past_key_names", "past_value_names") if key in names]  # "past.%d.key"
    cache = re.compile("|".join(re.escape(p).replace("%d", r"\d+") for p in patterns)) if patterns else None
    inputs = [
        (
            i.name,
            [d.dim_value if d.HasField("dim_value") else d.dim_param for d in i.type.tensor_type.shape.dim],
            bool(cache and cache.fullmatch(i.name)),
        )
        for i in model.graph.input
    ]
    head_size = decoder.get("head_size")

    def shapes(step: int) -> dict[str, tuple[int, ...]]:
        tokens = prompt_len if step == 0 else 1
        past = 0 if step == 0 else prompt_len + step - 1
        sizes = {
            **dict.fromkeys(BATCH_DIM_NAMES, 1),
            **dict.fromkeys(PAST_LENGTH_DIMS, past),
            **dict.fromkeys(SLIDING_DIMS, capacity or past),
            **dict.fromkeys(TOTAL_LENGTH_DIMS, past + tokens),
        }
        result = {}
        for name, dims, is_cache in inputs:
            shape = []
            for position, d in enumerate(dims):
                if isinstance(d, int) and d > 0:
                    shape.append(d)
                elif str(d).lower() in sizes:
                    shape.append(sizes[str(d).lower()])
                elif is_cache and position == len(dims) - 1 and isinstance(head_size, int):
                    shape.append(head_size)
                else:
                    shape.append(tokens)
            result[name] = tuple(shape)
        return result

    return shapes


def _print(result: dict, args) -> None:
    import statistics

    from ndp_ep.text import plural

    if args.json:
        print(json.dumps(result))
        return
    print(
        f"generated {plural(len(result['tokens']), 'token')} (greedy) after a prompt of "
        f"{plural(len(result['prompt']), 'token')} "
        f"on NdpExecutionProvider in {result['wall_s']:.2f} s: {result['tokens'][:16]}"
        f"{' ...' if len(result['tokens']) > 16 else ''}"
    )
    if "reference_tokens_identical" in result:
        same = "yes" if result["reference_tokens_identical"] else "NO"
        print(f"tokens identical to ONNX Runtime GenAI without the provider: {same}")
    print(f"simulated on {result['hardware']} with {result['ndp_units']} NDP units, policy {result['policy']}:")
    prefill = result["prefill"]
    if prefill:
        tokens = "token " if prefill["tokens"] == 1 else "tokens"  # padded: the decode line's columns align
        print(f"  prefill  {prefill['tokens']:>5} {tokens}  {prefill['simulated_latency_s'] * 1e3:10.3f} ms")
    decode = result["decode_s_per_token"]
    if decode:
        print(
            f"  decode   {len(decode):>5} steps   {statistics.mean(decode) * 1e3:10.3f} ms/token mean "
            f"(median {statistics.median(decode) * 1e3:.3f}, min {min(decode) * 1e3:.3f}, "
            f"max {max(decode) * 1e3:.3f})"
        )
    print(f"  total                  {result['simulated_total_s'] * 1e3:10.3f} ms")
    for note in result["notes"]:
        print(f"  note: {note}")
