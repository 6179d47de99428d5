"""A real local Ray cluster for tests: a head and a second node, each its own ``ray start --block`` process
on this machine (1 CPU each, small memory: fits a 2-core CI box), so one load-generator actor lands on
each node. :func:`ray_cluster` yields ``HOST:PORT`` and tears the cluster down at the end, every process
of it (each node runs in a session of its own); it fails if a process of the cluster is left."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from servelab.engines.spawn import free_port

RAY = Path(sys.executable).with_name("ray")
NODE_ARGS = [
    "--num-cpus",
    "1",
    "--memory",
    str(1 << 30),
    "--object-store-memory",
    str(80 << 20),
    "--disable-usage-stats",
    "--block",
]


def session_pids(sid: int) -> list[int]:
    """Pids (not zombies) of the processes in session ``sid``."""
    import psutil

    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (psutil.Error, ProcessLookupError, PermissionError):
            pass
    return out


def _stop_session(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the node's whole session (ray start and every daemon it started), SIGKILL what is left.

    The head node's ``ray start --block``, gcs_server and autoscaler were still running 12 s after SIGTERM
    (watched once a second; a worker node's session was gone within 1 s), so a longer SIGTERM wait only
    delays the SIGKILL that ends them: 2 s."""
    for sig, wait_s in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and session_pids(proc.pid):
            time.sleep(0.2)
        if not session_pids(proc.pid):
            break
    proc.wait(10)


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    raise RuntimeError(f"ray node did not start: {log.read_text(errors='replace')[-2000:]}")


@contextlib.contextmanager
def ray_cluster() -> Iterator[str]:
    """``HOST:PORT`` of a two-node Ray cluster on this machine, torn down (and checked gone) on exit."""
    tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths must fit AF_UNIX
    port = free_port()
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        head_log = tmp / "head.log"
        with open(head_log, "wb") as log:  # each child keeps its own copy of the descriptor
            procs.append(
                subprocess.Popen(
                    [
                        str(RAY),
                        "start",
                        "--head",
                        "--port",
                        str(port),
                        "--include-dashboard",
                        "false",
                        "--temp-dir",
                        str(tmp / "ray"),
                        *NODE_ARGS,
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            )
        _wait_for(head_log, "block forever", procs[0])
        node_log = tmp / "node.log"
        with open(node_log, "wb") as log:
            procs.append(
                subprocess.Popen(
                    [str(RAY), "start", "--address", f"127.0.0.1:{port}", *NODE_ARGS],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            )
        _wait_for(node_log, "block forever", procs[1])
        yield f"127.0.0.1:{port}"
    finally:
        for p in reversed(procs):
            _stop_session(p)
        left = [pid for p in procs for pid in session_pids(p.pid)]
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
        assert not left, f"ray processes left: {left}"
