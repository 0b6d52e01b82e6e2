"""`ndp-ep diff`: not yet implemented (placeholder for its issue)."""

from __future__ import annotations

import argparse

HELP = "(diff: in progress)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    raise SystemExit("ndp-ep diff is not implemented yet")
