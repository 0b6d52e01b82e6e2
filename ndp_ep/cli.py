"""The ``ndp-ep`` command line: one subcommand per module in :mod:`ndp_ep.commands`.

Each command module defines ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int`` and imports its
heavy dependencies inside ``run`` so that ``ndp-ep --help`` stays fast. Options shared by several commands
come from :mod:`ndp_ep.cli_args`. Conventions (docs/cli.md):

- ``--help`` shows every option's default; ``--version`` prints the installed version and the simulator core.
- Input errors of any package become one line on stderr (``ndp-ep CMD: error: ...``) and exit code 2, with
  no traceback; graph-pass errors are translated by :func:`ndp_ep.errors.translate_graph_pass_error`.
- ``--json`` prints JSON on stdout; files are written only where an option names them.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from ndp_ep.cli_args import HELP_DEFAULT

COMMANDS = ("convert", "inspect", "run", "demo", "generate", "bench", "sweep", "validate", "diff", "trace-stats")
EXIT_BAD_INPUT = 2
DISTRIBUTION = "ndp-ep"


def version() -> str:
    """The version of a checkout's ``pyproject.toml`` when run from one, else the installed distribution's."""
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    if pyproject.is_file():
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib
        try:
            project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
        except (OSError, ValueError):
            project = {}
        if project.get("name") == DISTRIBUTION and isinstance(project.get("version"), str):
            return project["version"]
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    try:
        return installed_version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def _input_error_types() -> tuple[type[BaseException], ...]:
    from graph_passes.errors import GraphPassError
    from graph_passes.sharded_op import ShardedOpError
    from hw_model.errors import HwModelError
    from ndp_ep.errors import NdpEpError
    from ndp_io import FileSafetyError

    return (NdpEpError, GraphPassError, ShardedOpError, HwModelError, FileSafetyError, OSError)


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, plus ``(default: X)`` on every option whose default is a value (or that names
    one through :data:`ndp_ep.cli_args.HELP_DEFAULT`) and is not already stated in its help; lines never break
    inside a hyphenated name (``paper-ddr5-4800``)."""

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        # argparse measures a command's name at the list's indent, not at the deeper one it prints it at, so a
        # long name (trace-stats) would push its help onto the next line
        subactions = getattr(action, "_get_subactions", None)
        if action.help is not argparse.SUPPRESS and subactions is not None:
            deeper = self._current_indent + self._indent_increment
            for sub in subactions():
                length = len(self._format_action_invocation(sub)) + deeper
                self._action_max_length = max(self._action_max_length, length)

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        shown = getattr(action, HELP_DEFAULT, None)
        if shown is not None and "default" not in text:  # a default resolved after parsing, named here
            return text + " (default: " + str(shown()).replace("%", "%%") + ")"
        default = action.default
        if (
            action.option_strings
            and default is not None
            and default is not False
            and default != argparse.SUPPRESS
            and not (isinstance(default, list | tuple) and not default)
            and "default" not in text
        ):
            text += " (default: %(default)s)"
        return text


class _VersionAction(argparse.Action):
    """``--version``: prints ``ndp-ep VERSION`` on stdout, then which simulator core runs (the modules
    ``pip install .`` compiled with mypyc, or pure Python), and exits 0; the version is read only when asked
    (reading ``pyproject.toml`` imports ``tomllib``, a cost every other command would pay at start-up)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs) -> None:
        kwargs.setdefault("help", "show the program's version number and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace, values, option_string=None) -> None:
        import hw_model

        compiled = hw_model.compiled_modules()
        core = f"compiled with mypyc ({', '.join(compiled)})" if compiled else "pure Python"
        print(f"{parser.prog} {version()}\nsimulator core: {core}")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # argparse's own usage errors: exit 2 with one line
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line; with ``argv``, only the command it names gets its options (building every command's
    options imports the simulator's presets and policies, a large part of a short command's start-up), and
    when that command comes first (no ``--help`` before it) the other command modules are not even imported."""
    parser = _Parser(prog="ndp-ep", description="MoE inference on GPU + NDP-DIMM systems through ONNX Runtime")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None) if argv is not None else None
    names: Sequence[str] = COMMANDS
    if chosen in COMMANDS and argv is not None and argv[0] == chosen:
        names = (chosen,)  # only the chosen command's parser is ever consulted: the others' help is never shown
    for name in names:
        module = importlib.import_module(f"ndp_ep.commands.{name.replace('-', '_')}")
        command_parser = sub.add_parser(name, help=module.HELP, description=module.HELP)
        if chosen is None or chosen == name or chosen not in COMMANDS:
            module.add_arguments(command_parser)
        command_parser.set_defaults(_module=module)
    return parser


def error_message(exc: BaseException) -> str:
    """The one line shown for an input error: its first line; for an OS error, its reason and the path."""
    from ndp_ep.errors import translate_graph_pass_error

    translated = translate_graph_pass_error(exc)
    if translated is not None:
        exc = translated
    if isinstance(exc, OSError) and exc.filename is not None:
        from ndp_io.guard import shown_path

        return f"{exc.strerror or 'cannot open'}: {shown_path(os.fsdecode(exc.filename))}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def warn(command: str, message: str) -> None:
    """A one-line warning on stderr (``ndp-ep CMD: warning: ...``); the command goes on."""
    print(f"ndp-ep {command}: warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (0 ok, 1 a negative answer such as ``diff``'s, 2 bad input)."""
    from ndp_ep.text import terminal_streams

    with terminal_streams():  # nothing printed sends a control character to the terminal (ndp_ep/text.py)
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = build_parser(sys.argv[1:] if argv is None else list(argv)).parse_args(argv)
    except SystemExit as done:  # --help, --version, or a usage error already printed as one line
        return done.code if isinstance(done.code, int) else EXIT_BAD_INPUT
    except OSError as exc:  # an option's type function probing a path the system refuses (too long, ...)
        print(f"ndp-ep: error: {error_message(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return int(args._module.run(args) or 0)
    except _input_error_types() as exc:
        if isinstance(exc, BrokenPipeError):  # stdout closed early (``ndp-ep ... | head``)
            sys.stderr.close()
            return 0
        print(f"ndp-ep {args.command}: error: {error_message(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


def program() -> NoReturn:
    """The ``ndp-ep`` program (console script and ``python -m ndp_ep``): :func:`main` on ``sys.argv``; then, when
    no other Python thread is running, the process ends without the interpreter's teardown.

    Tearing down frees every module (onnx, protobuf, numpy...) and destroys ONNX Runtime's environment and the
    provider library: 20-40 ms of a ~0.3 s ``ndp-ep run``, spent on memory the operating system reclaims anyway.
    Nothing is lost: every file a command writes is complete (fsynced and renamed) before :func:`main`
    returns, stdout and stderr are flushed, and the ``atexit`` callbacks run as at a normal exit. With another
    thread still running the exit is the normal one (waiting for that thread is part of the program)."""
    code = main()
    if any(t is not threading.main_thread() and not t.daemon for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()  # what a normal exit runs first (logging.shutdown...); not the module teardown
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing left to deliver
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    program()
