"""The engine launcher interface: start an inference server as a child process, wait until it is
ready, measure its cold start, read its memory and Prometheus metrics, and stop it without leaving
orphans.

An :class:`EngineLauncher` knows how to build one engine's command line; :meth:`EngineLauncher.start`
returns a :class:`RunningEngine`, which is also a context manager::

    with SomeLauncher(...).start() as eng:
        eng.base_url          # "http://127.0.0.1:41234/v1"
        eng.measure_first_token()
        eng.read_metrics()

No orphans: the server runs in its own session / process group (``start_new_session=True``);
:meth:`RunningEngine.stop` sends SIGTERM to the group, waits, then SIGKILLs the group and any
descendant that escaped it. On Linux the server process is a child subreaper
(``PR_SET_CHILD_SUBREAPER``): a descendant that calls ``setsid`` and double-forks is re-parented to
it, not to PID 1, so it is still a descendant when the server is stopped. Every live engine is also
stopped by an :mod:`atexit` hook, and on Linux a child started from the main thread gets
``PR_SET_PDEATHSIG=SIGKILL`` so it dies even when Python is killed with SIGKILL (the kernel fires that
signal when the *thread* that forked exits, so it is only set for starts from the main thread).

Readiness follows docs/engine-wire.md case 21: connection
refused during start is normal, llama-server answers 503 ``Loading model`` on ``/health`` while it
loads, ready means ``/health`` answers 200.
"""

from __future__ import annotations

import abc
import asyncio
import atexit
import contextlib
import math
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
from datetime import UTC
from pathlib import Path
from typing import Any

import psutil

from servelab.wire.prometheus import parse_prometheus_text

__all__ = [
    "GUARD_SCRIPT",
    "EngineLauncher",
    "EngineStartError",
    "RunningEngine",
    "describe_exit",
    "free_port",
    "log_dir_or_temp",
    "spawn_engine",
    "spawn_on_port",
    "start_failure_message",
    "tail_lines",
]


class EngineStartError(RuntimeError):
    """The engine process exited, or did not become ready in time, during start.

    The message names the engine, the reason, the log path and quotes the last ~20 log lines.
    ``log_tail`` holds those lines; ``returncode`` the exit status (``None`` if it was still running
    when the wait gave up; it is then killed).
    """

    def __init__(self, message: str, log_tail: list[str] | None = None, returncode: int | None = None):
        super().__init__(message)
        self.log_tail = log_tail or []
        self.returncode = returncode
        #: the log says the port could not be bound (another process took it): worth a retry on a new port
        self.bind_failed = False
        #: what to do about a known failure (e.g. a crash with a known cause), set by :meth:`add_hint`
        self.hint: str | None = None

    def add_hint(self, hint: str) -> None:
        """Append ``hint`` (what to do) to the message's first line, which is the one a trial shows."""
        first, sep, rest = str(self).partition("\n")
        self.hint = hint
        self.args = (f"{first}; {hint}{sep}{rest}",)


def describe_exit(returncode: int | None) -> str:
    """How a process ended, in words: ``"exited with status 3"``, ``"crashed with SIGSEGV
    (segmentation fault)"`` (a negative ``returncode`` from :mod:`subprocess` is the signal), or, for
    128+N from a shell that ran it (``sh -c``, the guard script), ``"exited with status 139 (128+SIGSEGV:
    segmentation fault, as a shell reports a crash)"``."""
    if returncode is None:
        return "is still running"
    if returncode < 0:
        return (
            f"crashed with {_signal_words(-returncode)}"
            if -returncode != signal.SIGKILL
            else f"was killed with {_signal_words(-returncode)}"
        )
    if 128 < returncode < 128 + 65:
        try:
            name = signal.Signals(returncode - 128).name
        except ValueError:
            return f"exited with status {returncode}"
        why = (signal.strsignal(returncode - 128) or "").lower()
        return f"exited with status {returncode} (128+{name}: {why}, as a shell reports a crash)"
    return f"exited with status {returncode}"


def _signal_words(signum: int) -> str:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
    why = (signal.strsignal(signum) or "").lower()
    return f"{name} ({why})" if why else name


#: hints for crashes by signal during start, whatever the engine
_SIGNAL_HINTS = {
    signal.SIGILL: "an instruction this CPU lacks: a binary built for another CPU (rebuild it on this host)",
    signal.SIGKILL: "SIGKILL during start is often the kernel's OOM killer (see `dmesg`): less memory "
    "(smaller context, fewer slots) or a bigger host",
}


def start_failure_message(name: str, returncode: int, elapsed_s: float, log_path: Path, tail: list[str]) -> str:
    """The message of an engine that ended during start: one first line that stands alone (how it
    ended, when, the last line the engine wrote, the log path), then its last log lines.

    servelab's own ``# servelab:`` header lines are not the engine's: when nothing else is in the
    log, the message says the engine wrote nothing before it died (a crash can lose buffered output)."""
    own = [ln for ln in tail if ln.strip() and not ln.startswith("# servelab:")]
    how = describe_exit(returncode)
    sig = -returncode if returncode < 0 else None
    last = f"last log line: {own[-1].strip()[:200]!r}" if own else "it wrote nothing to its log before it ended"
    first = f"{name} {how} during start ({elapsed_s:.1f} s after launch); {last}; log {log_path}"
    if sig is not None and sig in _SIGNAL_HINTS:
        first += f"; {_SIGNAL_HINTS[signal.Signals(sig)]}"
    return first + ("\nlast lines:\n" + "\n".join(tail) if own else "")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (bind to port 0, read it, close).

    There is an unavoidable race between this and the server binding it; :func:`spawn_engine`
    retries with a new port when the server then fails to bind.
    """
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def tail_lines(path: str | os.PathLike[str], n: int = 20) -> list[str]:
    """The last ``n`` lines of a text file (decoded leniently); ``[]`` if it does not exist."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read()
    except OSError:
        return []
    return [ln.rstrip("\r") for ln in data.decode("utf-8", "replace").splitlines()][-n:]


# ---------------------------------------------------------------------------------------------------
# Running engine
# ---------------------------------------------------------------------------------------------------

_LIVE: set[RunningEngine] = set()
_LIVE_LOCK = threading.Lock()


def _stop_all_at_exit() -> None:
    with _LIVE_LOCK:
        engines = list(_LIVE)
    for eng in engines:
        with contextlib.suppress(Exception):  # best effort at interpreter exit
            eng.stop(timeout_s=5)


atexit.register(_stop_all_at_exit)


def _http_get(url: str, timeout_s: float) -> tuple[int, bytes]:
    """GET ``url``; return (status, body). Raises OSError/URLError when no HTTP response came."""
    req = urllib.request.Request(url, headers={"Accept": "*/*"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        try:
            body = e.read()
        except Exception:  # noqa: BLE001
            body = b""
        return e.code, body


class RunningEngine:
    """A started engine process.

    Attributes:
        name: engine name, e.g. ``"llama.cpp"``.
        base_url: OpenAI API root, ending in ``/v1`` (``http://127.0.0.1:PORT/v1``).
        root_url: server root without ``/v1`` (for ``/health``, ``/metrics``, ``/props``).
        host, port, pid: where it listens and its process id (leader of its own process group).
        log_path: file holding the server's stdout+stderr.
        argv: the full command line.
        identity: JSON-serialisable dict describing exactly what runs (filled by the launcher).
        cold_start: seconds since just before ``Popen``: ``port_open_s`` (TCP connect succeeded),
            ``health_s`` (``/health`` answered 200) and, after :meth:`measure_first_token`,
            ``first_token_s`` (first streamed token of the first successful request) plus
            ``first_request_ttft_s`` (that request's own time to first token).
        started_monotonic: ``time.monotonic()`` just before ``Popen``.
    """

    def __init__(
        self,
        *,
        name: str,
        process: subprocess.Popen[bytes],
        host: str,
        port: int,
        log_path: Path,
        argv: Sequence[str],
        started_monotonic: float,
        metrics_path: str = "/metrics",
        health_path: str = "/health",
        model_name: str = "default",
    ):
        self.name = name
        self.process = process
        self.pid = process.pid
        self.host = host
        self.port = port
        url_host = f"[{host}]" if ":" in host else host
        self.root_url = f"http://{url_host}:{port}"
        self.base_url = self.root_url + "/v1"
        self.log_path = Path(log_path)
        self.argv = list(argv)
        self.started_monotonic = started_monotonic
        self.metrics_path = metrics_path
        self.health_path = health_path
        self.model_name = model_name
        self.identity: dict[str, Any] = {}
        self.cold_start: dict[str, float] = {}
        self.returncode: int | None = None
        #: the signal :meth:`stop` sends first and the seconds it waits before SIGKILL (``None`` = its argument)
        self.stop_signal: int = signal.SIGTERM
        self.stop_grace_s: float | None = None
        self._peak_seen = 0
        self._peak_final: int | None = None
        self._stopped = False
        self._lock = threading.Lock()
        try:
            self._ps: psutil.Process | None = psutil.Process(self.pid)
        except psutil.Error:
            self._ps = None
        with _LIVE_LOCK:
            _LIVE.add(self)

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> RunningEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "running"
        return f"<RunningEngine {self.name} pid={self.pid} {self.base_url} {state}>"

    @property
    def alive(self) -> bool:
        """True while the server process has not exited."""
        return not self._stopped and self.process.poll() is None

    def _tree(self) -> list[psutil.Process]:
        procs: list[psutil.Process] = []
        if self._ps is None:
            return procs
        try:
            if self._ps.is_running():
                procs.append(self._ps)
                procs.extend(self._ps.children(recursive=True))
        except psutil.Error:
            pass
        return procs

    def stop(self, timeout_s: float = 10) -> int | None:
        """Stop the server: :attr:`stop_signal` (SIGTERM) to its process group, wait up to ``timeout_s``
        seconds (:attr:`stop_grace_s` when set), then SIGKILL the group and every descendant still alive.
        Idempotent; safe from atexit.

        Returns the exit status (negative = killed by that signal), ``None`` if it could not be reaped.
        """
        with self._lock:
            if self._stopped:
                return self.returncode
            try:
                self._peak_final = self.peak_rss_bytes()
            except Exception:  # noqa: BLE001
                self._peak_final = self._peak_seen
            tree = self._tree()  # remember descendants before the leader goes away
            pgid = self.pid  # start_new_session: the child leads its own group

            def group_is_ours() -> bool:
                # never signal a group id that a reaped leader left behind and the OS may reuse
                if self.process.returncode is None:
                    return True
                for p in tree:
                    try:
                        if p.is_running() and os.getpgid(p.pid) == pgid:
                            return True
                    except (psutil.Error, OSError):
                        pass
                return False

            if self.process.poll() is None or group_is_ours():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, self.stop_signal)
            grace_s = self.stop_grace_s if self.stop_grace_s is not None else timeout_s
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.returncode = self.process.wait(timeout=max(0.0, grace_s))
            # whatever is left of the group, and descendants that made their own session, get SIGKILL
            if group_is_ours():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
            for p in tree:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.returncode = self.process.wait(timeout=5)
            psutil.wait_procs([p for p in tree if p.pid != self.pid], timeout=2)
            self._stopped = True
            with _LIVE_LOCK:
                _LIVE.discard(self)
            return self.returncode

    # -- memory ---------------------------------------------------------------------------------

    def rss_bytes(self) -> int:
        """Resident set size now, in bytes, summed over the server and its descendants (psutil).

        0 once stopped. Each call also updates the sampled peak used by :meth:`peak_rss_bytes`.
        """
        total = 0
        for p in self._tree():
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        self._peak_seen = max(self._peak_seen, total)
        return total

    def peak_rss_bytes(self) -> int:
        """Peak resident set size in bytes since start.

        On Linux the kernel's high-water mark (``VmHWM`` in ``/proc/PID/status``) summed over the
        server and its descendants; elsewhere, and as a floor, the largest :meth:`rss_bytes` sample.
        After :meth:`stop` returns the value measured just before stopping.
        """
        if self._stopped and self._peak_final is not None:
            return self._peak_final
        hwm = 0
        for p in self._tree():
            try:
                with open(f"/proc/{p.pid}/status", encoding="ascii", errors="replace") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            hwm += int(line.split()[1]) * 1024
                            break
            except (OSError, ValueError):
                pass
        current = self.rss_bytes()
        return max(hwm, current, self._peak_seen)

    # -- HTTP -----------------------------------------------------------------------------------

    def get(self, path: str, timeout_s: float = 10.0) -> tuple[int, bytes]:
        """GET ``root_url + path``; returns (HTTP status, body bytes). Raises OSError when no response."""
        return _http_get(self.root_url + path, timeout_s)

    def read_metrics(self, timeout_s: float = 10.0) -> dict[str, float]:
        """Scrape the Prometheus endpoint (``/metrics``) and parse it with
        :func:`servelab.wire.prometheus.parse_prometheus_text` (prometheus-client's parser).

        Returns ``{series: value}``. Raises :class:`RuntimeError` on a non-200 answer (llama-server
        answers 501 when started without ``--metrics``), ValueError when the page is not Prometheus
        text, and OSError when the server does not answer.
        """
        status, body = self.get(self.metrics_path, timeout_s)
        if status != 200:
            raise RuntimeError(
                f"{self.name} {self.metrics_path} answered HTTP {status}: {body[:200].decode('utf-8', 'replace')}"
            )
        return parse_prometheus_text(body.decode("utf-8", "replace"))

    async def ameasure_first_token(
        self, timeout_s: float = 120.0, endpoint: str = "chat", max_tokens: int = 8, retry_interval_s: float = 0.2
    ) -> float:
        """Async form of :meth:`measure_first_token`."""
        from servelab.wire import RequestRecord, RequestSpec, make_session, send

        if endpoint == "chat":
            spec = RequestSpec(
                endpoint="chat", max_tokens=max_tokens, messages=[{"role": "user", "content": "Say hello."}]
            )
        else:
            spec = RequestSpec(endpoint="completions", max_tokens=max_tokens, prompt="Hello")
        deadline = time.monotonic() + timeout_s
        last: RequestRecord | None = None
        async with make_session() as session:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                rec = RequestRecord(request_id=0, workload="cold_start")
                await send(session, self.base_url, self.model_name, spec, rec, timeout_s=remaining)
                last = rec
                if rec.ok and rec.first_token_ns is not None and rec.sent_ns is not None:
                    t_first = rec.first_token_ns / 1e9
                    self.cold_start["first_token_s"] = t_first - self.started_monotonic
                    self.cold_start["first_request_ttft_s"] = (rec.first_token_ns - rec.sent_ns) / 1e9
                    return self.cold_start["first_token_s"]
                if not self.alive:
                    break
                await asyncio.sleep(retry_interval_s)
        why = "process exited" if not self.alive else f"no streamed token within {timeout_s:g} s"
        err = last.error.message if last is not None and last.error is not None else "no error text"
        raise EngineStartError(
            f"{self.name}: first-token probe failed ({why}; last error: {err}); "
            f"log {self.log_path}:\n" + "\n".join(tail_lines(self.log_path)),
            tail_lines(self.log_path),
            self.process.poll(),
        )

    def measure_first_token(self, timeout_s: float = 120.0, endpoint: str = "chat", max_tokens: int = 8) -> float:
        """Send small streamed requests until one yields a token; record and return seconds from
        process start to that first token (``cold_start["first_token_s"]``; also sets
        ``cold_start["first_request_ttft_s"]``). Uses :func:`servelab.wire.send`.

        Works from sync code and from inside a running event loop (then it runs in a helper thread;
        prefer :meth:`ameasure_first_token` there). Raises :class:`EngineStartError` when no token
        arrives within ``timeout_s`` seconds or the process exits.
        """

        def coro_fn() -> Any:
            return self.ameasure_first_token(timeout_s=timeout_s, endpoint=endpoint, max_tokens=max_tokens)

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coro_fn())
        box: dict[str, Any] = {}

        def runner() -> None:
            try:
                box["v"] = asyncio.run(coro_fn())
            except BaseException as e:  # noqa: BLE001
                box["e"] = e

        t = threading.Thread(target=runner, daemon=True)
        t.start()
        t.join()
        if "e" in box:
            raise box["e"]
        return float(box["v"])


# ---------------------------------------------------------------------------------------------------
# Spawning
# ---------------------------------------------------------------------------------------------------

_BIND_FAILURE = re.compile(
    r"address already in use|couldn't bind|could not bind|failed to bind|bind failed", re.IGNORECASE
)


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
                status, body = _http_get(
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


class EngineLauncher(abc.ABC):
    """Knows how to start one engine; :meth:`start` returns a ready :class:`RunningEngine`.

    Subclasses set :attr:`name` and implement :meth:`start` (typically: resolve binary and model,
    build argv, call :func:`spawn_on_port`, fill ``identity`` from a
    :class:`servelab.engines.kind.EngineIdentity`). A launcher is reusable: each :meth:`start`
    call starts a new process. The engine kind that uses it is declared in the same module
    (docs/adding-an-engine.md).
    """

    #: engine name used in identities and messages, e.g. ``"llama.cpp"``, ``"vllm"``
    name: str = "engine"

    @abc.abstractmethod
    def start(self) -> RunningEngine:
        """Start the engine and return it once ``/health`` answers 200.

        Raises :class:`EngineStartError` when it exits or does not get ready in time and
        :class:`servelab.wire.ConfigError` for bad user input (model file, options).
        """

    def up(self) -> RunningEngine:
        """Alias of :meth:`start` (``with launcher.up() as eng: ...``)."""
        return self.start()


def runtime_identity(eng: RunningEngine) -> dict[str, Any]:
    """The per-launch part of every launcher's identity: ``host``, ``port``, ``base_url``, ``pid``,
    ``log_path`` and ``started_at`` (UTC, ISO 8601 seconds). These vary between launches and are left
    out of candidate comparisons."""
    from datetime import datetime

    return {
        "host": eng.host,
        "port": eng.port,
        "base_url": eng.base_url,
        "pid": eng.pid,
        "log_path": str(eng.log_path),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def human_bytes(n: float) -> str:
    """``n`` bytes as a short human string (``"241.3 MiB"``)."""
    if n is None or not math.isfinite(n):
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


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
