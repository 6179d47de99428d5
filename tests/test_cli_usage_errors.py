"""Issue 21 item 6: a command-line usage error (a word where an integer is expected, an unknown
option, a missing argument, an unknown subcommand) is one line ``servelab: error: servelab SUB:
PROBLEM; see 'servelab SUB --help'`` with exit status 2, for every servelab subcommand — not click's
three-line usage block (``Usage: ...`` / ``Try ...`` / ``Error: ...``)."""

from __future__ import annotations

import subprocess
import sys

from servelab.cli import COMMANDS

_EVERY = """
import sys
from servelab.cli import main
for args in [a.split() for a in sys.argv[1:]]:
    try:
        main(args)
    except SystemExit as e:
        print(f"EXIT {e.code}", file=sys.stderr, flush=True)
"""


def run(*arg_lines: str) -> list[tuple[int, list[str]]]:
    """Each ``arg_lines`` entry as a servelab command line (split on spaces), run through
    :func:`servelab.cli.main` in one child process (a start per command would take ~1 s each);
    returns (exit status, stderr lines) per entry."""
    r = subprocess.run([sys.executable, "-c", _EVERY, *arg_lines], capture_output=True, text=True, timeout=120)
    out: list[tuple[int, list[str]]] = []
    lines: list[str] = []
    for ln in r.stderr.splitlines():
        if ln.startswith("EXIT "):
            out.append((int(ln.split()[1]), lines))
            lines = []
        else:
            lines.append(ln)
    assert len(out) == len(arg_lines), r.stderr[-3000:]
    return out


def test_an_unknown_option_is_one_line_for_every_subcommand() -> None:
    names = [*COMMANDS, "schema"]
    results = run(*(f"{n} --no-such-option" for n in names))
    for name, (rc, lines) in zip(names, results, strict=True):
        assert rc == 2 and len(lines) == 1, (name, lines)
        assert lines[0].startswith(f"servelab: error: servelab {name}: no such option: --no-such-option"), lines
        assert lines[0].endswith(f"see 'servelab {name} --help'"), lines
        assert "Usage:" not in lines[0] and "Traceback" not in lines[0]


def test_bench_refusals_of_a_word_for_a_number_are_one_line() -> None:
    flags = [
        "--requests",
        "--warmup",
        "--seed",
        "--workers",
        "--engine-parallel",
        "--engine-ctx",
        "--turns",
        "--sessions",
        "--batch-size",
        "--rag-top-k",
        "--max-concurrency",
        "--workers-per-node",
        "--timeout",
        "--duration",
        "--burstiness",
        "--think-time-s",
        "--lag-bound-ms",
        "--trace-speed",
    ]
    results = run(*(f"bench --url http://127.0.0.1:9/v1 {f} many" for f in flags))
    for flag, (rc, lines) in zip(flags, results, strict=True):
        assert rc == 2 and len(lines) == 1, (flag, lines)
        assert lines[0].startswith(f"servelab: error: servelab bench: invalid value for '{flag}'"), lines
        assert lines[0].endswith("see 'servelab bench --help'"), lines


def test_missing_values_arguments_and_commands_are_one_line() -> None:
    cases = {
        "bench --url http://127.0.0.1:9/v1 --requests": "servelab bench: option '--requests' requires an argument",
        "records show": "servelab records show: missing argument 'trial'",
        "trial a.yaml b.yaml": "servelab trial: got unexpected extra argument(s) (b.yaml)",
        "engine no-such-engine-command": "servelab engine: no such command 'no-such-engine-command'",
        "no-such-command": "servelab: no such command 'no-such-command'",
    }
    for (args, want), (rc, lines) in zip(cases.items(), run(*cases), strict=True):
        assert rc == 2 and lines == [f"servelab: error: {want}; see '{want.split(':')[0]} --help'"], (args, lines)


def test_help_and_config_errors_keep_their_form() -> None:
    (rc_help, _), (rc_bad, bad) = run("bench --help", "trial /no/such/experiment.yaml")
    assert rc_help == 0
    assert rc_bad == 2 and len(bad) == 1 and bad[0].startswith("servelab: error: /no/such/experiment.yaml: "), bad


def test_version_prints_and_exits_0() -> None:
    from servelab import __version__

    r = subprocess.run([sys.executable, "-m", "servelab.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == __version__ and r.stderr == ""
