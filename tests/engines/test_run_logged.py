"""The build/install step runner shared by the llama.cpp build and the vLLM install."""

from __future__ import annotations

import subprocess
import sys

import pytest

from servelab.engines.spawn import run_logged


def test_progress_percent_and_log(tmp_path):
    log = tmp_path / "build.log"
    notes: list[str] = []
    script = "import sys\nfor p in (0, 5, 10, 50, 100):\n    print(f'[{p:3d}%] step', flush=True)\n"
    run_logged([sys.executable, "-c", script], log, notes.append, "build", cwd=tmp_path, show="python build")
    text = log.read_text()
    assert "[ 50%] step" in text and "# servelab: build: python build" in text
    pct = [n for n in notes if n.startswith("build: ") and "%" in n]
    assert [n.split()[1] for n in pct] == ["0%", "10%", "50%", "100%"]


def test_failure_raises_with_log_tail(tmp_path):
    log = tmp_path / "x.log"
    with pytest.raises(RuntimeError, match=r"(?s)boom failed with status 3;.*last words"):
        run_logged([sys.executable, "-c", "print('last words'); raise SystemExit(3)"], log, lambda s: None, "boom")


def test_timeout_kills(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        run_logged(
            [sys.executable, "-c", "import time\nwhile True:\n    print('tick', flush=True); time.sleep(0.05)"],
            tmp_path / "t.log",
            lambda s: None,
            "loop",
            timeout_s=0.5,
        )
