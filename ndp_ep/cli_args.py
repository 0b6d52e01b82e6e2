"""Argument builders and validators shared by every ``ndp-ep`` command: one definition per option.

Every command that takes hardware, NDP units, shards, a sequence length, a seed, a policy or JSON output adds
it through this module, so the same option is spelled, bounded, defaulted and documented the same way
everywhere (``ndp-ep run --ndp-units 1e8`` and ``ndp-ep convert --ndp-units 0`` fail alike, with one line and
exit code 2, before anything is allocated)::

    add_hardware_args(parser)          # --hw (presets listed from hw_model/presets), --ndp-units
    add_shards_arg(parser)             # --shards
    add_policy_arg(parser)             # --policy, choices from hw_model's policy list (None: its default)
    add_feed_args(parser)              # --seq-len, --seed
    add_seed_arg(parser, of=...)       # --seed alone (a command without random feeds)
    add_json_args(parser)              # --json (stdout) [and --json-out FILE]

Bounds (why each one):

- ``--ndp-units`` 1..64 (:data:`hw_model.hardware.MAX_NDP_UNITS`, which every hardware system obeys): a host has
  at most a few dozen DIMM slots; the simulator's state grows with the unit count (a run with 10,000 units took
  113 s and 10^8 exhausted memory).
- ``--shards`` 1..256: a shard is a column slice of one expert; more shards than that are never useful and the
  number of weight tensors grows as experts x shards.
- ``--seq-len`` 1..65,536: random feeds are allocated from it (2e9 reached 24 GB before the OOM killer).
- ``--seed`` >= 0: numpy's generators reject negative seeds.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from hw_model.hardware import MAX_NDP_UNITS

MAX_SHARDS = 256
MAX_SEQ_LEN = 65_536
DEFAULT_HW = "paper"
DEFAULT_SEQ_LEN = 8
DEFAULT_SEED = 0
# an option whose default is resolved after parsing (its default is None) names it in --help through this
# attribute of its argparse action: a function returning the value shown (ndp_ep.cli.HelpFormatter)
HELP_DEFAULT = "help_default"


def bounded_int(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` accepting a plain integer in ``[low, high]`` (no upper bound when ``high`` is None);
    ``1e8``, ``2.5`` and ``0x10`` are refused."""
    if high is not None and low > high:
        raise ValueError(f"empty range [{low}, {high}]")
    wanted = f"an integer from {low} to {high:,}" if high is not None else f"an integer of at least {low}"

    def parse(text: str) -> int:
        stripped = text.strip()
        digits = stripped[1:] if stripped[:1] in "+-" else stripped
        if not (digits.isascii() and digits.isdigit()):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        value = int(stripped)
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {value:,}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


def output_file(text: str) -> str:
    """An argparse ``type`` for a file the command will write: refused, naming the user's own path, when it is
    empty, not a file name, too long, an existing directory, or in a directory that does not exist
    (:func:`ndp_io.check_output_path`)."""
    from ndp_io import OutputWriteError, check_output_path

    try:
        check_output_path(text)
    except OutputWriteError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def output_dir(text: str) -> str:
    """An argparse ``type`` for a directory the command will create or fill (refused when a file has the name)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty; name a directory")
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a directory")
    return text


def preset_names() -> list[str]:
    """The hardware presets shipped in ``hw_model/presets`` (found on disk, never hard-coded)."""
    from hw_model.hardware import list_presets

    return list_presets()


def policy_names() -> tuple[str, ...]:
    """Every scheduling policy the simulator knows (the choices of ``--policy``)."""
    from hw_model.policies import policy_names as registered

    return registered()


def default_policy() -> str:
    from hw_model.policies import DEFAULT_POLICY

    return DEFAULT_POLICY


def _count_option(parser: argparse.ArgumentParser, flag: str, most: int, default: int | None, help: str) -> None:
    """An ``N`` option taking a whole number from 1 to ``most``."""
    parser.add_argument(flag, type=bounded_int(1, most), default=default, metavar="N", help=help)


def add_hardware_args(parser: argparse.ArgumentParser, *, default_hw: str = DEFAULT_HW, units: bool = True) -> None:
    """``--hw NAME|FILE.toml`` (help lists the presets found) and, unless ``units=False``, ``--ndp-units N``."""
    presets = ", ".join(preset_names())
    parser.add_argument(
        "--hw",
        default=default_hw,
        metavar="NAME|FILE.toml",
        help=f"hardware: a preset ({presets}) or a TOML file with the same fields",
    )
    if units:
        _count_option(
            parser,
            "--ndp-units",
            MAX_NDP_UNITS,
            None,
            f"number of NDP units (1-{MAX_NDP_UNITS}; default: the preset's own count)",
        )


def add_shards_arg(
    parser: argparse.ArgumentParser,
    *,
    purpose: str = "tensor-parallel shards per expert",
    default: str = "the number of NDP units",
) -> None:
    """``--shards N`` (None when not given: the command resolves ``default``, which the help names)."""
    _count_option(
        parser,
        "--shards",
        MAX_SHARDS,
        None,
        f"{purpose} (1-{MAX_SHARDS}; default: {default}); a count that does not divide the FFN width falls back "
        "to its largest divisor below it",
    )


class _PolicyNames(Sequence[str]):
    """:func:`policy_names`, read when argparse first looks at them (a ``--policy`` given, ``--help``): building
    the parser does not import the simulator's policies, which a run then imports while ONNX Runtime builds
    its session (:class:`ndp_ep.session.InferenceSession`)."""

    def _names(self) -> tuple[str, ...]:
        return policy_names()

    def __getitem__(self, index):
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __contains__(self, value: object) -> bool:
        return value in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())


def add_policy_arg(parser: argparse.ArgumentParser) -> None:
    """``--policy``: one of the simulator's policies; None when not given (the simulator's default, which
    ``--help`` names: :data:`HELP_DEFAULT`)."""
    action = parser.add_argument(
        "--policy",
        choices=_PolicyNames(),
        default=None,
        metavar="POLICY",
        help="scheduling policy the simulator applies: %(choices)s",
    )
    setattr(action, HELP_DEFAULT, default_policy)


def add_feed_args(parser: argparse.ArgumentParser) -> None:
    """``--seq-len`` and ``--seed`` of random feeds (used when no ``--inputs`` file is given)."""
    _count_option(
        parser,
        "--seq-len",
        MAX_SEQ_LEN,
        DEFAULT_SEQ_LEN,
        f"size of the symbolic (sequence) dimensions of random feeds, 1-{MAX_SEQ_LEN:,}",
    )
    add_seed_arg(parser, of="the random feeds")


def add_seed_arg(parser: argparse.ArgumentParser, *, of: str) -> None:
    """``--seed N`` (0 or more), the seed of ``of``."""
    parser.add_argument("--seed", type=bounded_int(0), default=DEFAULT_SEED, metavar="N", help=f"seed of {of}")


def add_json_args(parser: argparse.ArgumentParser, *, what: str, file_option: bool = False) -> None:
    """``--json``: print ``what`` as JSON on stdout instead of text; ``--json-out FILE`` also writes it to a file."""
    parser.add_argument("--json", action="store_true", help=f"print {what} as one JSON document on stdout")
    if file_option:
        parser.add_argument("--json-out", type=output_file, metavar="FILE", help=f"also write {what} as JSON to FILE")
