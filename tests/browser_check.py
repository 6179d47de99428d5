"""Headless-Chromium checks shared by the report tests: the page loads offline and every plotly
chart draws (Debian ``chromium``; skipped unless SERVELAB_REQUIRE_BROWSER is set when missing)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest


def _chart_count(text: str) -> int:
    return int(re.search(r'data-charts="(\d+)"', text).group(1))


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe:
        return exe
    if os.environ.get("SERVELAB_REQUIRE_BROWSER"):
        pytest.fail("SERVELAB_REQUIRE_BROWSER is set but `chromium` is not on PATH: run scripts/install-chromium.sh")
    pytest.skip(
        "headless Chromium not installed (`chromium` not on PATH): run scripts/install-chromium.sh "
        "to test that the report renders"
    )


def _chromium_run(page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = _chromium()
    cmd = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-quic",
        f"--user-data-dir={tmp}",
        "--virtual-time-budget=10000",
        *args,
        page.resolve().as_uri(),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def _assert_rendered(dom: str, charts: int) -> None:
    assert charts > 0
    # plotly marks each drawn graph div and draws two main-svg layers per graph
    assert len(re.findall(r'class="plotly-graph-div js-plotly-plot"', dom)) == charts, "not every chart drew"
    assert dom.count('class="main-svg"') >= charts
    assert dom.count('<g class="scatterlayer') + dom.count('<g class="barlayer') >= charts
    m = re.search(r'<div id="js-errors">(.*?)</div>', dom, re.S)
    assert m is not None and m.group(1).strip() == "", f"script errors: {m.group(1) if m else '?'}"
    visible = re.sub(r"<(script|style)\b.*?</\1>", "", dom, flags=re.S)
    assert "Error:" not in visible
