"""The limiter's Redis connections under bursts and outages (issue 21 item 2), with a real redis-server.

- An 800-request burst against one gateway worker gets no 503: the limiter's pool queues for a
  connection (redis-py ``BlockingConnectionPool``) instead of failing with "Too many connections"
  (redis-py's default asyncio pool allows 100 per process, so 400 concurrent requests got 300 x 503).
- A settle that cannot reach Redis is retried in the background until it lands, exactly once: the
  finished request's concurrency slot frees when Redis answers again, not after ``lease_s`` (900 s).
- The first request after a Redis restart is served (a stale pooled connection is reconnected and
  the command retried), and a lost reply never applies a settle twice.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from conftest import gateway_key
from services import RedisServer, _wait_port, free_port

from servelab.gateway.limits import Limits, RedisLimiter, redis_pool_size


def _redis_on(port: int) -> RedisServer:
    """A redis-server on ``port`` without persistence (a restart on the same port starts empty)."""
    exe = shutil.which("redis-server")
    assert exe is not None, "redis-server not found; install it with scripts/setup.sh"
    proc = subprocess.Popen(
        [
            exe,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--loglevel",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert _wait_port(port, 10.0, proc), f"redis-server did not start on port {port}"
    return RedisServer(port, proc)


@pytest.fixture
def redis_srv():
    srv = _redis_on(free_port())
    yield srv
    srv.stop()


def _burst(url: str, reqs: list[tuple[str, int]], timeout_s: float = 60.0) -> list[tuple[int, str]]:
    """Send every ``(key, i)`` of ``reqs`` at once (one connection each); ``(status, error code)`` per request."""
    import aiohttp

    async def go() -> list[tuple[int, str]]:
        conn = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:

            async def one(key: str, i: int) -> tuple[int, str]:
                async with s.post(
                    f"{url}/chat/completions",
                    headers={"Authorization": f"Bearer {key}"},
                    json={"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": f"hi {i}"}]},
                ) as r:
                    raw = await r.read()
                    code = orjson.loads(raw)["error"]["code"] if r.status != 200 else ""
                    return r.status, code

            return list(await asyncio.gather(*(one(k, i) for k, i in reqs)))

    return asyncio.run(go())


def test_pool_size_follows_the_connection_cap() -> None:
    assert redis_pool_size(464) == 29 and redis_pool_size(8) == 4 and redis_pool_size(100_000) == 32
    assert redis_pool_size(464, configured=7) == 7


def test_800_request_burst_on_one_worker_gets_no_503(redis_srv: RedisServer, gateway: Any, mock_engine: Any) -> None:
    """One worker, key A with max_concurrency 20 sends 760 requests at once while key B of another team
    sends 40: every answer is 200 or 429 (concurrency), none 503 ``limits_unavailable``; after the burst
    no slot is held (the next 20 concurrent requests of A are all served)."""
    eng = mock_engine("--dialect", "vllm", "--output-tokens", "2", "--ttft-ms", "20")
    key_a, entry_a = gateway_key("ka", "ta")
    key_b, entry_b = gateway_key("kb", "tb")
    gw = gateway(
        {
            "state": {"redis_url": redis_srv.url},
            "server": {"max_connections": 2000},
            "backends": [{"name": "b", "kind": "mock", "base_url": eng.root, "models": ["m"]}],
            "models": {"m": {"targets": [{"backend": "b"}]}},
            "tenants": {"ta": {"max_concurrency": 20, "token_budget": 10_000_000}, "tb": {"max_concurrency": 100}},
            "keys": [entry_a, entry_b],
        }
    )
    reqs = [(key_b if i % 20 == 7 else key_a, i) for i in range(800)]
    got = _burst(gw.url, reqs)
    by_key = {k: Counter(s for (kk, _), (s, _) in zip(reqs, got, strict=True) if kk == k) for k in (key_a, key_b)}
    codes = Counter(c for s, c in got if s != 200)
    assert 503 not in by_key[key_a] and 503 not in by_key[key_b], (by_key, codes, gw.stderr()[-2000:])
    assert by_key[key_b] == Counter({200: 40}), by_key
    assert by_key[key_a][200] >= 20 and set(by_key[key_a]) <= {200, 429}, by_key
    assert set(codes) <= {"rate_limit_exceeded"}, codes
    assert "failed on settle" not in gw.stderr() and "failed on admit" not in gw.stderr(), gw.stderr()[-2000:]
    # every finished request gave its slot back: 20 at once are all admitted again
    again = _burst(gw.url, [(key_a, i) for i in range(20)])
    assert [s for s, _ in again] == [200] * 20, again


def test_first_request_after_a_redis_restart_is_served(tmp_path: Path, gateway: Any, mock_engine: Any) -> None:
    """A budgeted key is served, redis-server restarts empty on the same port, and the next request is
    served too (the pooled connection is stale; the budget is seeded again from the ledger)."""
    port = free_port()
    srv = _redis_on(port)
    try:
        eng = mock_engine("--dialect", "vllm", "--output-tokens", "2")
        key, entry = gateway_key("k1", "t")
        gw = gateway(
            {
                "state": {"redis_url": srv.url},
                "backends": [{"name": "b", "kind": "mock", "base_url": eng.root, "models": ["m"]}],
                "models": {"m": {"targets": [{"backend": "b"}]}},
                "tenants": {"t": {"token_budget": 1_000_000, "max_concurrency": 5}},
                "keys": [entry],
            }
        )
        assert _burst(gw.url, [(key, 0), (key, 1)]) == [(200, ""), (200, "")]
        srv.stop()
        srv = _redis_on(port)
        assert _burst(gw.url, [(key, 2)]) == [(200, "")], gw.stderr()[-2000:]
        assert _burst(gw.url, [(key, 3), (key, 4)]) == [(200, ""), (200, "")]
    finally:
        srv.stop()


def _counters(url: str, lim: RedisLimiter, tenant: str, key_id: str) -> tuple[int, int]:
    """(concurrency slots held, budget counter) of the key scope."""
    r = redis.Redis.from_url(url)
    try:
        keys = lim._keys("key", tenant, key_id)
        return int(r.zcard(keys[3])), int(r.get(keys[4]) or 0)
    finally:
        r.close()


def test_settle_that_cannot_reach_redis_lands_later_exactly_once(redis_srv: RedisServer) -> None:
    """Redis stops answering (CLIENT PAUSE) while a request settles: settle returns, the slot is freed
    in the background once Redis answers again (well before lease_s), and the budget is corrected once."""

    async def go() -> None:
        lim = RedisLimiter(redis_srv.url, lease_s=900.0, prefix="p1", socket_timeout_s=0.2, settle_retry_max_s=0.2)
        try:
            lim_ = Limits(max_concurrency=1, token_budget=1000)
            adm = await lim.admit("k", "t", "m", 100, lim_)
            assert _counters(redis_srv.url, lim, "t", "k") == (1, 100)
            r = redis.Redis.from_url(redis_srv.url)
            r.execute_command("CLIENT", "PAUSE", "3000", "ALL")
            r.close()
            t0 = time.monotonic()
            await lim.settle(adm, 7)
            assert time.monotonic() - t0 < 2.8  # it did not wait for Redis: the settle is pending
            assert lim.pending_settles == 1
            deadline = time.monotonic() + 10
            while lim.pending_settles and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert lim.pending_settles == 0
            assert _counters(redis_srv.url, lim, "t", "k") == (0, 7)
            await lim.settle(await lim.admit("k", "t", "m", 100, lim_), 3)  # the slot is free again
            assert _counters(redis_srv.url, lim, "t", "k") == (0, 10)
        finally:
            await lim.close()

    asyncio.run(go())


def test_a_settle_applied_twice_counts_once(redis_srv: RedisServer) -> None:
    """The settle script is idempotent per admission (a retry after a lost reply changes nothing), and so
    is the admit script (a retried admit reserves once)."""

    async def go() -> None:
        lim = RedisLimiter(redis_srv.url, prefix="p2")
        try:
            lim_ = Limits(max_concurrency=2, token_budget=1000, tpm=10_000)
            adm = await lim.admit("k", "t", "m", 100, lim_)
            keys, _ = adm._scopes
            argv = [adm.uid, 100, int(lim.window_s * 1e6), int(lim.lease_s * 1e6), 1, -1, 10_000, 2, 1000]
            again = await lim._admit(keys=keys, args=argv)  # the same admission sent again (a lost reply)
            assert int(again[0]) == 1 and int(again[1]) / 1e6 == adm.admitted_ts
            assert _counters(redis_srv.url, lim, "t", "k") == (1, 100)
            await lim.settle(adm, 40)
            await lim._settle_once(adm, 40)
            assert _counters(redis_srv.url, lim, "t", "k") == (0, 40)
            r = redis.Redis.from_url(redis_srv.url)
            assert int(r.get(lim._keys("key", "t", "k")[2]) or 0) == 40  # TPM sum corrected once
            r.close()
        finally:
            await lim.close()

    asyncio.run(go())
