"""Hot reload of the gateway's config file (a mixin of :class:`servelab.gateway.server.Gateway`).

:meth:`HotReload.reload` (on SIGHUP, the admin API or a change of the file's mtime/size/content, polled every
:data:`RELOAD_POLL_S`): a new :class:`~servelab.gateway.snapshot.Snapshot` is built from the new file and
swapped in with one assignment; each request holds the snapshot it started with until it ends, so in-flight
streams keep their config. A bad file leaves the running config in force; the error line is logged and kept
in ``last_reload``. Fields that only take effect at start (ports, state, ledger, listener limits) are
reported as warnings.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import signal
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web

from servelab.gateway.accesslog import AccessLog
from servelab.gateway.breaker import BreakerBoard, RetryBudget
from servelab.gateway.config import GatewayConfig, load_config
from servelab.gateway.listener import GuardedRunner
from servelab.gateway.metrics import GatewayMetrics
from servelab.gateway.snapshot import Snapshot, breaker_settings
from servelab.gateway.tracing import Tracing
from servelab.gateway.upstream import Upstream, reason
from servelab.wire.client import ConfigError

__all__ = ["RELOAD_POLL_S", "HotReload"]

log = logging.getLogger("servelab.gateway")

#: How often the config file is checked for changes (seconds).
RELOAD_POLL_S = 1.0


def _listener_fields(s: Any) -> tuple[Any, ...]:
    """The ``server`` fields the listeners take at start (a change needs a restart)."""
    return (
        s.admin_host,
        s.header_timeout_s,
        s.body_timeout_s,
        s.body_total_timeout_s,
        s.keepalive_timeout_s,
        s.max_connections,
        s.admin_max_connections,
        s.send_timeout_s,
        s.max_connections_per_client,
    )


class HotReload:
    """The reload part of the gateway (module doc); the attributes and methods it uses are the gateway's."""

    worker: int | None
    config_path: Path | None
    snap: Snapshot
    metrics: GatewayMetrics
    breakers: BreakerBoard
    retry_budget: RetryBudget
    last_reload: dict[str, Any]
    tracing: Tracing | None
    upstream: Upstream
    _access: AccessLog
    _keystore: Any
    _own_keystore: bool
    _file_sig: tuple[int, int, str] | None
    _runner: web.AppRunner | None

    def _build(self, cfg: GatewayConfig) -> Snapshot:
        raise NotImplementedError

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        raise NotImplementedError

    async def _start_health(self) -> None:
        raise NotImplementedError

    def _signature(self) -> tuple[int, int, str] | None:
        if self.config_path is None:
            return None
        try:
            st = self.config_path.stat()
            return (st.st_mtime_ns, st.st_size, hashlib.sha256(self.config_path.read_bytes()).hexdigest())
        except OSError:
            return None

    async def reload(self, source: str = "api") -> dict[str, Any]:
        """Load the config file again and swap it in atomically. Returns :attr:`last_reload`
        (``{"ok", "version", "at", "error", "source"}``). On any error (bad YAML, bad field, unknown
        reference) the running config stays in force and ``error`` holds the one-line reason naming the
        field. Sections that need a restart (server ports/host, state, ledger) keep their running values
        and the reload says so in ``warnings``."""
        if self.config_path is None:
            self.last_reload = {
                "ok": False,
                "version": self.snap.version,
                "at": time.time(),
                "source": source,
                "error": "this gateway was started without a config file; nothing to reload",
            }
            return self.last_reload
        self._file_sig = self._signature()
        old = self.snap.cfg
        try:
            cfg = load_config(self.config_path)
            snap = self._build(cfg)
            new_breakers = breaker_settings(cfg)
            tracing = Tracing.from_section(cfg.tracing, self.worker) if cfg.tracing != old.tracing else self.tracing
        except Exception as e:  # noqa: BLE001 - any failure (RecursionError from deep YAML, MemoryError)
            # leaves the running config in force; ConfigError/ValueError already name the field
            msg = (
                str(e)
                if isinstance(e, (ConfigError, ValueError))
                else (
                    f"{self.config_path}: cannot be loaded ({reason(e)}); fix the file (too deeply nested or "
                    "too large?) and save it again"
                )
            )
            self.metrics.reloads.labels("error").inc()
            log.error("config reload (%s) failed, keeping version %d: %s", source, self.snap.version, msg)
            self.last_reload = {
                "ok": False,
                "version": self.snap.version,
                "at": time.time(),
                "error": msg,
                "source": source,
            }
            return self.last_reload
        warnings = [
            f"{name} changed: restart the gateway to apply it"
            for name, a, b in (
                (
                    "server.host/port/admin_port",
                    (old.server.host, old.server.port, old.server.admin_port),
                    (cfg.server.host, cfg.server.port, cfg.server.admin_port),
                ),
                ("state", old.state, cfg.state),
                ("ledger", old.ledger, cfg.ledger),
                ("server connection limits/admin_host", _listener_fields(old.server), _listener_fields(cfg.server)),
            )
            if a != b
        ]
        for w in warnings:
            log.warning("config reload: %s", w)
        if self._own_keystore and (old.keys != cfg.keys or old.tenants != cfg.tenants):
            try:
                self._keystore.update_config_keys(cfg.keys, cfg.tenants)  # swaps its table atomically
            except ValueError as e:
                self.metrics.reloads.labels("error").inc()
                self.last_reload = {
                    "ok": False,
                    "version": self.snap.version,
                    "at": time.time(),
                    "error": f"{self.config_path}: {e}",
                    "source": source,
                }
                return self.last_reload
        self.snap = snap  # the atomic swap: new requests see the new config, running ones keep theirs
        if old.breaker != cfg.breaker:
            self.breakers.reconfigure(new_breakers)  # thresholds change, breaker states stay
        self.retry_budget.ratio = cfg.retry.budget_ratio
        if old.server.trusted_proxies != cfg.server.trusted_proxies and isinstance(self._runner, GuardedRunner):
            self._runner.set_trusted_proxies(tuple(cfg.server.trusted_proxies))
        if tracing is not self.tracing:
            old_tracing, self.tracing = self.tracing, tracing
            if old_tracing is not None:
                self._spawn(asyncio.to_thread(old_tracing.shutdown))
        if old.server.access_log != cfg.server.access_log:
            old_log, self._access = self._access, AccessLog(cfg.server.access_log, self.worker)
            old_log.close()
        if (old.backends != cfg.backends or old.health != cfg.health) and self.upstream.session is not None:
            await self._start_health()
        self.metrics.reloads.labels("ok").inc()
        log.info("config reloaded (%s): version %d", source, snap.version)
        self.last_reload = {
            "ok": True,
            "version": snap.version,
            "at": time.time(),
            "error": None,
            "source": source,
            "warnings": warnings,
        }
        return self.last_reload

    async def _watch_loop(self) -> None:
        """Poll the file every :data:`RELOAD_POLL_S`; reload on a change. Never dies of a failed reload
        (one line logged; the next change is tried again)."""
        while True:
            await asyncio.sleep(RELOAD_POLL_S)
            try:
                sig = self._signature()
                if sig is not None and sig != self._file_sig:
                    await self.reload("file change")
            except Exception as e:  # noqa: BLE001 - the watcher outlives any one bad file
                self._file_sig = self._signature()
                log.error("config watch: reload failed, keeping version %d: %s", self.snap.version, reason(e))

    def install_signal_handlers(self, stop: Callable[[], None]) -> None:
        """SIGHUP -> reload; SIGINT/SIGTERM -> ``stop()``. Call inside the running loop (CLI)."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, lambda: self._spawn(self.reload("SIGHUP")))
        for s in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(s, stop)
