"""The gateway's start-up around its ledger (a mixin of :class:`servelab.gateway.server.Gateway`).

A misconfigured ledger (wrong database, role or password, an unwritable SQLite path) stops the start with
one line naming the field. PostgreSQL that is merely down (connection refused or timed out) does not: the
gateway starts, binds its ports and is not ready (``not_ready``; the public ``/health`` names the field,
never the address) while it retries the database (:data:`LEDGER_RETRY_S` doubling to
:data:`LEDGER_RETRY_MAX_S`); once it answers, token-budget spend is seeded into the limiter and keys are
loaded from it, and the replica serves.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from servelab.gateway.config import GatewayConfig
from servelab.gateway.limits import safe_url
from servelab.gateway.snapshot import Snapshot
from servelab.gateway.upstream import reason
from servelab.wire.client import ConfigError

__all__ = ["LEDGER_RETRY_MAX_S", "LEDGER_RETRY_S", "WORKER_KEYS_REFRESH_S", "LedgerStart"]

log = logging.getLogger("servelab.gateway")

#: First wait before the ledger is tried again when PostgreSQL was down at start (seconds; doubles)
LEDGER_RETRY_S = 0.5
#: Longest wait between ledger tries (seconds)
LEDGER_RETRY_MAX_S = 5.0
#: seconds between key reloads from the ledger in each worker under ``--workers N``
WORKER_KEYS_REFRESH_S = 1.0


def _database_down(e: BaseException) -> bool:
    """True when ``e`` says PostgreSQL is not answering (connection refused/reset, timeout, the server
    starting or shutting down), not that the DSN is wrong (unknown database, role, password)."""
    if isinstance(e, (OSError, TimeoutError)):
        return True
    try:
        import asyncpg
    except ImportError:  # pragma: no cover - asyncpg is a dependency
        return False
    return isinstance(e, (asyncpg.CannotConnectNowError, asyncpg.ConnectionDoesNotExistError))


class LedgerStart:
    """The ledger part of the start-up (module doc); the attributes it uses are the gateway's."""

    worker: int | None
    snap: Snapshot
    not_ready: str | None
    not_ready_public: str
    _ledger: Any
    _limiter: Any
    _keystore: Any

    def _set_not_ready(self, detail: str, unreachable: bool = True) -> None:
        """Mark this replica not ready: ``detail`` (may name the database's address) for the log and the
        admin port; the public /health gets only the field at fault (design: no addresses on the public port)."""
        self.not_ready = detail
        led = self.snap.cfg.ledger
        what = "ledger.postgres_dsn: PostgreSQL" if led.postgres_dsn else "ledger.sqlite_path: the ledger"
        self.not_ready_public = f"{what} {'is unreachable' if unreachable else 'cannot be used'} (the log says why)"

    async def _start_ledger(self, cfg: GatewayConfig) -> str | None:
        """Start the ledger built from ``cfg``. Returns None when it started, or the reason line when
        PostgreSQL is down (connection refused or timed out: an outage that ends by itself); raises
        ConfigError naming the field for everything else (wrong database, role or password, unwritable
        SQLite path), which waiting would not fix."""
        try:
            await self._ledger.start()
            return None
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 — sqlite3.Error, OSError, asyncpg errors: name the field, not a port
            if cfg.ledger.postgres_dsn:
                where = f"ledger.postgres_dsn: PostgreSQL at {safe_url(cfg.ledger.postgres_dsn)}"
                if _database_down(e):
                    return f"{where} is unreachable ({reason(e)})"
                raise ConfigError(
                    f"{where} cannot be used ({reason(e)}); check host, port, user and database "
                    "(createdb it first), or use ledger.sqlite_path"
                ) from None
            raise ConfigError(
                f"ledger.sqlite_path: cannot open {cfg.ledger.sqlite_path} ({reason(e)}); "
                "give a path in a writable folder"
            ) from None

    async def _start_after_ledger(self) -> None:
        """The start-up steps that need the ledger: budgets seeded from its spend, keys loaded from it."""
        await self._seed_budgets()
        start = getattr(self._keystore, "start", None)
        if start is not None and self.worker is not None:
            # keys created or revoked through worker 0's admin port reach the other workers within this
            await start(refresh_interval_s=WORKER_KEYS_REFRESH_S)
        elif start is not None:
            await start()

    async def _wait_for_ledger(self, cfg: GatewayConfig) -> None:
        """Retry the ledger every :data:`LEDGER_RETRY_S` (doubling to :data:`LEDGER_RETRY_MAX_S`) until it
        starts, then finish the start-up and clear :attr:`not_ready`. A configuration error found then
        (e.g. the database exists no more) is logged and retried like an outage."""
        wait = LEDGER_RETRY_S
        while True:
            await asyncio.sleep(wait)
            wait = min(wait * 2, LEDGER_RETRY_MAX_S)
            try:
                down = await self._start_ledger(cfg)
                if down is not None:
                    self._set_not_ready(down)
                    continue
                await self._start_after_ledger()
            except Exception as e:  # noqa: BLE001 - keep waiting; one line per try
                self._set_not_ready(str(e) if isinstance(e, ConfigError) else f"ledger: {reason(e)}", unreachable=False)
                log.error("start-up: %s", self.not_ready)
                continue
            self.not_ready = None
            log.info("ledger reachable: the gateway is ready")
            return

    async def _seed_budgets(self) -> None:
        """Token budgets count the ledger's spend (durable; survives restarts and a Redis without
        persistence): the limiter's counters are raised to the ledger's sums (limits.py module doc)."""
        spend_fn = getattr(self._ledger, "budget_spend", None)
        seed = getattr(self._limiter, "seed_budgets", None)
        if spend_fn is None or seed is None:
            return
        try:
            spend = await spend_fn()
            await seed(spend, tuple(self.snap.cfg.tenants))
        except Exception as e:  # noqa: BLE001 — fail closed: a budget that forgot its spend is no budget
            raise ConfigError(
                f"token budgets: cannot load their spend from the ledger into the limiter "
                f"({reason(e)}); "
                "check ledger.* and state.redis_url"
            ) from None
        if spend:
            log.info("budgets: spend of %d keys (%d tokens) loaded from the ledger", len(spend), sum(spend.values()))
        if hasattr(self._limiter, "budget_source"):  # RedisLimiter: seeds again if Redis loses the counters
            self._limiter.budget_source = spend_fn
