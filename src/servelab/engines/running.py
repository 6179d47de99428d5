"""A started engine (:class:`RunningEngine`): readiness, cold start, first token, memory, Prometheus
metrics, and a stop that leaves no orphans; every live engine is stopped at exit."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from servelab.engines.exits import EngineStartError, tail_lines
from servelab.wire.prometheus import parse_prometheus_text

__all__ = ["RunningEngine", "http_get"]

_LIVE: set[RunningEngine] = set()
_LIVE_LOCK = threading.Lock()


def _stop_all_at_exit() -> None:
    with _LIVE_LOCK:
        engines = list(_LIVE)
    for eng in engines:
        with contextlib.suppress(Exception):  # best effort at interpreter exit
            eng.stop(timeout_s=5)


atexit.register(_stop_all_at_exit)


def http_get(url: str, timeout_s: float) -> tuple[int, bytes]:
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
        return http_get(self.root_url + path, timeout_s)

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
