"""The HTML report runs in a real browser: headless Chromium loads it without script errors and shows the
summary and the before/after SVG subgraphs. Skipped, with the reason, where Chromium is not installed."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from ndp_ep.cli import main

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


def _chromium() -> str | None:
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


def _rendered_dom(browser: str, page_url: str, profile: str) -> str:
    completed = subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=5000", "--dump-dom", page_url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    return completed.stdout


@pytest.mark.skipif(_chromium() is None, reason="Chromium is not installed (Debian package 'chromium')")
def test_html_report_loads_in_headless_chromium_without_script_errors(sample_pairs, tmp_path):
    browser = _chromium()
    assert browser is not None
    page = tmp_path / "rewrite.html"
    assert main(["diff", "-q", "--html", str(page), *map(str, sample_pairs["ndp_ep_rewrite"])]) == 1
    dom = _rendered_dom(browser, page.as_uri(), str(tmp_path / "profile"))

    body = re.search(r"<body([^>]*)>", dom)
    assert body is not None, dom[:500]
    assert 'data-script-status="ok"' in body.group(1), "the page's script did not finish"
    errors = re.search(r'<pre id="script-errors">(.*?)</pre>', dom, re.S)
    assert errors is not None and errors.group(1).strip() == "", errors.group(1) if errors else dom[:500]
    assert re.search(r"<title>(.*?)</title>", dom).group(1) == "ndp-ep diff: different"
    svg_count = int(re.search(r'data-svg-count="(\d+)"', body.group(1)).group(1))
    assert svg_count >= 2
    assert 'id="summary"' in dom and "DIFFERENT" in dom and "ShardedMoEExperts" in dom
    assert re.search(r'<svg class="subgraph"[^>]*>.*?<rect', dom, re.S), "no drawn subgraph node"


@pytest.mark.skipif(_chromium() is None, reason="Chromium is not installed (Debian package 'chromium')")
def test_script_error_recorder_catches_a_broken_page(tmp_path):
    """The error recorder the test relies on does report an error (so the test above can fail)."""
    browser = _chromium()
    assert browser is not None
    from ndp_ep.diff.render_html import _ERROR_RECORDER

    page = tmp_path / "broken.html"
    page.write_text(
        f"<!DOCTYPE html><html><head><script>{_ERROR_RECORDER}</script></head><body>"
        '<pre id="script-errors"></pre><script>undefinedFunction();</script></body></html>',
        encoding="utf-8",
    )
    dom = _rendered_dom(browser, page.as_uri(), str(tmp_path / "profile"))
    assert "undefinedFunction" in re.search(r'<pre id="script-errors">(.*?)</pre>', dom, re.S).group(1)
