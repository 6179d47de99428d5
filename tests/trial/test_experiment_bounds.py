"""Issue 21 item 6: ``servelab trial --check`` accepted ``requests_per_step`` of 10^30 and ``timeout_s:
.inf``, and a 5,000-deep YAML list ended in a 1,107-line RecursionError. Each is now one line naming the
field (or the line and column of the nesting) with exit status 2; the gateway's config, read by the same
loader (:func:`servelab.wire.config.read_yaml_file`), refuses the deep file the same way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BASE = "name: x\narrival_test: {enabled: false}\n"
CAND = "candidates:\n- {name: a, engine: mock}\n"


def servelab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "servelab.cli", *args], capture_output=True, text=True, timeout=60)


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith("servelab: error: "), lines
    return lines[0]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            "requests_per_step: 1000000000000000000000000000000\n" + CAND,
            "requests_per_step: input should be less than or equal to 1000000",
        ),
        ("requests_per_step: 1.0e+18\n" + CAND, "requests_per_step: input should be less than or equal to 1000000"),
        ("warmup: 1.0e+15\n" + CAND, "warmup: input should be less than or equal to 1000000"),
        ("timeout_s: .inf\n" + CAND, "timeout_s: .inf is not a finite number"),
        ("timeout_s: 1.0e+300\n" + CAND, "timeout_s: input should be less than or equal to 604800"),
        ("steps: {concurrency: [1000000000]}\n" + CAND, "steps.concurrency[0]: input should be less than or equal"),
        ("steps: {rates: [.nan]}\n" + CAND, "steps.rates[0]: .nan is not a finite number"),
        (
            "candidates:\n- {name: a, engine: mock, settings: {ready_timeout_s: -.inf}}\n",
            "candidates[0].settings.ready_timeout_s: -.inf is not a finite number",
        ),
    ],
)
def test_unbounded_numbers_refused_by_check(text: str, want: str, tmp_path: Path) -> None:
    f = tmp_path / "exp.yaml"
    f.write_text(BASE + text)
    assert want in one_line(servelab("trial", str(f), "--check"))


def test_a_bounded_experiment_still_passes_check(tmp_path: Path) -> None:
    f = tmp_path / "exp.yaml"
    f.write_text(BASE + "requests_per_step: 1000000\ntimeout_s: 604800\n" + CAND)
    r = servelab("trial", str(f), "--check")
    assert r.returncode == 0 and "requests_per_step: 1000000" in r.stdout, r.stderr


@pytest.mark.parametrize("depth", [101, 5000])
def test_deep_yaml_is_one_line_for_trial_and_gateway(depth: int, tmp_path: Path) -> None:
    f = tmp_path / "deep.yaml"
    f.write_text("name: x\ncandidates: " + "[" * depth + "]" * depth + "\n")
    line = one_line(servelab("trial", str(f), "--check"))
    # the mapping is level 1: the 100th bracket (column 13 + 99) is level 101
    assert f"{f}: line 2 column 112: nested deeper than 100 levels" in line and "RecursionError" not in line
    line = one_line(servelab("gateway", "--config", str(f)))
    assert "nested deeper than 100 levels" in line


def test_hundred_levels_are_read(tmp_path: Path) -> None:
    from servelab.wire.config import read_yaml_file

    f = tmp_path / "ok.yaml"
    f.write_text("x: " + "[" * 98 + "1" + "]" * 98 + "\n")  # the mapping is level 1, the scalar level 100
    data = read_yaml_file(f, what="test", missing_fix="", empty_fix="")
    for _ in range(99):
        data = data["x"] if isinstance(data, dict) else data[0]
    assert data == 1
