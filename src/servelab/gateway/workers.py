"""``servelab gateway --workers N``: N gateway processes on one port, under one supervisor.

Each worker is a whole :class:`~servelab.gateway.server.Gateway` in its own process and event loop
(``python -m servelab.cli gateway --worker-index i``), binding the same API port with ``SO_REUSEPORT``:
the kernel spreads new connections over the workers' listening sockets (Linux >= 3.9, socket(7):
"incoming connections and datagrams are distributed to the server sockets using a hash based on the
4-tuple of the connection", https://man7.org/linux/man-pages/man7/socket.7.html, read 2026-12-01).
For ``--port 0`` the supervisor reserves a free port with a bound, non-listening ``SO_REUSEPORT``
socket and passes it to every worker. Worker 0 alone serves the admin port.

Shared state: N > 1 needs ``state.redis_url`` (:func:`check_workers`): RPM/TPM, concurrency and token
budgets (:class:`~servelab.gateway.limits.RedisLimiter`) and open breakers
(:class:`~servelab.gateway.breaker.BreakerBoard`) then live in Redis, so they hold across workers as
across replicas; the routing session key (``routing.session_header``) is the secret in
``routing.session_secret_env`` when set, else one key the supervisor draws at start and gives every worker
through :data:`WORKER_SESSION_KEY_ENV` (:func:`worker_session_key`), so a session stays in one canary group
whichever worker the kernel hands its connection to (each worker drawing its own flipped 2 of 20 sessions);
without Redis the command refuses, never runs N independent counters. The usage
ledger: PostgreSQL takes N writers; SQLite runs in WAL mode with a 5 s busy timeout
(:class:`~servelab.gateway.ledger.SqliteLedger`), each worker writing its own batches. Per worker
(as per replica): the retry budget, degrade windows, backends' ``max_in_flight`` counts, shadow samples
and ``/admin/backends`` (worker 0's view).

Signals to the supervisor: SIGHUP reloads every worker (each also watches the file itself); SIGTERM/SIGINT
stop every worker gracefully (``server.shutdown_grace_s``), then the supervisor exits 0; a worker still
alive :data:`KILL_AFTER_S` after the grace is killed. An admin reload (worker 0) sends SIGUSR1 to the
supervisor, which sends SIGHUP to the other workers. Workers get SIGTERM when the supervisor dies
(``PR_SET_PDEATHSIG``); a worker bounds its own shutdown and, when that SIGTERM comes during it, cuts what is
in flight and exits (:mod:`servelab.gateway.shutdown`). A worker that dies is restarted (after
:data:`RESTART_DELAY_S`); one that dies :data:`CRASH_LOOP` times in a row within :data:`CRASH_WINDOW_S` of
its start stops the gateway (exit 1, one line naming the worker and its exit status) rather than restarting
for ever.

Metrics: the supervisor gives the workers one fresh ``PROMETHEUS_MULTIPROC_DIR`` (removed at exit);
``/metrics`` of any worker shows all workers summed (:mod:`servelab.gateway.metrics`). The access log
is one file written by every worker with ``O_APPEND`` line writes, each line with its ``worker``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from servelab.wire.errors import ConfigError

__all__ = [
    "CRASH_LOOP",
    "CRASH_WINDOW_S",
    "KILL_AFTER_S",
    "RESTART_DELAY_S",
    "WORKER_SESSION_KEY_ENV",
    "Supervisor",
    "check_workers",
    "parse_workers",
    "shared_core_warning",
    "worker_session_key",
]

log = logging.getLogger("servelab.gateway.workers")

#: seconds between a worker's death and its restart
RESTART_DELAY_S = 0.5
#: a worker that exits this many times in a row, each within :data:`CRASH_WINDOW_S` of its start, stops the gateway
CRASH_LOOP = 5
CRASH_WINDOW_S = 10.0
#: seconds after ``shutdown_grace_s`` before a worker still running is killed
KILL_AFTER_S = 10.0
#: environment variable through which the supervisor gives every worker the same routing session key (hex)
WORKER_SESSION_KEY_ENV = "SERVELAB_WORKER_SESSION_KEY"
_LISTEN = re.compile(r"listening on (http://\S+/v1)(?: \(admin (http://\S+)\))?")


def worker_session_key() -> bytes | None:
    """The routing session key (32 bytes) the supervisor drew for all its workers, read from
    :data:`WORKER_SESSION_KEY_ENV` and removed from this process's environment (nothing it starts
    inherits it); None when not set (not under a supervisor) or not hex."""
    try:
        return bytes.fromhex(os.environ.pop(WORKER_SESSION_KEY_ENV, "")) or None
    except ValueError:
        return None


def parse_workers(value: str) -> int:
    """``--workers`` as a count: a positive integer, or ``auto`` = the CPUs this process may run on.
    Raises :class:`ConfigError` (one line) for anything else."""
    if value == "auto":
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise ConfigError(f"--workers {value!r} is not a positive integer or 'auto' (one worker per CPU)")


def check_workers(n: int, redis_url: str | None) -> None:
    """Refuse ``n > 1`` workers without shared state. Raises :class:`ConfigError` naming the fix."""
    if n > 1 and not redis_url:
        raise ConfigError(
            f"--workers {n} needs state.redis_url in the config: limits, budgets and breakers must "
            "be shared by the workers (in memory each worker would count on its own); set "
            "state.redis_url: redis://HOST:6379/0, or run with --workers 1"
        )


def shared_core_warning(n: int, cpus: int) -> str | None:
    """The warning for ``n`` workers on ``cpus`` CPUs this process may run on, or None when each worker can have
    a core. Workers that time-share a core are switched by the kernel every scheduler slice, and each switch
    leaves the next worker a cold cache: measured with ``benches/gateway_overhead.py`` (benches/README.md), two
    busy workers on one core served fewer requests per CPU-second than one worker alone on it."""
    if n <= cpus:
        return None
    return (
        f"--workers {n} on {cpus} CPU(s): workers will time-share cores and pay more CPU per request than "
        f"with a core each (benches/README.md, gateway_overhead.py); --workers auto runs one per CPU"
    )


def _pdeathsig(supervisor: int) -> None:  # pragma: no cover - runs in the child between fork and exec
    """The child gets SIGTERM when the supervisor dies (Linux prctl PR_SET_PDEATHSIG = 1). A supervisor that
    died between the fork and the prctl sends nothing: the child, reparented already, ends before its exec."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    if os.getppid() != supervisor:
        os._exit(1)


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[str]
    started: float
    announced: threading.Event = field(default_factory=threading.Event)
    line: str = ""


class Supervisor:
    """Starts, watches, reloads and stops ``n`` workers (module doc). ``args``: the CLI arguments every
    worker gets (config, log level); ``host``/``port``/``admin_port``/``admin_host``/``no_admin`` as for
    :func:`servelab.gateway.cli.serve`. :meth:`run` blocks until SIGTERM/SIGINT and returns the exit
    status (0; 1 after a crash loop; the status of a worker that fails to start, 2 for its config error)."""

    def __init__(
        self,
        config_path: str | Path,
        n: int,
        host: str,
        port: int,
        admin_port: int | None,
        admin_host: str | None,
        grace_s: float,
        log_level: str,
    ) -> None:
        self.config_path, self.n, self.host, self.port = str(config_path), n, host, port
        self.admin_port, self.admin_host, self.grace_s, self.log_level = admin_port, admin_host, grace_s, log_level
        self.workers: list[_Worker | None] = [None] * n
        self._stop = False
        self._hup = False
        self._usr1 = False
        self._crashes = [0] * n
        self._own_dir = not os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        self.metrics_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(prefix="servelab-gw-metrics-")
        self._session_key = secrets.token_hex(32)  # one for every worker, restarted ones included

    # ------------------------------------------------------------------ one worker
    def _argv(self, i: int) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "servelab.cli",
            "gateway",
            "--config",
            self.config_path,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--log-level",
            self.log_level,
            "--worker-index",
            str(i),
        ]
        if i == 0 and self.admin_port is not None:
            argv += ["--admin-port", str(self.admin_port)]
            if self.admin_host:
                argv += ["--admin-host", self.admin_host]
        else:
            argv.append("--no-admin")
        return argv

    def _spawn(self, i: int) -> _Worker:
        env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=self.metrics_dir, PYTHONUNBUFFERED="1")
        env[WORKER_SESSION_KEY_ENV] = self._session_key
        proc = subprocess.Popen(
            self._argv(i),
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=functools.partial(_pdeathsig, os.getpid()),
        )
        w = _Worker(i, proc, time.monotonic())
        threading.Thread(target=self._drain, args=(w, proc.stdout), daemon=True, name=f"gw-worker-{i}").start()
        self.workers[i] = w
        return w

    @staticmethod
    def _drain(w: _Worker, out: IO[str] | None) -> None:
        """Read the worker's stdout: its ``listening on`` line marks it up; other lines are passed on."""
        if out is None:
            return
        for line in out:
            if not w.announced.is_set() and _LISTEN.search(line):
                w.line = line.strip()
                w.announced.set()
            else:
                sys.stdout.write(line)
                sys.stdout.flush()

    def _wait_up(self, w: _Worker, timeout_s: float = 120.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._stop:
            if w.announced.wait(0.1):
                return True
            if w.proc.poll() is not None:
                return False
        return w.announced.is_set()

    # ------------------------------------------------------------------ signals
    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGHUP:
            self._hup = True
        elif signum == signal.SIGUSR1:
            self._usr1 = True
        else:
            self._stop = True

    def _send(self, sig: int, skip: int | None = None) -> None:
        for w in self.workers:
            if w is not None and w.index != skip and w.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(sig)

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> int:
        """Start the workers, print one ``listening on`` line, supervise until stopped (class doc)."""
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(s, self._on_signal)
        for f in Path(self.metrics_dir).glob("*"):  # a reused PROMETHEUS_MULTIPROC_DIR starts empty
            with contextlib.suppress(OSError):
                f.unlink()
        reserve = self._reserve_port()
        try:
            rc = self._start_all()
        finally:
            reserve.close()
        if rc is not None:
            self._shutdown()
            return rc
        first = self.workers[0]
        assert first is not None
        m = _LISTEN.search(first.line)
        assert m is not None
        if m.group(2):  # a restarted worker 0 binds the admin port worker 0 got first
            self.admin_port = int(m.group(2).rsplit(":", 1)[1])
        pids = ", ".join(str(w.proc.pid) for w in self.workers if w is not None)
        print(f"{first.line} [{self.n} workers: pids {pids}; supervisor {os.getpid()}]", flush=True)
        rc = self._supervise()
        self._shutdown()
        return rc

    def _reserve_port(self) -> socket.socket:
        """Bind (not listen) a SO_REUSEPORT socket on host:port so port 0 becomes one port for every worker."""
        fam, typ, proto, _, addr = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0]
        s = socket.socket(fam, typ, proto)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            s.bind(addr)
        except OSError as e:
            s.close()
            raise ConfigError(
                f"cannot listen on {self.host}:{self.port}: {e.strerror or e}; pick a free port "
                "with --port and an address of this host with --host"
            ) from None
        self.port = s.getsockname()[1]
        return s

    def _start_all(self) -> int | None:
        """Start worker 0 (it binds the admin port), then the others in parallel. None when all are up,
        else the exit status of the one that failed (its one-line error is on stderr already)."""
        w0 = self._spawn(0)
        if not self._wait_up(w0):
            return 0 if self._stop else (w0.proc.poll() or 1)
        rest = [self._spawn(i) for i in range(1, self.n)]
        for w in rest:
            if not self._wait_up(w):
                return 0 if self._stop else (w.proc.poll() or 1)
        return None

    def _supervise(self) -> int:
        while not self._stop:
            time.sleep(0.1)
            if self._hup:
                self._hup = False
                self._send(signal.SIGHUP)
            if self._usr1:
                self._usr1 = False
                self._send(signal.SIGHUP, skip=0)
            for i, w in enumerate(self.workers):
                if self._stop or w is None or w.proc.poll() is None:
                    continue
                rc = w.proc.returncode
                self._mark_dead(w.proc.pid)
                quick = time.monotonic() - w.started < CRASH_WINDOW_S
                self._crashes[i] = self._crashes[i] + 1 if quick else 1
                if self._crashes[i] >= CRASH_LOOP:
                    print(
                        f"servelab gateway: worker {i} exited {self._crashes[i]} times in a row within "
                        f"{CRASH_WINDOW_S:.0f} s of its start (last status {rc}); stopping the gateway "
                        "(see the worker's error above)",
                        file=sys.stderr,
                        flush=True,
                    )
                    return 1
                log.warning("worker %d (pid %d) exited with status %s; restarting it", i, w.proc.pid, rc)
                time.sleep(RESTART_DELAY_S)
                self._spawn(i)
        return 0

    def _mark_dead(self, pid: int) -> None:
        """Drop a dead worker's live gauges from the merged metrics (its counters stay)."""
        from prometheus_client import multiprocess

        with contextlib.suppress(OSError):
            multiprocess.mark_process_dead(pid, self.metrics_dir)

    def _shutdown(self) -> None:
        """SIGTERM every worker, wait ``grace_s`` + :data:`KILL_AFTER_S`, kill what is left, clean up."""
        self._send(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s + KILL_AFTER_S
        for w in self.workers:
            if w is None:
                continue
            try:
                w.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error(
                    "worker %d (pid %d) still running %.0f s after SIGTERM; killing it",
                    w.index,
                    w.proc.pid,
                    self.grace_s + KILL_AFTER_S,
                )
                w.proc.kill()
                w.proc.wait()
        if self._own_dir:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
