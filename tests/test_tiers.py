"""The test tiers (tests/conftest.py): every collected test has one, the markers pyproject.toml registers are
exactly the tiers, the path table names only files that exist, and a unit test that starts a subprocess fails."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _root_conftest(config: pytest.Config):
    """tests/conftest.py as pytest loaded it (the module name "conftest" may be tests/gateway/conftest.py's)."""
    path = ROOT / "tests" / "conftest.py"
    found = [p for p in config.pluginmanager.get_plugins() if getattr(p, "__file__", None) == str(path)]
    assert len(found) == 1, found
    return found[0]


def test_every_collected_test_has_a_tier(request: pytest.FixtureRequest) -> None:
    untiered = _root_conftest(request.config).untiered_tests(request.config)
    assert not untiered, (
        "tests with no tier: give each file (or test) its tiers in tests/conftest.py "
        f"PATH_TIERS, or its fixture in FIXTURE_TIERS: {untiered[:20]}"
    )


def test_pyproject_registers_exactly_the_tiers(request: pytest.FixtureRequest) -> None:
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    names = [m.split(":", 1)[0].strip() for m in markers]
    assert sorted(names) == sorted(_root_conftest(request.config).TIERS)
    assert all(len(m.split(":", 1)[1].strip()) > 10 for m in markers)  # each says what it means


def test_tables_name_existing_paths_and_tiers(request: pytest.FixtureRequest) -> None:
    mod = _root_conftest(request.config)
    for key, tiers in [*mod.PATH_TIERS.items(), *mod.FIXTURE_TIERS.items()]:
        assert tiers and set(tiers) <= set(mod.TIERS), (key, tiers)
        path = key.split("::", 1)[0]
        if "::" in key or path.startswith("tests"):
            assert (ROOT / path).exists(), f"{key}: no such path under the repository"


def test_a_unit_test_that_starts_a_subprocess_fails(tmp_path: Path) -> None:
    """A throw-away suite using this conftest: the unit test that runs `true` fails naming it; the one
    in-process passes. Run as a subprocess (this test's own tier is proc)."""
    suite = tmp_path / "tests"
    suite.mkdir()
    (suite / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (suite / "hypothesis_profiles.py").write_text((ROOT / "tests" / "hypothesis_profiles.py").read_text())
    (suite / "test_x.py").write_text(
        textwrap.dedent("""
        import subprocess
        def test_in_process():
            assert sum([1, 2]) == 3
        def test_spawns():
            subprocess.run(["true"], check=True)
    """)
    )
    src = (suite / "conftest.py").read_text()
    head = "PATH_TIERS: dict[str, tuple[str, ...]] = {"
    src = src.replace(head, head + '\n    "tests/test_x.py": ("unit",),', 1)
    (suite / "conftest.py").write_text(src)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            "-o",
            "pythonpath=tests",
            str(suite),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert "1 failed, 1 passed" in r.stdout, r.stdout[-3000:]
    want = "test_spawns is in the unit tier (in-process) but started the subprocess ['true']"
    assert want in r.stdout, r.stdout[-3000:]
