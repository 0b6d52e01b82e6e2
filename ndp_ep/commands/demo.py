"""`ndp-ep demo`: in progress."""

from __future__ import annotations

import argparse

HELP = "(demo: in progress)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    raise SystemExit("ndp-ep demo is not implemented yet")
