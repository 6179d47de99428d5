"""Issue 9, item 7 follow-up: every ``servelab`` start imported every command module (gateway, trial,
advise, plan...), ~1.4 s per start, ``servelab bench --help`` and each bad-value check of
test_bench_cli_robustness.py included. Subcommands are now imported only when they run
(:mod:`servelab.lazy_commands`)."""

from __future__ import annotations

import json
import subprocess
import sys

import typer

from servelab.cli import COMMANDS, _register, app

_MODULES = """
import json, sys
from servelab.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith("servelab."))), file=sys.stderr)
"""


def imported_by(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    r = subprocess.run([sys.executable, "-c", _MODULES, *args], capture_output=True, text=True, timeout=60)
    return r, set(json.loads(r.stderr.strip().splitlines()[-1]))


def test_root_help_imports_no_command():
    r, mods = imported_by("--help")
    for name, lazy in COMMANDS.items():
        assert f"  {name} " in r.stdout and lazy.summary in r.stdout, r.stdout
        assert lazy.module not in mods, (name, lazy.module)
    assert "  schema " in r.stdout


def test_bench_help_imports_bench_only():
    r, mods = imported_by("bench", "--help")
    assert "--concurrency" in r.stdout and "143" in r.stdout
    assert not {
        m
        for m in mods
        if m.startswith(("servelab.gateway", "servelab.trial", "servelab.advise", "servelab.plan", "servelab.catalog"))
    }, sorted(mods)


def test_every_lazy_command_loads_with_its_summary():
    """The table points at real commands; each one's --help line is its summary, loaded or not."""
    _register()
    group = typer.main.get_command(app)
    ctx = typer.Context(group)
    assert group.list_commands(ctx)[: len(COMMANDS)] == list(COMMANDS)
    for name, lazy in COMMANDS.items():
        assert len(lazy.summary) <= 60, name  # one line in an 80-column --help
        cmd = group.get_command(ctx, name)
        assert cmd is not None and cmd.name == name and cmd.get_short_help_str(60) == lazy.summary, name
    assert group.get_command(ctx, "no-such-command") is None
