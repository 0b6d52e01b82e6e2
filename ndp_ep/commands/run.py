"""``ndp-ep run MODEL.onnx``: run a model through the provider and print the simulated-latency report."""

from __future__ import annotations

import argparse
import json

HELP = "run an ONNX model (converted or not) through the NDP provider and report simulated latency"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="ONNX model (converted by ndp-ep convert, or an exported MoE model)")
    parser.add_argument("--inputs", help=".npz of input feeds (default: random feeds from the input signature)")
    parser.add_argument("--outputs", help="write the outputs to this .npz")
    parser.add_argument("--hw", default="paper", help="hardware preset (paper, edge, h200) or TOML file")
    parser.add_argument("--ndp-units", type=int, default=None, help="override the preset's NDP unit count")
    parser.add_argument("--policy", default=None, help="scheduling policy (default: tp+lb+prefetch)")
    parser.add_argument("--seq-len", type=int, default=8, help="size of symbolic dims in random feeds")
    parser.add_argument("--seed", type=int, default=0, help="seed of random feeds")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run(args: argparse.Namespace) -> int:
    import sys

    from graph_passes.feeds import is_kv_cache_decoder, random_feeds, read_genai_config
    from ndp_ep.feeds_io import load_feeds, save_arrays
    from ndp_ep.session import InferenceSession

    feeds = load_feeds(args.inputs) if args.inputs else None
    session = InferenceSession(args.model, hw=args.hw, ndp_units=args.ndp_units, policy=args.policy)
    if feeds is None:
        config = read_genai_config(args.model)
        model = session.converted_model
        feeds = random_feeds(model, seed=args.seed, seq_len=args.seq_len, config=config)
        kind = "first-step decoder feeds (empty KV cache)" if is_kv_cache_decoder(model) else "feeds"
        source = " and genai_config.json" if config is not None else ""
        print(f"ndp-ep run: no --inputs: random {kind} from the model's inputs{source}", file=sys.stderr)
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(names, feeds), strict=True))
    if args.outputs:
        save_arrays(args.outputs, outputs)
    report = session.last_report
    if args.json:
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
