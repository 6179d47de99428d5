"""The gateway's shutdown sequence (:meth:`Closing.close`): stop the background tasks, drain the ports within
``shutdown_grace_s``, settle what was in flight, close the engines' connections, Redis, the keys, the ledger
(which writes the usage rows still buffered) and the limiter, export the traces still held. Every step is
bounded by :class:`~servelab.gateway.shutdown.Shutdown` (one that overruns is logged by name and left behind),
so a gateway always exits within the grace plus its watchdog."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiohttp import web

from servelab.gateway.accesslog import AccessLog
from servelab.gateway.breaker import BreakerBoard
from servelab.gateway.enginegauges import EngineGauges
from servelab.gateway.metrics import GatewayMetrics
from servelab.gateway.shutdown import OVERRUN_S, STEP_S, Shutdown
from servelab.gateway.snapshot import Snapshot
from servelab.gateway.tracing import Tracing
from servelab.gateway.upstream import Upstream, reason

log = logging.getLogger("servelab.gateway")


async def _reap(task: asyncio.Task[Any], what: str) -> None:
    """Wait for the cancelled background ``task``; one that had died of an error is logged (``what`` it was)."""
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception as e:  # noqa: BLE001 - a dead background task must not skip the shutdown steps after it
        log.error("%s had stopped: %s", what, reason(e))


class Closing:
    """The shutdown part of the gateway (module doc); the attributes it uses are the gateway's."""

    snap: Snapshot
    metrics: GatewayMetrics
    breakers: BreakerBoard
    upstream: Upstream
    engine_gauges: EngineGauges
    tracing: Tracing | None
    shutdown: Shutdown
    _access: AccessLog
    _health: Any
    _redis: Any
    _ledger: Any
    _limiter: Any
    _keystore: Any
    _runner: web.AppRunner | None
    _admin_runner: web.AppRunner | None
    _tasks: set[asyncio.Task[Any]]
    _cutting: bool
    _flush_task: asyncio.Task[None] | None
    _watch_task: asyncio.Task[None] | None
    _ledger_task: asyncio.Task[None] | None

    async def close(self) -> None:
        """Stop accepting, let in-flight requests finish (``shutdown_grace_s``), flush the ledger. Every step
        is bounded (:mod:`servelab.gateway.shutdown`): one that overruns is logged by name and left behind."""
        step = self.shutdown.step
        for name, what in (
            ("_flush_task", "metrics flush"),
            ("_watch_task", "config watcher"),
            ("_ledger_task", "ledger wait"),
        ):
            task = getattr(self, name)
            if task is not None:
                task.cancel()
                await step(f"stopping the {what}", _reap(task, what))
                setattr(self, name, None)
        if self._admin_runner is not None:
            await step("closing the admin port", self._admin_runner.cleanup())
            self._admin_runner = None
        if self._runner is not None:
            # aiohttp waits up to the grace for the handlers, then only fails their body reads and waits up to
            # the grace again: the connections still open at the grace are closed, which cancels their handlers
            grace = self.snap.cfg.server.shutdown_grace_s
            cut = asyncio.get_running_loop().call_later(grace, self._cut_connections)
            await step("draining the API port", self._runner.cleanup(), grace + STEP_S)
            cut.cancel()
            self._cut_connections()  # those a drain that overran left open
            self._runner = None
        await step("settling requests", self._settle_all())
        if self._health is not None:
            await step("stopping health checks", self._health.close())
            self._health = None
        await step("stopping engine scrapes", self.engine_gauges.close())
        if self.upstream.session is not None:
            await step("closing upstream connections", self.upstream.session.close())
            self.upstream.session = None
        await step("stopping breaker sync", self.breakers.close())
        if self._redis is not None:
            await step("closing Redis", self._redis.aclose())
        # keys first (their refresh reads the ledger), then the ledger, which writes the usage rows still buffered
        # (it may use what is left before the watchdog fires), then the limiter's settles
        parts = (
            ("key refresh", self._keystore, STEP_S),
            ("ledger", self._ledger, OVERRUN_S),
            ("limiter", self._limiter, STEP_S),
        )
        for what, part, timeout_s in parts:
            closer = getattr(part, "close", None)
            if closer is not None:
                await step(f"closing the {what}", closer(), timeout_s)
        self._access.close()
        if self.tracing is not None:  # exports the spans still held
            await step("exporting traces", asyncio.to_thread(self.tracing.shutdown))
        with contextlib.suppress(OSError):
            self.metrics.flush()  # a worker's last inter-token counts stay in the merged view
        self.shutdown.step_name = "closed"

    async def _settle_all(self) -> None:
        """Wait for the settle tasks, those the cancelled handlers start on their way out included."""
        await asyncio.sleep(0.05)  # handlers cancelled by a cut start their settle on their way out
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _cut_connections(self) -> None:
        """Close every client connection now (a hurried shutdown): their handlers are cancelled
        (``handler_cancellation``) and settle what they served, as cut by the gateway (:meth:`_finish`)."""
        self._cutting = True
        for runner in (self._runner, self._admin_runner):
            srv = runner.server if runner is not None else None
            for conn in srv.connections if srv is not None else ():
                if conn.transport is not None:
                    conn.transport.close()
