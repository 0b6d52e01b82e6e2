"""``ndp-ep generate MODEL_DIR``: greedy generation with ONNX Runtime GenAI on the NDP provider, with reports.

MODEL_DIR is an ONNX Runtime GenAI model folder (``genai_config.json`` + the decoder ONNX file), converted by
``ndp-ep convert`` or not (then it is converted into a temporary folder first, keeping the folder's layout, and
itself serves as the reference; errors and ``--json`` still name MODEL_DIR). Every ``genai_config.json`` value
read here is checked first (one-line :class:`ndp_ep.errors.ModelLoadError` naming the file and the field), the
decoder with the checks ``ndp-ep run`` applies, and a prompt plus new tokens longer than the context length is
refused saying which sizes fit (:class:`ndp_ep.errors.FeedError`). The library is registered with GenAI
(``og.register_execution_provider_library``) and appended as its provider; a prompt of ``--prompt-tokens`` token
ids (seeded, in the vocabulary) is followed by ``--new-tokens`` greedy steps. The routing each step took, captured
by the provider, is simulated in step order on one simulator (the prefetcher's state evolves across steps): the
prefill report and per-token decode latency. With a reference (the unconverted folder, or ``--reference``), GenAI
first generates without the provider and the tokens are compared; where they differ, the first diverging step is
measured and classified (:mod:`ndp_ep.divergence`): a near tie exits 3, a real divergence 1, and either is said on
stderr and in ``--json`` (``divergence``). A non-zero exit is never silent.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from ndp_ep.genai import GENAI_CONFIG, decoder_path, is_converted, load_decoder, read_config
from ndp_io import temporary_directory

if TYPE_CHECKING:
    from ndp_ep.genai import GenerationReports

HELP = "greedy generation of a GenAI model folder on the NDP provider, with prefill and per-token simulated latency"
DEFAULT_TOKENS = 512  # --prompt-tokens and --new-tokens: the paper's workload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ndp_ep.cli_args import (
        MAX_SEQ_LEN,
        add_hardware_args,
        add_json_args,
        add_policy_arg,
        add_seed_arg,
        add_shards_arg,
        add_tuning_args,
        bounded_int,
    )

    parser.add_argument("model_dir", help="ONNX Runtime GenAI model folder (converted by ndp-ep convert, or not)")
    for flag, what in (("--prompt-tokens", "prompt length in tokens"), ("--new-tokens", "tokens to generate")):
        parser.add_argument(
            flag,
            type=bounded_int(1, MAX_SEQ_LEN),
            default=DEFAULT_TOKENS,
            metavar="N",
            help=f"{what}, 1-{MAX_SEQ_LEN:,}",
        )
    parser.add_argument("--reference", help="the unconverted GenAI folder to compare tokens with (no provider)")
    parser.add_argument("--no-check", action="store_true", help="do not generate the reference tokens")
    add_hardware_args(parser)
    add_policy_arg(parser)
    add_tuning_args(parser)
    from ndp_ep.cli_args import add_placement_arg

    add_placement_arg(parser)
    add_shards_arg(parser, purpose="shards per expert when converting")
    add_seed_arg(parser, of="the prompt's token ids")
    add_json_args(parser, what="the tokens and the simulated latency")
    from ndp_ep.cli_args import add_save_routing_arg

    add_save_routing_arg(parser)


def run(args: argparse.Namespace) -> int:
    from ndp_ep.cli_args import settings_from_args
    from ndp_ep.errors import NdpEpError

    settings = settings_from_args(args)  # every simulation option checked, before any work
    if args.save_routing:
        from ndp_ep.cli_args import check_trace_path
        from ndp_io import check_no_clobber

        check_trace_path(args.save_routing)
        check_no_clobber([args.save_routing], [args.model_dir, args.reference, args.hw, args.placement])

    try:
        import onnxruntime_genai as og
    except ImportError:
        raise NdpEpError("ndp-ep generate needs onnxruntime-genai: pip install 'ndp-ep[genai]'") from None
    model_dir = Path(args.model_dir)
    reference = Path(args.reference) if args.reference else None
    for folder in (model_dir, reference):  # ONNX Runtime GenAI takes a folder as UTF-8 text only
        if folder is not None and not _is_utf8(folder):
            raise NdpEpError(
                f"{folder}: ONNX Runtime GenAI opens only folders whose path is UTF-8; "
                "rename it (or link to it from a UTF-8 path)"
            )
    config = read_config(model_dir)
    check_fits(model_dir, config, args.prompt_tokens, args.new_tokens)
    reference_config = read_config(reference) if reference is not None else config
    if reference is not None:  # checked before any work, as MODEL_DIR is
        check_fits(reference, reference_config, args.prompt_tokens, args.new_tokens)
        load_decoder(reference, reference_config)
    decoder = load_decoder(model_dir, config)
    converted = is_converted(decoder)
    import numpy as np

    vocab = config["model"].get("vocab_size", 2)
    prompt = np.random.default_rng(args.seed).integers(0, vocab, args.prompt_tokens).tolist()
    with temporary_directory("ndp-ep-generate-") as tmp:  # removed on SIGTERM/SIGHUP/SIGINT too (ndp_io)
        folder = model_dir
        if not converted:
            reference = reference or model_dir
            folder = _convert_folder(model_dir, config, Path(tmp) / "model", settings, args.shards)
            decoder = load_decoder(folder, config, check=False)  # just written by the conversion
        expected = None
        if reference is not None and not args.no_check:  # first: the provider's run watches for the first change
            expected = _greedy(og, reference, reference_config, prompt, args.new_tokens, None)
        result, provider_logits = _generate(og, folder, config, decoder, settings, args, model_dir, prompt, expected)
        result["converted_in_memory"] = not converted
        divergence = None
        if expected is not None:
            result["reference_tokens_identical"] = expected == result["tokens"]
            divergence = _explain(og, reference, reference_config, prompt, expected, result, provider_logits, args)
            result["divergence"] = divergence.to_json() if divergence is not None else None
        _print(result, args)
        if divergence is not None:
            _say_divergence(divergence)
            return divergence.exit_code
        if not result.get("reference_tokens_identical", True):  # no logits to explain it: still said
            from ndp_ep.cli import warn

            warn("generate", "the tokens differ from the reference's")
            return 1
        return 0


def _explain(og, reference: Path, config: dict, prompt: list[int], expected: list[int], result: dict,
             provider_logits, args):  # fmt: skip
    """The :class:`ndp_ep.divergence.Divergence` of the provider's tokens from the reference's ``expected`` (None
    when they agree), from the provider's logits at the first differing step and the reference's replays there."""
    from ndp_ep.divergence import alternate_thread_count, classify, first_difference, replay_logits

    tokens = result["tokens"]
    step = first_difference(expected, tokens)
    if step is None or provider_logits is None or step >= len(expected) or step >= len(tokens):
        return None  # identical, or one sequence stopped first (said by the caller)
    length = _max_length(config, len(prompt), args.new_tokens)
    forced = expected[:step]  # both runs' tokens up to the step
    reference_logits = replay_logits(og, reference, config, prompt, forced, length, None)
    threads = alternate_thread_count(config)
    alternate_logits = replay_logits(og, reference, config, prompt, forced, length, threads)
    return classify(step, len(tokens), tokens[step], reference_logits, provider_logits, alternate_logits, threads)


def _say_divergence(divergence) -> None:
    import sys

    from ndp_ep.cli import warn

    if divergence.near_tie:
        warn("generate", divergence.message())
    else:
        print(f"ndp-ep generate: error: {divergence.message()}", file=sys.stderr)


def _max_length(config: dict, prompt_tokens: int, new_tokens: int) -> int:
    """GenAI's max_length for a generation: the prompt and the new tokens, at least a sliding window's size (a
    sliding-window cache is as long as max_length, and GroupQueryAttention refuses one shorter than its window; a
    longer one changes no token: the loop stops after new_tokens)."""
    window = (config["model"]["decoder"].get("sliding_window") or {}).get("window_size") or 0
    return max(prompt_tokens + new_tokens, window)


def _is_utf8(path: Path) -> bool:
    try:
        os.fsencode(path).decode("utf-8")
        str(path).encode("utf-8")
    except UnicodeError:
        return False
    return True


def check_fits(folder: Path, config: dict, prompt_tokens: int, new_tokens: int) -> None:
    """:class:`ndp_ep.errors.FeedError` when the prompt and the new tokens exceed the config's context length,
    naming the largest sizes that fit (GenAI would fail later, deep in an attention node's rotary cache)."""
    from ndp_ep.errors import FeedError

    context = config["model"].get("context_length")
    total = prompt_tokens + new_tokens
    if context is None or total <= context:
        return
    if context < 2:
        advice = "no generation fits in it (a prompt and one new token need 2)"
    else:
        fits = [f"--prompt-tokens {context - context // 2} --new-tokens {context // 2}"]
        if prompt_tokens < context:
            fits.append(f"--new-tokens {context - prompt_tokens} to keep this prompt")
        if new_tokens < context:
            fits.append(f"--prompt-tokens {context - new_tokens} to keep these new tokens")
        advice = f"pass sizes that add up to at most {context:,}: " + ", or ".join(fits)
    if prompt_tokens == new_tokens == DEFAULT_TOKENS:
        advice += f" (the defaults, {DEFAULT_TOKENS} each, are the paper's workload: they need a context of {total:,})"
    raise FeedError(
        f"--prompt-tokens {prompt_tokens} + --new-tokens {new_tokens} = {total:,} tokens exceed the context "
        f"length {context:,} of {folder / GENAI_CONFIG} (model.context_length); {advice}"
    )


def _convert_folder(source: Path, config: dict, target: Path, settings, shards: int | None) -> Path:
    """A converted copy of a GenAI folder, its layout kept (the config names the decoder by its relative path):
    the decoder rewritten, every other file copied."""
    from ndp_ep.convert import convert_model
    from ndp_ep.errors import ConversionError

    decoder = decoder_path(source, config)
    for item in sorted(source.rglob("*")):
        # regular files only (a named pipe would block the copy); not the decoder and its data files
        # (model.onnx, model.onnx.data): the conversion writes its own
        if item.is_file() and not (item.parent == decoder.parent and item.name.startswith(decoder.name)):
            copy = target / item.relative_to(source)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(item, copy)
    converted = target / decoder.relative_to(source)
    converted.parent.mkdir(parents=True, exist_ok=True)
    result = convert_model(decoder, converted, settings=settings, shards=shards)
    if not result.report.blocks:
        raise ConversionError(f"{source}: no MoE block converted ({len(result.report.skipped)} skipped)")
    return target


def _greedy(
    og,
    folder: Path,
    config: dict,
    prompt: list[int],
    new_tokens: int,
    generation: GenerationReports | None,
    shown: Path | None = None,
    expected: list[int] | None = None,
):
    """Greedy tokens of a GenAI folder, on the provider when ``generation`` (its reports) is given; and then the
    model and, with ``expected`` (the reference's tokens), the logits of the first step whose token differs from
    them (None if none does). ``shown`` is the user's folder when ``folder`` is its converted copy in a temporary
    folder: errors name it."""
    import numpy as np

    from ndp_ep.errors import NdpEpError

    captured = None
    try:
        settings = og.Config(str(folder))
        # ONNX Runtime's own log of a failing run stays off stderr (fatal only): the one-line error below says it
        settings.overlay(json.dumps({"model": {"decoder": {"session_options": {"log_severity_level": 4}}}}))
        if generation is not None:
            generation.add_provider(settings)  # the provider, the config's only one
        else:  # ONNX Runtime's CPU provider only, whatever the config lists (a model builder's cuda)
            settings.clear_providers()
        model = og.Model(settings)
        params = og.GeneratorParams(model)
        # a sliding-window cache is as long as max_length, and GroupQueryAttention refuses one shorter than its window;
        # a longer one changes no token: the loop stops after new_tokens
        params.set_search_options(max_length=_max_length(config, len(prompt), new_tokens), do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(np.asarray(prompt, dtype=np.int32))
        tokens: list[int] = []
        watching = expected is not None
        while not generator.is_done() and len(tokens) < new_tokens:
            logits = generator.get_logits() if watching else None  # the ones this step's token comes from
            generator.generate_next_token()
            tokens.append(int(generator.get_next_tokens()[0]))
            if watching and (len(tokens) > len(expected) or tokens[-1] != expected[len(tokens) - 1]):
                captured = np.array(logits, dtype=np.float64).reshape(-1)
                watching = False
    except RuntimeError as exc:  # onnxruntime-genai reports every failure as RuntimeError
        lines = str(exc).strip().splitlines()
        line = lines[0] if lines else type(exc).__name__
        where = str(folder)
        if shown is not None and shown != folder:  # never the temporary folder, which is gone when this is read
            line = line.replace(str(folder), str(shown))
            where = f"{shown}, its decoder converted in memory"
        raise NdpEpError(f"onnxruntime-genai ({where}): {line}") from None
    if generation is None:
        return tokens
    return tokens, model, captured


def _generate(
    og, folder: Path, config: dict, graph_model, settings, args, shown: Path, prompt: list[int], expected
) -> tuple[dict, object]:
    """Generation on the provider in ``folder`` (``graph_model``: its decoder's graph), with the reports; and the
    logits of its first step whose token differs from ``expected`` (the reference's tokens, or None)."""
    import time

    from ndp_ep.cli import warn
    from ndp_ep.commands.run import shard_mismatch
    from ndp_ep.genai import GenerationReports

    system = settings.system
    generation = GenerationReports.of_decoder(
        graph_model, config, settings, prompt_tokens=len(prompt), report_ring=args.new_tokens + 1
    )
    reporter = generation.reporter
    if args.save_routing:
        from ndp_ep.routing import start_capture

        start_capture(reporter)
    mismatch = shard_mismatch((c.spec for c in reporter.claimed), system.num_ndp_units)
    if mismatch:  # as ndp-ep run says it
        warn("generate", mismatch)
    start, start_cpu = time.perf_counter(), time.process_time()
    tokens, model, logits = _greedy(og, folder, config, prompt, args.new_tokens, generation, shown, expected)
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
    reports = reporter.reports  # read while the model (and the provider's routing log) is alive
    del model
    if args.save_routing:
        from hw_model.routing_trace_io import save_trace
        from ndp_ep.routing import reporter_trace

        source = f"ndp-ep generate {shown}"
        trace = reporter_trace(reporter, prompt_tokens=len(prompt), new_tokens=len(tokens), source=source)
        save_trace(trace, args.save_routing)
    prefill, steps = (reports[0], reports[1:]) if reports else (None, [])
    decode_s = [r.simulated_latency_s for r in steps]
    energies = [r.energy for r in reports]
    known = bool(energies) and all(e is not None for e in energies)
    decode_j = [e.total_j for e in energies[1:]] if known else None
    return {
        "model_dir": str(shown),
        "prompt": prompt,
        "tokens": tokens,
        "wall_s": wall_s,  # GenAI's model load and generation loop: no conversion, no report (costed after)
        "cpu_s": cpu_s,  # the process's CPU time (every thread) over the same span
        "hardware": system.name,
        "ndp_units": system.num_ndp_units,
        "policy": reporter.policy,
        "prefill": prefill.to_json() if prefill else None,
        "decode_steps": len(steps),
        "decode_s_per_token": decode_s,
        "simulated_total_s": sum(r.simulated_latency_s for r in reports),
        # energy (hw_model/energy.py): the prompt's joules per prompt token, each decode step's joules (one token)
        "prefill_j_per_token": energies[0].total_j / max(1, prefill.tokens) if known and prefill else None,
        "decode_j_per_token": decode_j,
        "energy_j": sum(e.total_j for e in energies) if known else None,
        "simulator": reports[-1].simulator if reports else {},
        "notes": sorted({n for r in reports for n in r.notes}),
    }, logits


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
        divergence = result.get("divergence")
        if divergence:
            kind = "a near tie" if divergence["near_tie"] else "a real divergence"
            same += f", from step {divergence['step'] + 1} on ({kind}: see stderr)"
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
    if result["energy_j"] is not None:
        decode_j = result["decode_j_per_token"]
        per_token = f", decode {statistics.mean(decode_j) * 1e3:.3f} mJ/token" if decode_j else ""
        print(
            f"  energy   {result['energy_j'] * 1e3:.3f} mJ: prefill {result['prefill_j_per_token'] * 1e3:.3f} "
            f"mJ/prompt token{per_token}"
        )
    for note in result["notes"]:
        print(f"  note: {note}")
