"""Active health checks: one asyncio loop per backend GETs the engine's own readiness endpoint every
``interval_s`` and feeds the breakers (a failed check opens the backend's breaker at once; a passed check
after a failure lets traffic probe it again).

The readiness endpoint is the backend's ``health_path``, else its kind's (:mod:`servelab.wire.dialects`:
``GET /health`` on the engines and servelab's servers, ``GET /`` on Ollama, ``GET /v1/models`` on any other
OpenAI-compatible server; sources in docs/engine-wire.md case 21). SGLang's stricter
``/health_generate`` (runs one generation) is used when ``health_path`` names it.

A check passes on any 2xx within ``timeout_s``; anything else (connection refused, timeout, 5xx, 503
while loading) fails it, except a local resource error (the gateway itself out of file descriptors or
buffers, :func:`servelab.gateway.fdbudget.is_local_resource_error`): that check is skipped and counted in
``HealthStatus.local_errors``, never against the backend. The API port's connection cap
(:mod:`servelab.gateway.listener`) keeps descriptors in reserve for these checks. ``fall`` failed
checks in a row mark a backend down, ``rise`` passed checks mark it up again (HAProxy's ``fall``/``rise``;
https://docs.haproxy.org/2.8/configuration.html#5.2-fall, checked 2026-11-30). Backends are "unknown"
(treated as up) until their first check.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from servelab.gateway.breaker import BreakerBoard
from servelab.gateway.fdbudget import is_local_resource_error
from servelab.gateway.listener import RateLimitedLog
from servelab.gateway.routespec import Backend
from servelab.wire.dialects import DIALECTS

__all__ = ["HEALTH_PATHS", "HealthChecker", "HealthStatus", "health_url"]

log = logging.getLogger("servelab.gateway.health")

#: Readiness path by engine kind (the dialect table's).
HEALTH_PATHS = {kind: d.health_path for kind, d in DIALECTS.items()}


def health_url(backend: Backend) -> str:
    """Readiness URL of ``backend``: its ``health_path`` or its kind's path, on the server root (a
    ``/v1`` suffix of ``base_url`` is dropped). Raises :class:`ValueError` for an unknown kind without
    ``health_path``."""
    root = backend.base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[:-3]
    path = backend.health_path or HEALTH_PATHS.get(backend.kind)
    if path is None:
        raise ValueError(
            f"backends.{backend.name}: no readiness path known for kind {backend.kind!r}; "
            f"set health_path (kinds with a default: {', '.join(sorted(HEALTH_PATHS))})"
        )
    return root + (path if path.startswith("/") else "/" + path)


@dataclass
class HealthStatus:
    """Last known health of one backend. ``up``: None until the first check. ``detail``: short reason of
    the last failed check (``connect``, ``timeout``, ``http 503``). ``checked_at``: ``time.monotonic()``
    of the last check; ``latency_s``: its duration; ``changed_at``: monotonic time of the last up/down flip."""

    up: bool | None = None
    detail: str = ""
    status_code: int | None = None
    checked_at: float | None = None
    latency_s: float | None = None
    changed_at: float | None = None
    fails: int = 0
    passes: int = 0
    checks: int = 0
    #: checks skipped because the gateway itself had no descriptor/buffer left (never counted as failures)
    local_errors: int = 0


class HealthChecker:
    """Checks every backend in ``backends`` every ``interval_s`` seconds (each check at most
    ``timeout_s``) and drives ``breakers``: down -> ``force_open("health")`` (renewed while it stays
    down), up again -> ``health_up()`` (half-open: real traffic probes it).

    ``session``: an aiohttp session to use (default: its own, closed by :meth:`close`).
    ``on_change(name, status)``: called on every up/down flip. Raises :class:`ValueError` for a bad
    interval/timeout/fall/rise or a backend whose health URL cannot be built.
    """

    def __init__(
        self,
        backends: Sequence[Backend],
        breakers: BreakerBoard,
        interval_s: float = 1.0,
        timeout_s: float = 2.0,
        fall: int = 1,
        rise: int = 1,
        session: aiohttp.ClientSession | None = None,
        on_change: Callable[[str, HealthStatus], None] | None = None,
    ) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError(f"health: interval_s {interval_s} and timeout_s {timeout_s} must be > 0 seconds")
        if fall < 1 or rise < 1:
            raise ValueError(f"health: fall {fall} and rise {rise} must be >= 1")
        self.backends = {b.name: b for b in backends}
        self.urls = {b.name: health_url(b) for b in backends}
        self.breakers = breakers
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.fall = fall
        self.rise = rise
        self.status: dict[str, HealthStatus] = {n: HealthStatus() for n in self.backends}
        self._session = session
        self._own_session = session is None
        self._on_change = on_change
        self._tasks: list[asyncio.Task[None]] = []
        self._local_log = RateLimitedLog(log, burst=2, window_s=10.0)

    def is_up(self, name: str) -> bool:
        """True unless the last checks marked ``name`` down (unknown counts as up)."""
        st = self.status.get(name)
        return st is None or st.up is not False

    def snapshot(self) -> dict[str, dict[str, object]]:
        """``{backend: {"up", "detail", "latency_s"}}`` for the admin API."""
        return {n: {"up": s.up, "detail": s.detail, "latency_s": s.latency_s} for n, s in self.status.items()}

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True))
        return self._session

    async def check_once(self, name: str) -> bool:
        """Run one check of backend ``name`` now, update its status and breaker; returns whether it passed
        (a check skipped for a local resource error changes nothing and returns whether the backend is
        not known to be down). Raises KeyError for an unknown backend."""
        url = self.urls[name]
        st = self.status[name]
        t0 = time.monotonic()
        code: int | None = None
        try:
            async with self._sess().get(
                url, timeout=aiohttp.ClientTimeout(total=self.timeout_s), allow_redirects=False
            ) as r:
                code = r.status
                await r.read()
            ok = 200 <= code < 300
            detail = "" if ok else f"http {code}"
        except TimeoutError:
            ok, detail = False, f"timeout after {self.timeout_s:g} s"
        except (aiohttp.ClientError, OSError) as e:
            if is_local_resource_error(e):
                # EMFILE/ENFILE/ENOBUFS: this process ran out, the engine did not fail; counting it would
                # open the breakers of healthy backends under a connection flood
                st.local_errors += 1
                self._local_log(
                    "health check of %s skipped: no file descriptor or buffer left in the gateway "
                    "(%s); not counted against the backend",
                    name,
                    e,
                )
                return st.up is not False
            ok, detail = False, "connect" if isinstance(e, aiohttp.ClientConnectorError) else type(e).__name__
        now = time.monotonic()
        st.checks += 1
        st.checked_at = now
        st.latency_s = now - t0
        st.status_code = code
        if ok:
            st.passes += 1
            st.fails = 0
            if st.up is None or (st.up is False and st.passes >= self.rise):
                self._flip(name, st, True, now)
        else:
            st.fails += 1
            st.passes = 0
            st.detail = detail
            if st.up is not False and st.fails >= self.fall:
                self._flip(name, st, False, now)
            if st.up is False:
                self.breakers.get(name).force_open("health")
        if ok:
            st.detail = ""
        return ok

    def _flip(self, name: str, st: HealthStatus, up: bool, now: float) -> None:
        was = st.up
        st.up = up
        st.changed_at = now
        if up:
            self.breakers.get(name).health_up()
            if was is False:
                log.warning("backend %s is ready again", name)
        else:
            log.warning("backend %s failed its readiness check (%s)", name, st.detail)
        if self._on_change is not None:
            self._on_change(name, st)

    async def check_all(self) -> dict[str, bool]:
        """Check every backend once, concurrently: ``{name: passed}``."""
        names = list(self.backends)
        res = await asyncio.gather(*(self.check_once(n) for n in names))
        return dict(zip(names, res, strict=True))

    async def _loop(self, name: str, offset_s: float) -> None:
        await asyncio.sleep(offset_s)
        while True:
            t0 = time.monotonic()
            try:
                await self.check_once(name)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 — a bug in one check must not end the loop silently
                log.error("health check of %s failed unexpectedly: %r", name, e)
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - t0)))

    async def start(self) -> None:
        """Start one loop per backend (staggered over one interval so checks do not arrive together)."""
        if self._tasks:
            return
        n = max(1, len(self.backends))
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._loop(name, i * self.interval_s / n), name=f"health:{name}")
            for i, name in enumerate(self.backends)
        ]

    async def close(self) -> None:
        """Stop the loops and close the session if it is this checker's own."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None
