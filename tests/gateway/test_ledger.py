"""Usage ledger on SQLite (file, WAL, writer thread) and on a real PostgreSQL 15 server: exact totals
after thousands of concurrent record() calls, grouping, time filters, persistence, key records."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import threading
import time
import uuid
from collections import defaultdict

import asyncpg
import pytest
from services import postgres_cluster

from servelab.gateway.ledger import KeyRecord, SqliteLedger, UsageRow, token_cost
from servelab.gateway.ledger_postgres import PostgresLedger


@pytest.fixture(scope="module")
def pg_dsn():
    with postgres_cluster() as pg:
        yield pg.dsn


async def _fresh_pg_db(dsn: str) -> str:
    name = f"l_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    return dsn.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_factory(request, tmp_path):
    """Returns ``async make() -> started ledger`` on a fresh database, plus ``reopen()`` for the same one."""
    if request.param == "postgres":
        dsn_holder: dict[str, str] = {}
        pg = request.getfixturevalue("pg_dsn")

        async def make():
            if "dsn" not in dsn_holder:
                dsn_holder["dsn"] = await _fresh_pg_db(pg)
            led = PostgresLedger(dsn_holder["dsn"], batch_max_rows=300)
            await led.start()
            return led
    else:
        path = tmp_path / "sub" / "usage.db"

        async def make():
            led = SqliteLedger(path, batch_max_rows=300)
            await led.start()
            return led

    make.kind = request.param  # type: ignore[attr-defined]
    return make


def _rows(n: int, seed: int = 1, t0: float = 1_700_000_000.0) -> list[UsageRow]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        p, c = rnd.randint(0, 5000), rnd.randint(0, 2000)
        out.append(
            UsageRow(
                request_id=f"r{seed}-{i}",
                ts=t0 + i * 0.01,
                key_id=rnd.choice(["k1", "k2", "k3"]),
                tenant=rnd.choice(["ta", "tb"]),
                model=rnd.choice(["gemma", "small"]),
                backend=rnd.choice(["llama-a", None]),
                upstream_model="gemma-3-270m",
                prompt_tokens=p,
                completion_tokens=c,
                reserved_tokens=p + 256,
                status=rnd.choice([200, 200, 429, 502]),
                outcome=rnd.choice(["ok", "ok", "error", "client_disconnect"]),
                cost=token_cost(p, c, 0.15, 0.6),
            )
        )
    return out


def _expect(rows: list[UsageRow], group_by: tuple[str, ...]) -> dict[tuple, tuple[int, int, int, int]]:
    acc: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for r in rows:
        a = acc[tuple(getattr(r, g) for g in group_by)]
        a[0] += 1
        a[1] += r.prompt_tokens
        a[2] += r.completion_tokens
        a[3] += round(r.cost * 1e9)
    return {k: tuple(v) for k, v in acc.items()}


def _got(totals: list[dict], group_by: tuple[str, ...]) -> dict[tuple, tuple[int, int, int, int]]:
    return {
        tuple(t[g] for g in group_by): (t["requests"], t["prompt_tokens"], t["completion_tokens"], t["cost_nanos"])
        for t in totals
    }


def test_token_cost_per_million() -> None:
    assert token_cost(1_000_000, 0, 0.15, 0.6) == pytest.approx(0.15)
    assert token_cost(1000, 2000, 0.15, 0.6) == pytest.approx((1000 * 0.15 + 2000 * 0.6) / 1e6)
    assert token_cost(10, 10, None, None) == 0.0
    with pytest.raises(ValueError, match="outcome"):
        UsageRow("r", 0.0, "k", "t", "m", None, None, 0, 0, 0, 200, "fine")


def test_totals_exact_after_thousands_of_concurrent_records(ledger_factory) -> None:
    rows = _rows(4000)

    async def go():
        led = await ledger_factory()
        try:
            # 4000 record() calls in flight together, in random order
            shuffled = rows[:]
            random.Random(7).shuffle(shuffled)
            await asyncio.gather(*(led.record(r) for r in shuffled))
            for gb in (("key_id", "model"), ("tenant", "outcome"), ("backend", "status"), ()):
                totals = await led.totals(gb)
                assert _got(totals, gb) == _expect(rows, gb), gb
            t = (await led.totals(()))[0]
            assert t["total_tokens"] == t["prompt_tokens"] + t["completion_tokens"]
            assert t["reserved_tokens"] == sum(r.reserved_tokens for r in rows)
            assert t["cost"] == pytest.approx(sum(r.cost for r in rows), rel=1e-12)
            # time filter: [since, until)
            since, until = rows[1000].ts, rows[3000].ts
            sub = [r for r in rows if since <= r.ts < until]
            assert _got(await led.totals(("key_id",), since, until), ("key_id",)) == _expect(sub, ("key_id",))
            with pytest.raises(ValueError, match="cannot group usage by"):
                await led.totals(("key_id; DROP TABLE servelab_usage",))
        finally:
            await led.close()
        # a new ledger on the same database sees everything (persisted)
        led2 = await ledger_factory()
        try:
            assert _got(await led2.totals(("key_id", "model")), ("key_id", "model")) == _expect(
                rows, ("key_id", "model")
            )
        finally:
            await led2.close()

    asyncio.run(go())


def test_empty_ledger_totals(ledger_factory) -> None:
    async def go():
        led = await ledger_factory()
        try:
            assert await led.totals() == []
            assert (await led.totals(()))[0]["requests"] == 0
        finally:
            await led.close()

    asyncio.run(go())


def test_key_records_roundtrip(ledger_factory) -> None:
    async def go():
        led = await ledger_factory()
        try:
            a = KeyRecord("ka", "ta", "ab" * 32, ("gemma",), {"rpm": 5}, 10.0)
            b = KeyRecord("kb", "tb", "cd" * 32, None, {}, 11.0)
            await led.put_key(a)
            await led.put_key(b)
            await led.put_key(KeyRecord("kb", "tb", "cd" * 32, None, {}, 11.0, revoked_ts=12.0))  # upsert
            assert await led.load_keys() == [a, KeyRecord("kb", "tb", "cd" * 32, None, {}, 11.0, 12.0)]
        finally:
            await led.close()

    asyncio.run(go())


def test_sqlite_is_wal_and_writes_off_the_event_loop(tmp_path) -> None:
    path = tmp_path / "u.db"
    writer_threads: set[str] = set()

    async def go():
        led = SqliteLedger(path)
        await led.start()
        orig = led._write

        def spy(conn, rows):
            if rows:
                writer_threads.add(threading.current_thread().name)
            return orig(conn, rows)

        led._write = spy  # type: ignore[method-assign]
        t0 = time.perf_counter()
        for r in _rows(2000, seed=3):
            await led.record(r)
        enqueue_s = time.perf_counter() - t0
        await led.flush()
        await led.close()
        return enqueue_s

    enqueue_s = asyncio.run(go())
    assert writer_threads == {"servelab-ledger"}
    assert enqueue_s < 1.0  # 2000 records only enqueue (no commit per row on the loop)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT COUNT(*) FROM servelab_usage").fetchone()[0] == 2000
    conn.close()


def test_sqlite_rows_share_a_transaction_and_a_call_ends_the_wait(tmp_path) -> None:
    """Rows recorded one at a time, as a lightly loaded gateway records them, go to the database in one
    transaction per linger window, not one per row; a flush while the writer waits (here a 30 s linger)
    returns at once with every row before it committed, and close() does not wait out the linger."""
    path = tmp_path / "u.db"
    batches: list[int] = []

    async def go() -> tuple[float, float]:
        led = SqliteLedger(path, linger_s=30.0)
        await led.start()
        orig = led._write

        def spy(conn, rows):
            if rows:
                batches.append(len(rows))
            return orig(conn, rows)

        led._write = spy  # type: ignore[method-assign]
        for r in _rows(20, seed=5):
            await led.record(r)
            await asyncio.sleep(0.01)  # one row at a time: the writer is idle between them
        t0 = time.perf_counter()
        await led.flush()
        flush_s = time.perf_counter() - t0
        await led.record(_rows(1, seed=6)[0])
        t1 = time.perf_counter()
        await led.close()
        return flush_s, time.perf_counter() - t1

    flush_s, close_s = asyncio.run(go())
    assert flush_s < 10.0 and close_s < 10.0, (flush_s, close_s)  # far below the 30 s linger
    assert batches == [20, 1], batches
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT COUNT(*) FROM servelab_usage").fetchone()[0] == 21
    conn.close()


def test_sqlite_not_started_is_clear(tmp_path) -> None:
    async def go():
        led = SqliteLedger(tmp_path / "x.db")
        with pytest.raises(RuntimeError, match="not started"):
            await led.record(_rows(1)[0])

    asyncio.run(go())


def test_postgres_two_replicas_share_one_database(pg_dsn) -> None:
    """Two ledgers (as two gateway replicas) start at once on a new database (schema under an advisory
    lock) and record concurrently; totals from either are exact over both."""
    rows_a, rows_b = _rows(1500, seed=11), _rows(1500, seed=12)

    async def go():
        dsn = await _fresh_pg_db(pg_dsn)
        a, b = PostgresLedger(dsn, flush_interval_s=0.05), PostgresLedger(dsn, flush_interval_s=0.05)
        await asyncio.gather(a.start(), b.start())
        try:
            await asyncio.gather(*(a.record(r) for r in rows_a), *(b.record(r) for r in rows_b))
            await a.flush()
            got = _got(await b.totals(("tenant", "model")), ("tenant", "model"))
            assert got == _expect(rows_a + rows_b, ("tenant", "model"))
        finally:
            await asyncio.gather(a.close(), b.close())

    asyncio.run(go())


def test_postgres_flusher_writes_without_totals(pg_dsn) -> None:
    async def go():
        dsn = await _fresh_pg_db(pg_dsn)
        led = PostgresLedger(dsn, flush_interval_s=0.05)
        await led.start()
        try:
            for r in _rows(10, seed=5):
                await led.record(r)
            await asyncio.sleep(0.5)  # the background flusher, not totals(), writes them
            conn = await asyncpg.connect(dsn)
            try:
                assert await conn.fetchval("SELECT COUNT(*) FROM servelab_usage") == 10
            finally:
                await conn.close()
        finally:
            await led.close()

    asyncio.run(go())
