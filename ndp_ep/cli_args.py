"""Argument builders and validators shared by every ``ndp-ep`` command: one definition per option.

Every command that takes hardware, NDP units, shards, a sequence length, a seed, a policy or JSON output adds
it through this module, so the same option is spelled, bounded, defaulted and documented the same way
everywhere (``ndp-ep run --ndp-units 1e8`` and ``ndp-ep convert --ndp-units 0`` fail alike, with one line and
exit code 2, before anything is allocated)::

    add_hardware_args(parser)          # --hw (presets listed from hw_model/presets), --ndp-units
    add_shards_arg(parser)             # --shards
    add_policy_arg(parser)             # --policy (None: the settings' default)
    add_dtype_arg(parser)              # --dtype
    add_tuning_args(parser)            # one option per tuning knob of hw_model.tuning.SimulatorTuning
    settings_from_args(args)           # the run's hw_model.SimulationSettings, from the options above
    add_feed_args(parser)              # --seq-len, --seed
    add_seed_arg(parser, of=...)       # --seed alone (a command without random feeds)
    add_json_args(parser)              # --json (stdout) [and --json-out FILE]

The simulation options (``--hw``, ``--ndp-units``, ``--policy``, ``--dtype`` and the tuning knobs) are built from the
fields of :class:`hw_model.settings.SimulationSettings` (their ``metadata["help"]``, default and type) and are
checked by it, once, when the command builds its settings (:func:`settings_from_args`): a bad one is
:class:`hw_model.SettingsError`, one line and exit code 2, before any work.

Bounds (why each one):

- ``--ndp-units`` 1..64 (:data:`hw_model.hardware.MAX_NDP_UNITS`, which every hardware system obeys; checked by the
  settings): a host has at most a few dozen DIMM slots; the simulator's state grows with the unit count (a run
  with 10,000 units took 113 s and 10^8 exhausted memory).
- ``--shards`` 1..256: a shard is a column slice of one expert; more shards than that are never useful and the
  number of weight tensors grows as experts x shards.
- ``--seq-len`` 1..65,536: random feeds are allocated from it (2e9 reached 24 GB before the OOM killer).
- ``--seed`` >= 0: numpy's generators reject negative seeds.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from hw_model.hardware import MAX_NDP_UNITS
from hw_model.settings import DEFAULT_POLICY, SimulationSettings

MAX_SHARDS = 256
MAX_SEQ_LEN = 65_536
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
    from ndp_io import OutputWriteError
    from ndp_io.guard import check_output_dir

    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty; name a directory")
    try:
        check_output_dir(text)  # writable, checked before the work rather than after it
    except OutputWriteError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def preset_names() -> list[str]:
    """The hardware presets shipped in ``hw_model/presets`` (found on disk, never hard-coded)."""
    from hw_model.hardware import list_presets

    return list_presets()


def policy_names() -> tuple[str, ...]:
    """Every scheduling policy the simulator knows (the choices of ``--policy``)."""
    from hw_model.policies import policy_names as registered

    return registered()


def _count_option(parser: argparse.ArgumentParser, flag: str, most: int, default: int | None, help: str) -> None:
    """An ``N`` option taking a whole number from 1 to ``most``."""
    parser.add_argument(flag, type=bounded_int(1, most), default=default, metavar="N", help=help)


_SETTINGS = {f.name: f for f in SimulationSettings.option_fields()}


def _plain_int(text: str) -> int | str:
    """A plain integer's value; any other text as it is, for the settings to refuse naming it (``1e8``)."""
    stripped = text.strip()
    return int(stripped) if stripped.isascii() and stripped.isdigit() else text


def _add_setting(parser: argparse.ArgumentParser, name: str, **kwargs) -> argparse.Action:
    """The option of settings field ``name``: ``--name-with-dashes``, its help (``{...}`` filled from ``kwargs``'
    ``fill``), metavar and default from the field."""
    spec = _SETTINGS[name]
    fill = kwargs.pop("fill", {})
    kwargs.setdefault("default", spec.default)
    if "metavar" in spec.metadata:
        kwargs.setdefault("metavar", spec.metadata["metavar"])
    return parser.add_argument(
        "--" + name.replace("_", "-"), dest=name, help=spec.metadata["help"].format(**fill), **kwargs
    )


def add_hardware_args(parser: argparse.ArgumentParser, *, default_hw: str | None = None, units: bool = True) -> None:
    """``--hw NAME|FILE.toml`` (help lists the presets found; default the settings', unless a command measuring
    other hardware names its own) and, unless ``units=False``, ``--ndp-units N``."""
    presets = {"presets": ", ".join(preset_names())}
    _add_setting(parser, "hw", fill=presets, **({"default": default_hw} if default_hw is not None else {}))
    if units:
        _add_setting(parser, "ndp_units", type=_plain_int, fill={"max_units": MAX_NDP_UNITS})


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


class _PolicyNames:
    """:func:`policy_names` as ``--help`` lists them, read only when the help is shown: building the parser does
    not import the simulator's policies, which a run then imports while ONNX Runtime builds its session
    (:class:`ndp_ep.session.InferenceSession`)."""

    def __str__(self) -> str:
        return ", ".join(policy_names())


def add_policy_arg(parser: argparse.ArgumentParser) -> None:
    """``--policy``: one of the simulator's policies; None when not given (the settings' default, which
    ``--help`` names: :data:`HELP_DEFAULT`)."""
    action = _add_setting(parser, "policy", default=None, fill={"policies": "%(policies)s"})
    action.policies = _PolicyNames()  # type: ignore[attr-defined]  # argparse fills %(policies)s from it
    setattr(action, HELP_DEFAULT, lambda: DEFAULT_POLICY)


def add_dtype_arg(parser: argparse.ArgumentParser) -> None:
    """``--dtype``: the dtype every expert's weights are costed in (None: as stored, float experts in bf16)."""
    from hw_model.hardware import DTYPE_BYTES

    _add_setting(parser, "dtype", metavar="{" + ",".join(sorted(DTYPE_BYTES)) + "}")


def add_tuning_args(parser: argparse.ArgumentParser) -> None:
    """One option per tuning knob of :class:`hw_model.tuning.SimulatorTuning` (``--residency-fraction F``...):
    None when not given (the settings' default, which ``--help`` names)."""
    from dataclasses import fields

    from hw_model.tuning import SimulatorTuning

    for spec in fields(SimulatorTuning):
        if spec.metadata.get("cli", True):
            number = int if isinstance(spec.default, int) else float
            action = _add_setting(parser, spec.name, type=number, default=None)
            setattr(action, HELP_DEFAULT, lambda default=spec.default: default)


def settings_from_args(args: argparse.Namespace) -> SimulationSettings:
    """The run's :class:`hw_model.SimulationSettings` from the simulation options a command added (those not given
    keep the settings' defaults); a bad one raises :class:`hw_model.SettingsError` naming it."""
    from hw_model.errors import SettingsError

    given = {name: getattr(args, name) for name in _SETTINGS if getattr(args, name, None) is not None}
    try:
        return SimulationSettings(**given)
    except SettingsError as exc:  # named as argparse names an option: "argument --ndp-units: expected ..."
        if exc.setting is None:
            raise
        problem = str(exc).removeprefix(f"{exc.setting}: ")
        raise SettingsError(f"argument --{exc.setting.replace('_', '-')}: {problem}", exc.setting) from None


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


def check_trace_path(path: str | None) -> None:
    """:class:`NdpEpError` unless ``path`` (a ``--save-routing`` value, None: not given) ends in ``.npz``."""
    if path is not None and not str(path).lower().endswith(".npz"):
        from ndp_ep.errors import NdpEpError

        raise NdpEpError(f"--save-routing: a routing trace file must end in .npz, got {path!r}")


def add_save_routing_arg(parser) -> None:
    """The ``--save-routing FILE.npz`` option of ``ndp-ep run`` and ``ndp-ep generate``."""
    parser.add_argument(
        "--save-routing",
        type=output_file,
        metavar="FILE.npz",
        help="write the run's routing (per step and MoE layer, with the model's shapes) as a routing trace "
        "(docs/trace_format.md), for ndp-ep bench --trace and ndp-ep trace-stats",
    )


def add_placement_arg(parser: argparse.ArgumentParser) -> None:
    """``--placement FILE.toml``: experts pinned per layer and a GPU pool cap (:mod:`hw_model.pins`)."""
    _add_setting(parser, "placement")
