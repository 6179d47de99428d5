"""Whether this gateway replica can serve now: the ``/health`` (readiness) answer.

Liveness and readiness are separate questions, as Kubernetes separates them (a failed liveness probe
restarts the process, a failed readiness probe only takes it out of the load balancer;
https://kubernetes.io/docs/concepts/configuration/liveness-readiness-startup-probes/, checked
2026-12-01): ``/health/live`` answers 200 while the event loop runs; ``/health`` answers 503 when a
request would fail anyway:

- no backend is up (every breaker open or every active health check failing);
- ``state.redis_url`` is set and Redis does not answer ``PING`` (every request needs the shared limiter);

and reports, with 200 and ``"status": "degraded"``, a ledger that cannot be written now (requests are
still served; usage rows wait in the ledger's buffer/journal until the database is back).

Checks of Redis and the ledger run at most once per ``interval_s`` (answers in between are cached), each
bounded by ``timeout_s``, so a flood of ``/health`` cannot load Redis or the database.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

__all__ = ["Readiness"]

log = logging.getLogger("servelab.gateway")


def _why(e: BaseException) -> str:
    """The exception's class only: ``/health`` is public, and messages carry hosts and ports."""
    return "timeout" if isinstance(e, TimeoutError) else type(e).__name__


def _line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200]}" if lines else type(e).__name__


class Readiness:
    """Cached probes of the shared state this replica needs. ``redis``: a ``redis.asyncio`` client or
    None (no shared state); ``ledger``: anything with ``async ping(timeout_s)`` (the ledgers of
    :mod:`servelab.gateway.ledger`) or None. ``interval_s``/``timeout_s``: seconds."""

    def __init__(self, redis: Any, ledger: Any, interval_s: float = 1.0, timeout_s: float = 1.0) -> None:
        self.redis = redis
        self.ledger = ledger
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._at = -float("inf")
        self._last: dict[str, str] = {}
        self._lock = asyncio.Lock()

    async def checks(self) -> dict[str, str]:
        """``{"redis": "ok" | "unreachable (<error class>)", "ledger": "ok" | "unusable (<error class>)"}``
        (only the parts that exist), at most ``interval_s`` old; details go to the log."""
        async with self._lock:
            if time.monotonic() - self._at < self.interval_s:
                return self._last
            out: dict[str, str] = {}
            if self.redis is not None:
                try:
                    await asyncio.wait_for(self.redis.ping(), self.timeout_s)
                    out["redis"] = "ok"
                except Exception as e:  # noqa: BLE001 — redis errors, OSError, TimeoutError
                    out["redis"] = f"unreachable ({_why(e)})"
                    if self._last.get("redis") != out["redis"]:  # logged when it changes, not per probe
                        log.warning("health: Redis does not answer PING: %s", _line(e))
            ping = getattr(self.ledger, "ping", None)
            if ping is not None:
                try:
                    await asyncio.wait_for(ping(self.timeout_s), self.timeout_s + 0.5)
                    out["ledger"] = "ok"
                except Exception as e:  # noqa: BLE001 — asyncpg/sqlite/OS errors, TimeoutError
                    out["ledger"] = f"unusable ({_why(e)})"
                    if self._last.get("ledger") != out["ledger"]:
                        log.warning("health: the ledger is unusable: %s", _line(e))
            self._last, self._at = out, time.monotonic()
            return out
