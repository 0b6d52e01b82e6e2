"""`ndp-ep run`: in progress."""

from __future__ import annotations

import argparse

HELP = "(run: in progress)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    raise SystemExit("ndp-ep run is not implemented yet")
