"""The ``ndp-ep`` command line: one subcommand per module in :mod:`ndp_ep.commands`.

Each command module defines ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int`` and imports its
heavy dependencies inside ``run`` so that ``ndp-ep --help`` stays fast. Input errors of any package become
one line on stderr and exit code 2, with no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS = ("convert", "inspect", "run", "demo", "bench", "validate", "diff")
EXIT_BAD_INPUT = 2


def _input_error_types() -> tuple[type[BaseException], ...]:
    from graph_passes.errors import GraphPassError
    from hw_model.errors import HwModelError
    from ndp_ep.errors import NdpEpError

    return (NdpEpError, GraphPassError, HwModelError, FileNotFoundError, IsADirectoryError, PermissionError)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own usage errors: exit 2 with one line
        self.exit(EXIT_BAD_INPUT, f"ndp-ep: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ndp-ep", description="MoE inference on GPU + NDP-DIMM systems through ONNX Runtime")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMANDS:
        module = importlib.import_module(f"ndp_ep.commands.{name}")
        command_parser = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command_parser)
        command_parser.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._module.run(args) or 0)
    except _input_error_types() as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, OSError) and exc.filename is not None:
            message = f"{exc.strerror or 'cannot open'}: {exc.filename}"
        print(f"ndp-ep {args.command}: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # stdout closed early (``ndp-ep ... | head``)
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
