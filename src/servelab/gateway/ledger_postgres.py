"""The usage ledger in PostgreSQL (:class:`PostgresLedger`), for N gateway replicas sharing one database: the
same :class:`~servelab.gateway.ledger.Ledger` interface, schema and SQL as the SQLite store
(:mod:`servelab.gateway.ledger`, whose module doc describes both)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from servelab.gateway.ledger import (
    _KEY_COLUMNS,
    _USAGE_COLUMNS,
    KeyRecord,
    UsageRow,
    _budget_sql,
    _missing,
    _schema,
    _totals_rows,
    _totals_sql,
)

__all__ = ["PostgresLedger"]

log = logging.getLogger("servelab.gateway.ledger")


class PostgresLedger:
    """Usage ledger in PostgreSQL (shared by every gateway replica), via an asyncpg pool.

    ``dsn``: ``postgresql://user@host:port/db``. Rows are buffered and written with ``COPY`` in batches
    of ``batch_max_rows`` at least every ``flush_interval_s``. A failed write keeps the rows for the next
    try (logged); beyond ``max_pending_rows`` the oldest are dropped, logged and counted in
    ``dropped_rows``. The schema is created under an advisory lock so N replicas starting at once do not
    race on ``CREATE TABLE``.
    """

    _LOCK_ID = 0x5E4E1AB  # advisory lock id for schema creation (any fixed 64-bit number)

    def __init__(
        self,
        dsn: str,
        batch_max_rows: int = 1000,
        flush_interval_s: float = 0.2,
        pool_max_size: int = 4,
        max_pending_rows: int = 100_000,
    ) -> None:
        self.dsn = dsn
        self.batch_max_rows = batch_max_rows
        self.flush_interval_s = flush_interval_s
        self.pool_max_size = pool_max_size
        self.max_pending_rows = max_pending_rows
        self.dropped_rows = 0
        #: [monotonic start, failed writes] of the PostgreSQL outage in progress (None: up)
        self._down: list[float] | None = None
        self._pool: Any = None
        self._buf: list[tuple[Any, ...]] = []
        self._flush_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect, create the schema, start the background flusher. Raises asyncpg/OS errors when the
        database cannot be reached."""
        import asyncpg

        # asyncpg's pool logs a traceback per broken connection while the database is down; the
        # flusher's own one line per outage says it (above)
        logging.getLogger("asyncpg.pool").setLevel(logging.CRITICAL)
        self._pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=self.pool_max_size)
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", self._LOCK_ID)
            for stmt in _schema("DOUBLE PRECISION", "BIGINT"):
                await conn.execute(stmt)
        self._task = asyncio.create_task(self._flusher(), name="servelab-ledger-flush")

    def _require(self) -> None:
        if self._pool is None:
            raise RuntimeError("PostgresLedger is not started (call await start()) or already closed")

    async def ping(self, timeout_s: float = 1.0) -> None:
        """Readiness probe (``/health``): returns when a pooled connection answers ``SELECT 1`` within
        ``timeout_s``; raises asyncpg/OS errors, ``TimeoutError`` or ``RuntimeError`` otherwise."""
        self._require()
        async with asyncio.timeout(timeout_s), self._pool.acquire() as conn:
            await conn.fetchval("SELECT 1")

    async def record(self, row: UsageRow) -> None:
        """Buffer ``row``; the flusher writes it within ``flush_interval_s``."""
        self._require()
        self._buf.append(row.db_tuple())
        if len(self._buf) >= self.batch_max_rows:
            self._wake.set()

    async def _flusher(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.flush_interval_s)
            self._wake.clear()
            try:
                await self.flush()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 — the flusher outlives any outage
                # one line per outage (the flusher retries every flush_interval_s), a summary when it ends
                down = self._down
                if down is None:
                    self._down = [time.monotonic(), 1]
                    log.error(
                        "ledger: PostgreSQL write failed, %d rows kept, retrying every %g s quietly until "
                        "it is back: %s",
                        len(self._buf),
                        self.flush_interval_s,
                        str(e).splitlines()[0][:200] if str(e) else type(e).__name__,
                    )
                else:
                    down[1] += 1
                continue
            down = self._down
            if down is not None:
                self._down = None
                log.warning(
                    "ledger: PostgreSQL is back after %.1f s (%d failed writes); buffered rows written",
                    time.monotonic() - down[0],
                    down[1],
                )

    async def flush(self) -> None:
        """Write every buffered row; raises the database error (rows stay buffered) on failure."""
        self._require()
        async with self._flush_lock:
            while self._buf:
                batch = self._buf[: self.batch_max_rows]
                try:
                    async with self._pool.acquire() as conn:
                        await conn.copy_records_to_table("servelab_usage", records=batch, columns=_USAGE_COLUMNS)
                except BaseException:
                    over = len(self._buf) - self.max_pending_rows
                    if over > 0:
                        del self._buf[:over]
                        self.dropped_rows += over
                        log.error("ledger: dropped %d usage rows (PostgreSQL unreachable, buffer full)", over)
                    raise
                del self._buf[: len(batch)]

    @property
    def pending_rows(self) -> int:
        """Rows recorded but not yet written to PostgreSQL (count)."""
        return len(self._buf)

    async def insert_missing(self, rows: Sequence[UsageRow]) -> int:
        """As :meth:`SqliteLedger.insert_missing` (one transaction; raises asyncpg/OS errors)."""
        self._require()
        if not rows:
            return 0
        since = min(r.ts for r in rows)
        async with self._pool.acquire() as conn, conn.transaction():
            present = {
                (a, float(b))
                for a, b in await conn.fetch("SELECT request_id, ts FROM servelab_usage WHERE ts >= $1", since)
            }
            new = _missing(rows, present)
            if new:
                await conn.copy_records_to_table(
                    "servelab_usage", records=[r.db_tuple() for r in new], columns=_USAGE_COLUMNS
                )
        return len(new)

    async def budget_spend(self) -> dict[tuple[str, str], int]:
        """As :meth:`SqliteLedger.budget_spend` (every replica's rows: the database is shared)."""
        self._require()
        await self.flush()
        rows = await self._pool.fetch(_budget_sql("GREATEST"))
        return {(r[0], r[1]): int(r[2] or 0) for r in rows}

    async def totals(
        self,
        group_by: Sequence[str] = ("key_id", "model"),
        since_ts: float | None = None,
        until_ts: float | None = None,
    ) -> list[dict[str, Any]]:
        """As :meth:`SqliteLedger.totals` (flushes this process's buffer first)."""
        sql, params = _totals_sql(group_by, since_ts, until_ts, lambda i: f"${i}")
        await self.flush()
        rows = await self._pool.fetch(sql, *params)
        return _totals_rows(group_by, [tuple(r) for r in rows])

    async def put_key(self, record: KeyRecord) -> None:
        """Insert or update the key ``record.key_id``."""
        self._require()
        cols = ", ".join(_KEY_COLUMNS)
        vals = ", ".join(f"${i + 1}" for i in range(len(_KEY_COLUMNS)))
        upd = ", ".join(f"{c} = EXCLUDED.{c}" for c in _KEY_COLUMNS[1:])
        await self._pool.execute(
            f"INSERT INTO servelab_keys ({cols}) VALUES ({vals}) ON CONFLICT (key_id) DO UPDATE SET {upd}",
            *record.db_tuple(),
        )

    async def load_keys(self) -> list[KeyRecord]:
        """Every persisted key record (revoked ones included), ordered by creation time."""
        self._require()
        rows = await self._pool.fetch(
            f"SELECT {', '.join(_KEY_COLUMNS)} FROM servelab_keys ORDER BY created_ts, key_id"
        )
        return [KeyRecord.from_db(tuple(r)) for r in rows]

    async def close(self, spooled_in: str | None = None) -> None:
        """Stop the flusher, write what is buffered (errors logged), close the pool. Idempotent.
        ``spooled_in``: the journal folder that also holds the buffered rows (then a failed write is
        logged as spooled there, to be written at the next start, instead of as lost)."""
        if self._pool is None:
            return
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        try:
            await self.flush()
        except Exception as e:  # noqa: BLE001 — whatever failed is spooled
            if spooled_in is not None:
                log.error(
                    "ledger: PostgreSQL unreachable at close (%s): %d usage rows spooled in %s; they are "
                    "written to PostgreSQL when the gateway next starts",
                    e,
                    len(self._buf),
                    spooled_in,
                )
            else:
                log.error("ledger: %d usage rows not written at close: %s", len(self._buf), e)
        await self._pool.close()
        self._pool = None
