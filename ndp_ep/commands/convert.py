"""`ndp-ep convert`: in progress."""

from __future__ import annotations

import argparse

HELP = "(convert: in progress)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    raise SystemExit("ndp-ep convert is not implemented yet")
