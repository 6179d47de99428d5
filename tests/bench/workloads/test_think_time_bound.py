"""Issue 21 item 6: ``servelab bench --think-time-s 1e22`` was accepted and the step hung (a user who
"thinks" for 1e22 s between turns). The mean think time is bounded (0 to
:data:`servelab.bench.options.MAX_THINK_TIME_S`) and a value outside is refused with one line, before
anything is sent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from servelab.bench.options import MAX_THINK_TIME_S


@pytest.mark.parametrize("value", ["1e22", "3601", "inf", "-1"])
def test_think_time_out_of_bounds_refused_in_one_line(value: str, tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "servelab.cli",
            "bench",
            "--url",
            "http://127.0.0.1:9/v1",
            "--sessions",
            "2",
            "--turns",
            "2",
            f"--think-time-s={value}",
            "-c",
            "1",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("servelab: error: --think-time-s"), lines
    assert f"to {MAX_THINK_TIME_S:g}" in lines[0] and "e.g. --think-time-s 2" in lines[0]
    assert not (tmp_path / "run").exists()


def test_the_bound_is_an_hour() -> None:
    assert MAX_THINK_TIME_S == 3600.0
