"""Issue 21 item 5: an engine whose child calls ``setsid`` and double-forks (as Ray-style daemons do)
left one grandchild with parent 1 per launch after the trial ended, with and without ``guard: true``:
the grandchild is in neither the engine's process group nor (once its parent exits) its process tree.
The engine process (and the guard in front of it) is now a child subreaper (``PR_SET_CHILD_SUBREAPER``,
kept across exec): the orphan is re-parented to it, so it stays in the tree that ``stop()`` kills.

The engine here is real: a Python script that daemonizes a ``sleep`` grandchild, then execs the mock
engine; once through the launcher directly (the grandchild's parent is checked) and once through
``servelab trial`` with two candidates, one behind the guard."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import yaml

from servelab.engines import registry

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER is Linux's")

#: argv[1] pid file, argv[2:] the engine to exec: a child calls setsid and forks a grandchild that sleeps
#: (its pid written to the file), the child exits at once, then this process becomes the engine
DAEMONIZE = textwrap.dedent("""
    import os, sys, time
    pidfile, engine = sys.argv[1], sys.argv[2:]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            for fd in (0, 1, 2):
                os.close(fd)
            open(pidfile, "w").write(str(os.getpid()))
            os.execvp("sleep", ["sleep", "600"])
        os._exit(0)
    os.wait()
    while not os.path.exists(pidfile) or not open(pidfile).read():
        time.sleep(0.01)
    os.execv(engine[0], engine)
""")


def _argv(pidfile: Path) -> list[str]:
    return [
        sys.executable,
        "-c",
        DAEMONIZE,
        str(pidfile),
        sys.executable,
        "-m",
        "servelab.engines.mock",
        "--host",
        "{host}",
        "--port",
        "{port}",
        "--output-tokens",
        "4",
    ]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone_within(pid: int, s: float = 5.0) -> bool:
    deadline = time.monotonic() + s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


@pytest.mark.parametrize("guard", [False, True])
def test_a_double_forked_grandchild_stays_in_the_tree_and_is_stopped(guard: bool, tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon.pid"
    kind = registry.get("command")
    eng = kind.launcher({"argv": _argv(pidfile), "guard": guard, "ready_timeout_s": 60}, log_dir=str(tmp_path)).start()
    daemon = int(pidfile.read_text())
    try:
        p = psutil.Process(daemon)
        assert os.getsid(daemon) != os.getsid(eng.pid)  # another session: killpg cannot reach it
        assert p.ppid() == eng.pid, f"the orphan went to pid {p.ppid()}, not to the engine's leader {eng.pid}"
        assert daemon in {c.pid for c in psutil.Process(eng.pid).children(recursive=True)}
    finally:
        eng.stop(timeout_s=5)
    assert _gone_within(daemon), f"daemonized grandchild {daemon} survived stop() (guard={guard})"


def test_no_daemon_left_after_a_trial(tmp_path: Path) -> None:
    cands = [
        {
            "name": f"daemon-{g}",
            "engine": "command",
            "settings": {"argv": _argv(tmp_path / f"daemon-{g}.pid"), "guard": g, "ready_timeout_s": 60},
        }
        for g in (False, True)
    ]
    exp = {
        "name": "daemons",
        "goal": {
            "task": "chat",
            "slo": "ttft_p95<=60s,error_rate<=5%",
            "quality": {"structured_valid_min": 0.0, "smoke": ["streaming"]},
        },
        "candidates": cands,
        "workloads": [{"name": "short-qa", "set": {"input_tokens": 8, "output_tokens": 4}}],
        "steps": {"concurrency": [1]},
        "requests_per_step": 2,
        "warmup": 0,
        "repeats": 1,
        "mix_sweep": False,
        "arrival_test": {"enabled": False},
        "capacity": {"enabled": False},
        "lifecycle": {"warm_start": False},
        "checks": [],
    }
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(exp))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "servelab.cli",
            "trial",
            str(f),
            "--out",
            str(tmp_path / "run"),
            "--no-report",
            "--no-index",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for g in (False, True):
        pid = int((tmp_path / f"daemon-{g}.pid").read_text())
        assert _gone_within(pid), (
            f"guard={g}: daemonized grandchild {pid} outlived the trial (parent {psutil.Process(pid).ppid()})"
        )
