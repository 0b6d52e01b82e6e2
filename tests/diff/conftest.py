"""Fixtures of the diff tests: the four sample pairs written once per session into a temp directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from diff_sample_pairs import write_pair

PAIR_KINDS = ("identical", "renamed", "one_node_changed", "ndp_ep_rewrite")


@pytest.fixture(scope="session")
def sample_pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    directory = tmp_path_factory.mktemp("diff_pairs")
    return {kind: write_pair(directory, kind) for kind in PAIR_KINDS}
