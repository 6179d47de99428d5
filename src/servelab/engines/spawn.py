"""Starting an engine process: :func:`spawn_engine` (own session, child subreaper, dies with its parent,
ready when ``/health`` answers 200), :func:`spawn_on_port` (retries a port taken meanwhile), the guard
script in front of servers with workers, and :func:`run_logged` for build and install commands."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from servelab.engines.exits import EngineStartError, start_failure_message, tail_lines
from servelab.engines.running import RunningEngine, http_get

_BIND_FAILURE = re.compile(
    r"address already in use|couldn't bind|could not bind|failed to bind|bind failed", re.IGNORECASE
)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (bind to port 0, read it, close).

    There is an unavoidable race between this and the server binding it; :func:`spawn_engine`
    retries with a new port when the server then fails to bind.
    """
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36  # <linux/prctl.h>


def _preexec_subreaper() -> None:  # runs in the child between fork and exec
    """Make the engine process a child subreaper (``PR_SET_CHILD_SUBREAPER``, Linux 3.4+; kept across
    exec): a descendant that calls ``setsid`` and double-forks (Ray-style daemons) is re-parented to the
    engine process instead of PID 1, so it stays in the tree :meth:`RunningEngine.stop` kills."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except Exception:  # noqa: BLE001
        pass


def _preexec_die_with_parent() -> None:  # runs in the child between fork and exec
    _preexec_subreaper()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # noqa: BLE001
        pass


def _port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def spawn_engine(
    name: str,
    argv: Sequence[str],
    *,
    host: str,
    port: int,
    log_path: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 300.0,
    health_path: str = "/health",
    poll_interval_s: float = 0.05,
    model_name: str = "default",
    cwd: str | os.PathLike[str] | None = None,
    ready_status: int = 200,
) -> RunningEngine:
    """Start ``argv`` in its own session, stdout+stderr appended to ``log_path``, and wait until
    ``GET http://host:port{health_path}`` answers ``ready_status`` (200).

    Times in the returned engine's ``cold_start`` are seconds since just before ``Popen``.
    Connection refused, timeouts and non-200 answers (llama-server: 503 ``Loading model``) while
    starting are waited out. Raises :class:`EngineStartError` (with the last 20 log lines) when the
    process exits before it is ready or ``ready_timeout_s`` seconds pass (the process is then stopped).
    ``EngineStartError.bind_failed`` is True when the log says the port could not be bound
    (:func:`spawn_on_port` retries on a new port then).
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ if env is None else env)
    linux = sys.platform.startswith("linux")
    preexec = (
        None
        if not linux
        else _preexec_die_with_parent
        if threading.current_thread() is threading.main_thread()
        else _preexec_subreaper
    )
    with open(log_path, "ab", buffering=0) as log:
        log.write(f"# servelab: starting {name}: {' '.join(map(str, argv))}\n".encode())
        t0 = time.monotonic()
        proc = subprocess.Popen(
            list(map(str, argv)),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=preexec,
            close_fds=True,
        )
    eng = RunningEngine(
        name=name,
        process=proc,
        host=host,
        port=port,
        log_path=log_path,
        argv=argv,
        started_monotonic=t0,
        health_path=health_path,
        model_name=model_name,
    )
    connect_host = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
    deadline = t0 + ready_timeout_s
    last_status: str = "no answer yet"
    try:
        while True:
            rc = proc.poll()
            if rc is not None:
                tail = tail_lines(log_path)
                err = EngineStartError(start_failure_message(name, rc, time.monotonic() - t0, log_path, tail), tail, rc)
                err.bind_failed = any(_BIND_FAILURE.search(ln) for ln in tail)
                raise err
            now = time.monotonic()
            if now > deadline:
                tail = tail_lines(log_path)
                raise EngineStartError(
                    f"{name} not ready after {ready_timeout_s:g} s (last {health_path}: {last_status}); "
                    f"log {log_path}, last lines:\n" + "\n".join(tail),
                    tail,
                    None,
                )
            if "port_open_s" not in eng.cold_start:
                if _port_open(connect_host, port):
                    eng.cold_start["port_open_s"] = time.monotonic() - t0
                else:
                    time.sleep(poll_interval_s)
                    continue
            try:
                status, body = http_get(
                    f"http://{connect_host}:{port}{health_path}"
                    if ":" not in connect_host
                    else f"http://[{connect_host}]:{port}{health_path}",
                    timeout_s=max(0.5, min(5.0, deadline - now)),
                )
            except (OSError, urllib.error.URLError) as e:
                last_status = f"{type(e).__name__}: {e}"
            else:
                if status == ready_status:
                    eng.cold_start["health_s"] = time.monotonic() - t0
                    return eng
                last_status = f"HTTP {status} {body[:80].decode('utf-8', 'replace').strip()}"
            time.sleep(poll_interval_s)
    except BaseException:
        eng.stop(timeout_s=5)
        raise


def spawn_on_port(
    name: str,
    argv_for: Callable[[int], Sequence[str]],
    *,
    host: str,
    port: int | None,
    log_path_for: Callable[[int], Path],
    attempts: int = 3,
    **spawn_kwargs: Any,
) -> RunningEngine:
    """:func:`spawn_engine` on ``port``, or, when ``port`` is ``None``, on a free port, retried on a new
    free port (up to ``attempts`` starts) when the server's log says the port could not be bound
    (the race between :func:`free_port` and the server's own bind).

    ``argv_for(port)`` builds the command line and ``log_path_for(port)`` the log file for a port;
    ``spawn_kwargs`` go to :func:`spawn_engine` (``env``, ``ready_timeout_s``, ``health_path``,
    ``model_name``, ``cwd``, ``ready_status``). Raises :class:`EngineStartError` from the last attempt (a fixed port is
    tried once)."""
    tries = 1 if port is not None else max(1, attempts)
    for attempt in range(tries):
        p = port if port is not None else free_port(host)
        try:
            return spawn_engine(name, argv_for(p), host=host, port=p, log_path=log_path_for(p), **spawn_kwargs)
        except EngineStartError as e:
            if attempt + 1 < tries and getattr(e, "bind_failed", False):
                continue
            raise
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def log_dir_or_temp(log_dir: str | os.PathLike[str] | None, prefix: str) -> Path:
    """``log_dir`` (created) or a new temporary folder ``<tmp>/<prefix>XXXX`` for an engine's logs."""
    import tempfile

    d = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix=prefix))
    d.mkdir(parents=True, exist_ok=True)
    return d


def run_logged(
    cmd: Sequence[str],
    log: Path,
    progress: Callable[[str], None],
    label: str,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    show: str | None = None,
) -> None:
    """Run ``cmd`` (a build/install step) with its output appended to ``log``, reporting progress.

    Progress: cmake-style ``[ NN%]`` lines are reported every 10 points; other output as a one-line
    note every ~30 s. ``show`` replaces the command text in messages (e.g. to hide a long script).
    Raises ``subprocess.TimeoutExpired`` past ``timeout_s`` (the process is killed) and
    ``RuntimeError`` with the log's last 25 lines on a non-zero exit status.
    """
    progress(f"{label}: {show or ' '.join(cmd)} (log {log})")
    t0 = time.monotonic()
    last_pct, last_t = -100, t0
    with open(log, "ab") as lf:
        lf.write(f"\n# servelab: {label}: {show or ' '.join(cmd)}\n".encode())
        lf.flush()
        proc = subprocess.Popen(
            list(cmd),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
        )
        assert proc.stdout is not None
        try:
            for raw in proc.stdout:
                lf.write(raw)
                now = time.monotonic()
                m = re.match(rb"\[\s*(\d+)%\]", raw)
                if m:
                    pct = int(m.group(1))
                    if pct - last_pct >= 10 or now - last_t > 120:
                        last_pct, last_t = pct, now
                        progress(f"{label}: {pct}% ({now - t0:.0f} s)")
                elif now - last_t > 30:
                    last_t = now
                    progress(f"{label}: {now - t0:.0f} s ... {raw.decode('utf-8', 'replace').strip()[:100]}")
                if timeout_s is not None and now - t0 > timeout_s:
                    raise subprocess.TimeoutExpired(list(cmd), timeout_s)
            rc = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if rc != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
        raise RuntimeError(f"{label} failed with status {rc}; log {log}:\n" + "\n".join(tail))


#: Run as ``python -c GUARD_SCRIPT PARENT_PID WATCH [--] SERVER_ARGV...`` in front of a server whose workers
#: outlive it (vLLM's EngineCore and Worker processes survive a SIGKILL of servelab: the kernel's
#: parent-death signal only reaches the direct child). The guard leads the process group; when its parent
#: dies (PR_SET_PDEATHSIG=SIGUSR1, armed only when WATCH=1, i.e. started from the main thread, the same rule
#: as spawn_engine) it SIGKILLs the whole group. SIGTERM/SIGINT/SIGQUIT/SIGHUP (stop() signals the whole
#: group) are left to the server: the guard waits for it and exits with its status. The guard is a child
#: subreaper (set by spawn_engine before exec): a server descendant that left the group by ``setsid`` and
#: a double fork is re-parented to the guard, which SIGKILLs every descendant (its /proc children,
#: recursively) with the group, and when the server has exited. An optional ``--`` separates the guard's
#: arguments from the server's argv.
GUARD_SCRIPT = r"""
import ctypes, os, signal, subprocess, sys

__all__ = ["GUARD_SCRIPT", "free_port", "log_dir_or_temp", "run_logged", "spawn_engine", "spawn_on_port"]
parent, watch, argv = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3:]
if argv[:1] == ["--"]:
    argv = argv[1:]
def descendants(pid):
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except (OSError, ValueError):
            continue
        for k in kids:
            out += [k, *descendants(k)]
    return out
def kill_descendants():
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
def kill_group(*_):
    kill_descendants()
    os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGUSR1, kill_group)
if watch:
    ctypes.CDLL(None).prctl(1, int(signal.SIGUSR1), 0, 0, 0)
    if os.getppid() != parent:
        kill_group()
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
    signal.signal(s, lambda *_: None)
p = subprocess.Popen(argv)
rc = p.wait()
kill_descendants()  # daemons the server left behind, re-parented to this subreaper
sys.exit(rc if rc >= 0 else 128 - rc)
"""
