"""Usage ledger: one row per client request (who, which model, where it went, tokens, cost, outcome).

Two stores with the same :class:`Ledger` interface, both creating their own schema:

- :class:`SqliteLedger` (default, one gateway replica): a single writer thread owns the connection;
  :meth:`~SqliteLedger.record` only enqueues (no disk I/O on the event loop), the thread inserts in
  batches of up to ``batch_max_rows`` per transaction (waiting up to :data:`SQLITE_LINGER_S` for more),
  in WAL mode (readers never block the writer; https://www.sqlite.org/wal.html, checked 2026-11-30).
- :class:`~servelab.gateway.ledger_postgres.PostgresLedger` (N replicas, one shared database): asyncpg pool;
  rows are buffered and written with ``COPY`` (``copy_records_to_table``) every ``flush_interval_s`` or every
  ``batch_max_rows``. It shares this module's schema and SQL builders.

Reads go through the same path as writes: :meth:`totals` first flushes what this process has recorded,
so ``totals()`` after ``await record(...)`` calls is exact (token sums are integers; cost is stored as an
integer number of nano-units of the price currency, so its sums are exact too).

The ledger database also holds the API keys created through the admin port (:class:`KeyRecord`,
``put_key``/``load_keys``); :mod:`servelab.gateway.keys` uses them. Only SHA-256 hashes of secrets are
stored, never secrets.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import orjson

__all__ = ["GROUP_BY_COLUMNS", "KeyRecord", "Ledger", "SqliteLedger", "UsageRow", "token_cost"]

log = logging.getLogger("servelab.gateway.ledger")

#: Columns :meth:`Ledger.totals` can group by (``model`` is the public model name the client asked for).
GROUP_BY_COLUMNS = ("key_id", "tenant", "model", "backend", "upstream_model", "status", "outcome")
#: ``incomplete``: the gateway stopped (crash, kill -9) while the request was in flight; the row was
#: rebuilt from the write-ahead journal (:mod:`servelab.gateway.journal`).
OUTCOMES = ("ok", "error", "client_disconnect", "incomplete")
NANOS = 1_000_000_000


def token_cost(
    prompt_tokens: int, completion_tokens: int, input_price_per_1m: float | None, output_price_per_1m: float | None
) -> float:
    """Cost of one request from prices per 1M tokens (the unit OpenAI's price list uses,
    https://openai.com/api/pricing/, checked 2026-11-30): ``p * in/1e6 + c * out/1e6``; missing price = 0."""
    return (prompt_tokens * (input_price_per_1m or 0.0) + completion_tokens * (output_price_per_1m or 0.0)) / 1e6


@dataclass(frozen=True)
class UsageRow:
    """One request's usage.

    ``ts``: epoch seconds when the request arrived. ``model``: the public model name; ``backend`` /
    ``upstream_model``: where it was served (``None`` if it never reached one). ``*_tokens``: as reported
    by the engine's ``usage`` (``reserved_tokens``: what the limiter held). ``status``: HTTP status sent to
    the client (0 = none was final). ``outcome``: ``ok`` | ``error`` | ``client_disconnect`` |
    ``incomplete`` (the gateway died mid-request; tokens are what was known served, see
    :mod:`servelab.gateway.journal`). ``cost``: in the currency of the configured prices (see
    :func:`token_cost`), stored to 1e-9.
    """

    request_id: str
    ts: float
    key_id: str
    tenant: str
    model: str
    backend: str | None
    upstream_model: str | None
    prompt_tokens: int
    completion_tokens: int
    reserved_tokens: int
    status: int
    outcome: str
    cost: float = 0.0

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"UsageRow.outcome {self.outcome!r} is not one of {OUTCOMES}")

    def db_tuple(self) -> tuple[Any, ...]:
        """The row as stored: fields in order, ``cost`` as integer nano-units (``cost_nanos``)."""
        *head, cost = astuple(self)
        return (*head, round(cost * NANOS))


_USAGE_COLUMNS = tuple(f.name for f in fields(UsageRow))[:-1] + ("cost_nanos",)


@dataclass(frozen=True)
class KeyRecord:
    """An API key as persisted: never the secret, only ``sha256`` (hex) of it.

    ``allowed_models``: ``None`` = whatever the tenant allows. ``limits``: per-key overrides
    (``{"rpm": ..., "tpm": ..., "max_concurrency": ..., "token_budget": ...}``, absent = tenant's).
    ``source``: ``admin`` (created through the admin port) or ``config`` (a revocation of a config key).
    """

    key_id: str
    tenant: str
    sha256: str
    allowed_models: tuple[str, ...] | None
    limits: dict[str, int | None]
    created_ts: float
    revoked_ts: float | None = None
    source: str = "admin"

    def db_tuple(self) -> tuple[Any, ...]:
        models = None if self.allowed_models is None else orjson.dumps(list(self.allowed_models)).decode()
        return (
            self.key_id,
            self.tenant,
            self.sha256,
            models,
            orjson.dumps(self.limits).decode(),
            self.created_ts,
            self.revoked_ts,
            self.source,
        )

    @classmethod
    def from_db(cls, row: Sequence[Any]) -> KeyRecord:
        key_id, tenant, sha, models, limits, created, revoked, source = row
        return cls(
            key_id,
            tenant,
            sha,
            None if models is None else tuple(orjson.loads(models)),
            orjson.loads(limits) if limits else {},
            float(created),
            None if revoked is None else float(revoked),
            source,
        )


_KEY_COLUMNS = ("key_id", "tenant", "sha256", "allowed_models", "limits", "created_ts", "revoked_ts", "source")


class Ledger(Protocol):
    """Where usage rows (and admin-created keys) go; see the module docstring."""

    async def start(self) -> None: ...
    async def record(self, row: UsageRow) -> None: ...
    async def totals(
        self,
        group_by: Sequence[str] = ("key_id", "model"),
        since_ts: float | None = None,
        until_ts: float | None = None,
    ) -> list[dict[str, Any]]: ...
    async def put_key(self, record: KeyRecord) -> None: ...
    async def load_keys(self) -> list[KeyRecord]: ...
    async def close(self) -> None: ...


def _schema(real: str, big: str) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS servelab_usage (
            request_id TEXT NOT NULL, ts {real} NOT NULL, key_id TEXT NOT NULL, tenant TEXT NOT NULL,
            model TEXT NOT NULL, backend TEXT, upstream_model TEXT, prompt_tokens {big} NOT NULL,
            completion_tokens {big} NOT NULL, reserved_tokens {big} NOT NULL, status INTEGER NOT NULL,
            outcome TEXT NOT NULL, cost_nanos {big} NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS servelab_usage_ts ON servelab_usage (ts)",
        f"""CREATE TABLE IF NOT EXISTS servelab_keys (
            key_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, sha256 TEXT NOT NULL, allowed_models TEXT,
            limits TEXT NOT NULL, created_ts {real} NOT NULL, revoked_ts {real}, source TEXT NOT NULL)""",
    ]


def _totals_sql(
    group_by: Sequence[str], since_ts: float | None, until_ts: float | None, ph: Callable[[int], str]
) -> tuple[str, list[Any]]:
    """SQL + params for :meth:`Ledger.totals`; ``ph(i)`` renders the i-th (1-based) placeholder."""
    bad = [g for g in group_by if g not in GROUP_BY_COLUMNS]
    if bad:
        raise ValueError(f"cannot group usage by {bad}; choose from {list(GROUP_BY_COLUMNS)}")
    cols = ", ".join(group_by)
    where, params = [], []
    if since_ts is not None:
        params.append(since_ts)
        where.append(f"ts >= {ph(len(params))}")
    if until_ts is not None:
        params.append(until_ts)
        where.append(f"ts < {ph(len(params))}")
    sql = (
        f"SELECT {cols + ', ' if cols else ''}COUNT(*), SUM(prompt_tokens), SUM(completion_tokens), "
        f"SUM(reserved_tokens), SUM(cost_nanos) FROM servelab_usage"
        + (" WHERE " + " AND ".join(where) if where else "")
        + (f" GROUP BY {cols} ORDER BY {cols}" if cols else "")
    )
    return sql, params


def _totals_rows(group_by: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        n = len(group_by)
        d: dict[str, Any] = dict(zip(group_by, r[:n], strict=True))
        req, p, c, res, cost = (int(x or 0) for x in r[n:])
        d.update(
            requests=req,
            prompt_tokens=p,
            completion_tokens=c,
            total_tokens=p + c,
            reserved_tokens=res,
            cost_nanos=cost,
            cost=cost / NANOS,
        )
        out.append(d)
    return out


def _budget_sql(greatest: str) -> str:
    """SQL of :meth:`SqliteLedger.budget_spend`: per (tenant, key_id), the tokens a ``token_budget``
    counts: prompt + completion of finished rows; an ``incomplete`` row counts the larger of its
    reservation and what was known served (the output cap bounds what the engine could still have sent,
    so the reservation is a safe upper bound on a request whose end the gateway never saw)."""
    return (
        f"SELECT tenant, key_id, SUM(CASE WHEN outcome = 'incomplete' THEN "
        f"{greatest}(reserved_tokens, prompt_tokens + completion_tokens) "
        "ELSE prompt_tokens + completion_tokens END) FROM servelab_usage GROUP BY tenant, key_id"
    )


def _missing(rows: Sequence[UsageRow], present: set[tuple[str, float]]) -> list[UsageRow]:
    """``rows`` whose ``(request_id, ts)`` is not in ``present`` (nor twice in ``rows``)."""
    out = []
    for r in rows:
        k = (r.request_id, r.ts)
        if k not in present:
            present.add(k)
            out.append(r)
    return out


_INSERT_USAGE = f"INSERT INTO servelab_usage ({', '.join(_USAGE_COLUMNS)}) VALUES ({', '.join('?' * 13)})"


@dataclass
class _Call:
    fn: Callable[[sqlite3.Connection], Any]
    fut: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop


_STOP = object()
#: after a usage row reaches an idle SQLite writer, how long it waits for more rows before one transaction
#: commits them all, seconds. Without it each row of a lightly loaded gateway was its own BEGIN/INSERT/COMMIT
#: (and, with ``--workers N``, its own turn at the database's write lock): ~20 % more gateway CPU per
#: request at 2 workers on one core (benches/gateway_overhead.py). Rows are in the usage journal before
#: they reach the ledger, so waiting loses nothing on a crash; a call (flush, a query) ends the wait at once.
SQLITE_LINGER_S = 0.05


class SqliteLedger:
    """Usage ledger in a SQLite file (WAL), written by one background thread in batches.

    ``path``: the database file (parent folders are created). ``batch_max_rows``: rows per transaction;
    a transaction waits up to ``linger_s`` (:data:`SQLITE_LINGER_S`) after its first row for more.
    ``max_pending_rows``: when more rows wait in the queue, :meth:`record` awaits a flush (backpressure
    instead of unbounded memory). A failed write (disk full, …) is logged with the number of rows lost
    and counted in ``dropped_rows``; it never raises into the request path.
    """

    def __init__(
        self,
        path: str | Path,
        batch_max_rows: int = 500,
        max_pending_rows: int = 100_000,
        linger_s: float = SQLITE_LINGER_S,
    ) -> None:
        self.path = Path(path)
        self.batch_max_rows = batch_max_rows
        self.linger_s = linger_s
        self.max_pending_rows = max_pending_rows
        self.dropped_rows = 0
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._urgent = threading.Event()  # set with each call or stop: ends the writer's linger
        self._thread: threading.Thread | None = None
        self._closed = False

    async def start(self) -> None:
        """Open (or create) the database and its schema; start the writer thread. Raises
        ``sqlite3.Error``/``OSError`` if the file cannot be opened."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        ready: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="servelab-ledger", daemon=True)
        self._thread.start()
        err = await asyncio.get_running_loop().run_in_executor(None, ready.get)
        if err is not None:
            self._thread = None
            raise err

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None)  # explicit BEGIN/COMMIT below
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; safe with WAL
        conn.execute("PRAGMA busy_timeout=5000")
        for stmt in _schema("REAL", "INTEGER"):
            conn.execute(stmt)
        return conn

    def _write(self, conn: sqlite3.Connection, rows: list[UsageRow]) -> None:
        if not rows:
            return
        try:
            conn.execute("BEGIN")
            conn.executemany(_INSERT_USAGE, [r.db_tuple() for r in rows])
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self.dropped_rows += len(rows)
            log.error("ledger: could not write %d usage rows to %s: %s", len(rows), self.path, e)

    def _run(self, ready: queue.SimpleQueue[BaseException | None]) -> None:
        try:
            conn = self._open()
        except BaseException as e:  # noqa: BLE001 — handed to start(), which re-raises it
            ready.put(e)
            return
        ready.put(None)
        try:
            while True:
                items = self._gather()
                rows: list[UsageRow] = []
                for it in items:
                    if isinstance(it, UsageRow):
                        rows.append(it)
                        continue
                    self._write(conn, rows)
                    rows = []
                    if it is _STOP:
                        return
                    try:
                        res = it.fn(conn)
                    except BaseException as e:  # noqa: BLE001 — handed to the awaiting coroutine
                        it.loop.call_soon_threadsafe(_set_exc, it.fut, e)
                    else:
                        it.loop.call_soon_threadsafe(_set_res, it.fut, res)
                self._write(conn, rows)
        finally:
            conn.close()

    def _gather(self) -> list[Any]:
        """The next batch (writer thread): the first item, then, when it is a usage row, up to ``linger_s``
        for more (a call or stop ends the wait at once: :meth:`_call` sets ``_urgent``), then everything
        queued, up to ``batch_max_rows``. Rows queued during the wait do not wake this thread: one wake-up
        per batch, not per row (each wake-up is a GIL hand-over with the event loop)."""
        items = [self._q.get()]
        if isinstance(items[0], UsageRow) and self.linger_s > 0:
            self._urgent.wait(self.linger_s)
        self._urgent.clear()  # a call that set it meanwhile is in the queue, taken just below
        while len(items) < self.batch_max_rows:
            try:
                items.append(self._q.get_nowait())
            except queue.Empty:
                break
        return items

    async def _call(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        if self._thread is None or self._closed:
            raise RuntimeError("SqliteLedger is not started (call await start()) or already closed")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._q.put(_Call(fn, fut, loop))
        self._urgent.set()
        return await fut

    async def ping(self, timeout_s: float = 1.0) -> None:
        """Readiness probe (``/health``): returns when the writer thread runs and answers ``SELECT 1``
        within ``timeout_s``; raises ``RuntimeError``/``sqlite3.Error``/``TimeoutError`` otherwise."""
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError("the SQLite ledger's writer thread is not running")
        await asyncio.wait_for(self._call(lambda c: c.execute("SELECT 1").fetchone()), timeout_s)

    async def record(self, row: UsageRow) -> None:
        """Queue ``row`` for the writer thread (no I/O here). Raises ``RuntimeError`` if not started."""
        if self._thread is None or self._closed:
            raise RuntimeError("SqliteLedger is not started (call await start()) or already closed")
        self._q.put(row)
        if self._q.qsize() > self.max_pending_rows:
            await self.flush()

    async def flush(self) -> None:
        """Return once every row recorded before this call is committed (a failed write is counted in
        ``dropped_rows``, not raised)."""
        await self._call(lambda conn: None)

    async def insert_missing(self, rows: Sequence[UsageRow]) -> int:
        """Insert the ``rows`` not already stored (same ``request_id`` and ``ts``), in one transaction;
        return how many were inserted. Used to replay the journal (a row may already be in the database
        when the gateway died between the commit and the journal's clean-up). Raises ``sqlite3.Error``."""
        if not rows:
            return 0
        since = min(r.ts for r in rows)

        def run(conn: sqlite3.Connection) -> int:
            present = {
                (a, float(b))
                for a, b in conn.execute("SELECT request_id, ts FROM servelab_usage WHERE ts >= ?", (since,))
            }
            new = _missing(rows, present)
            conn.execute("BEGIN")
            try:
                conn.executemany(_INSERT_USAGE, [r.db_tuple() for r in new])
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return len(new)

        return int(await self._call(run))

    async def budget_spend(self) -> dict[tuple[str, str], int]:
        """``{(tenant, key_id): tokens}`` a token budget counts, summed over every stored row (see
        :func:`_budget_sql`); :meth:`servelab.gateway.limits.MemoryLimiter.seed_budgets` takes it."""
        sql = _budget_sql("MAX")
        rows = await self._call(lambda conn: conn.execute(sql).fetchall())
        return {(t, k): int(n or 0) for t, k, n in rows}

    async def totals(
        self,
        group_by: Sequence[str] = ("key_id", "model"),
        since_ts: float | None = None,
        until_ts: float | None = None,
    ) -> list[dict[str, Any]]:
        """Exact sums per group: ``requests``, ``prompt_tokens``, ``completion_tokens``, ``total_tokens``,
        ``reserved_tokens``, ``cost_nanos`` (int), ``cost`` (float) plus the ``group_by`` columns, ordered by
        them; only rows with ``since_ts <= ts < until_ts`` when given. Raises ``ValueError`` for an unknown
        column (see :data:`GROUP_BY_COLUMNS`)."""
        sql, params = _totals_sql(group_by, since_ts, until_ts, lambda i: "?")
        rows = await self._call(lambda conn: conn.execute(sql, params).fetchall())
        return _totals_rows(group_by, rows)

    async def put_key(self, record: KeyRecord) -> None:
        """Insert or replace the key ``record.key_id`` (committed when this returns)."""
        sql = (
            f"INSERT OR REPLACE INTO servelab_keys ({', '.join(_KEY_COLUMNS)}) "
            f"VALUES ({', '.join('?' * len(_KEY_COLUMNS))})"
        )
        await self._call(lambda conn: conn.execute(sql, record.db_tuple()))

    async def load_keys(self) -> list[KeyRecord]:
        """Every persisted key record (revoked ones included), ordered by creation time."""
        rows = await self._call(
            lambda conn: conn.execute(
                f"SELECT {', '.join(_KEY_COLUMNS)} FROM servelab_keys ORDER BY created_ts, key_id"
            ).fetchall()
        )
        return [KeyRecord.from_db(r) for r in rows]

    async def close(self) -> None:
        """Write everything queued, stop the thread, close the database. Idempotent."""
        if self._thread is None or self._closed:
            return
        self._closed = True
        self._q.put(_STOP)
        self._urgent.set()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)


def _set_res(fut: asyncio.Future[Any], res: Any) -> None:
    if not fut.done():
        fut.set_result(res)


def _set_exc(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
