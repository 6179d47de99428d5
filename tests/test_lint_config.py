"""The static checks' configuration (pyproject.toml, run by scripts/lint.sh from scripts/test.sh) catches what
it claims to: a function over the complexity limit, an implicit Optional, a stale ``type: ignore``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _complex_function(branches: int) -> str:
    body = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(branches))
    return f"def f(x: int) -> int:\n{body}    return -1\n"


def test_ruff_enforces_the_complexity_limit(tmp_path: Path) -> None:
    ok, over = tmp_path / "ok.py", tmp_path / "over.py"
    ok.write_text(_complex_function(19))  # complexity 20: the limit
    over.write_text(_complex_function(20))  # 21
    cmd = [str(BIN / "ruff"), "check", "--no-cache", "--config", str(ROOT / "pyproject.toml")]
    assert subprocess.run([*cmd, str(ok)], capture_output=True, text=True).returncode == 0
    r = subprocess.run([*cmd, str(over)], capture_output=True, text=True)
    assert r.returncode == 1 and "C901" in r.stdout and "(21 > 20)" in r.stdout


def test_mypy_refuses_implicit_optional_and_stale_ignores(tmp_path: Path) -> None:
    mod = tmp_path / "m.py"
    mod.write_text("def f(x: int = None) -> int:\n    return 1\n\n\ny: int = 1  # type: ignore[assignment]\n")
    r = subprocess.run(
        [str(BIN / "mypy"), "--config-file", str(ROOT / "pyproject.toml"), "--no-incremental", str(mod)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 1
    assert "implicit Optional" in r.stdout or "Incompatible default for parameter" in r.stdout
    assert 'Unused "type: ignore" comment' in r.stdout


def test_the_test_command_runs_the_static_checks() -> None:
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    lint_sh = (ROOT / "scripts" / "lint.sh").read_text()
    lines = [x.strip() for x in test_sh.splitlines() if not x.strip().startswith("#")]
    lint = next(i for i, x in enumerate(lines) if x.startswith("bash scripts/lint.sh"))
    runs = [i for i, x in enumerate(lines) if "-m pytest" in x]
    assert runs and lint < min(runs) and "set -euo pipefail" in lines  # before any test run, under `set -e`
    for step in ("ruff check", "mypy", "servelab schema check"):
        assert step in lint_sh
    for ruff in (".venv/bin/ruff check", ".venv/bin/ruff format --check"):  # the lint and the format check
        line = next(x for x in lint_sh.splitlines() if x.startswith(ruff))
        assert {"src", "tests", "benches"} <= set(line.split()), line
