"""`ndp-ep diff` output formats are the render_<format>.py modules of ndp_ep.diff, found by name: the three shipped
ones are found, a module added to the package's path becomes a ``--format`` choice with no other edit, and a
render_ module that is not a renderer is refused by name."""

from __future__ import annotations

import json
import sys

import pytest

import ndp_ep.diff
from ndp_ep.cli import main
from ndp_ep.diff import RenderOptions, diff_models, render_text, renderers

ADDED = '''"""A test renderer: the verdict and node counts, one line."""
FORMAT = "oneline"
DESCRIPTION = "one line: verdict and node counts"


def render(diff, options):
    return ("EQUIVALENT" if diff.equivalent else "DIFFERENT") + f" {sum(diff.node_counts.values())}\\n"
'''


@pytest.fixture
def extra_package_dir(tmp_path, monkeypatch):
    """A directory added to ndp_ep.diff's package path; modules imported from it are forgotten afterwards."""
    monkeypatch.setattr(ndp_ep.diff, "__path__", [*ndp_ep.diff.__path__, str(tmp_path)])
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("ndp_ep.diff.render_"):
            del sys.modules[name]


def test_the_three_shipped_formats_are_found_with_descriptions():
    found = renderers()
    assert list(found) == ["html", "json", "text"]
    assert all(r.description and r.format == name for name, r in found.items())


def test_each_format_prints_its_own_rendering(sample_pairs, capsys):
    a, b = map(str, sample_pairs["one_node_changed"])
    assert main(["diff", "--format", "json", a, b]) == 1
    assert json.loads(capsys.readouterr().out)["equivalent"] is False
    assert main(["diff", "--format", "html", a, b]) == 1
    assert capsys.readouterr().out.lstrip().lower().startswith("<!doctype html>")
    assert main(["diff", "--format", "text", a, b]) == 1
    assert "Result: DIFFERENT" in capsys.readouterr().out


def test_an_added_render_module_becomes_a_format_choice(extra_package_dir, sample_pairs, capsys):
    a, b = sample_pairs["one_node_changed"]
    assert "oneline" not in renderers()
    (extra_package_dir / "render_oneline.py").write_text(ADDED)
    assert renderers()["oneline"].description == "one line: verdict and node counts"
    expected_nodes = sum(diff_models(a, b).node_counts.values())
    assert main(["diff", "--format", "oneline", str(a), str(b)]) == 1
    assert capsys.readouterr().out == f"DIFFERENT {expected_nodes}\n"
    assert main(["diff", "--help"]) == 0
    assert "oneline: one line: verdict and node counts" in " ".join(capsys.readouterr().out.split())


def test_a_render_module_without_format_is_refused_by_name(extra_package_dir):
    (extra_package_dir / "render_broken.py").write_text("def render(diff, options):\n    return ''\n")
    with pytest.raises(TypeError, match=r"ndp_ep\.diff\.render_broken is not a diff renderer"):
        renderers()


def test_text_options_reach_the_text_renderer(sample_pairs):
    diff = diff_models(*sample_pairs["ndp_ep_rewrite"])
    text = renderers()["text"].render
    assert "\x1b[" in text(diff, RenderOptions(colour=True)) and "\x1b[" not in text(diff, RenderOptions())
    for max_items in (0, 1):
        assert text(diff, RenderOptions(max_items=max_items)) == render_text(diff, max_items=max_items)


def test_json_with_another_format_is_a_one_line_error(sample_pairs, capsys):
    a, b = map(str, sample_pairs["one_node_changed"])
    assert main(["diff", "--json", "--format", "html", a, b]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["ndp-ep diff: error: --json prints the json format; it cannot go with --format html"]
    assert main(["diff", "--json", "--format", "json", a, b]) == 1  # the same thing said twice is fine
