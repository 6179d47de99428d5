"""Limits: RPM/TPM sliding logs, concurrency, token budget, in memory and in a real redis-server; and the
acceptance test: 4 separate processes sharing one Redis never admit more than the limit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest
import redis
from services import redis_server

from servelab.gateway.errors import GatewayError
from servelab.gateway.limits import LimitExceeded, Limits, MemoryLimiter, RedisLimiter


@pytest.fixture(scope="module")
def redis_url():
    with redis_server() as r:
        yield r.url


@pytest.fixture(params=["memory", "redis"])
def make_limiter(request, redis_url):
    """Factory: ``async with make_limiter(window_s) as lim`` -> a fresh limiter of one kind (Redis ones
    with their own key prefix), closed on exit inside the test's event loop."""

    @contextlib.asynccontextmanager
    async def make(window_s: float = 60.0):
        if request.param == "memory":
            lim = MemoryLimiter(window_s=window_s)
        else:
            lim = RedisLimiter(redis_url, window_s=window_s, prefix=f"t{time.monotonic_ns()}")
        try:
            yield lim
        finally:
            await lim.close()

    return make


def run(coro):
    return asyncio.run(coro)


def test_limits_validation_and_merge() -> None:
    with pytest.raises(ValueError, match="rpm"):
        Limits(rpm=-1)
    with pytest.raises(ValueError, match="tpm"):
        Limits(tpm=1.5)  # type: ignore[arg-type]
    base = Limits(rpm=10, tpm=1000, max_concurrency=2)
    assert base.merged(Limits(rpm=3)) == Limits(rpm=3, tpm=1000, max_concurrency=2)
    assert Limits.from_obj({"rpm": 5, "pools": ["x"]}) == Limits(rpm=5)
    assert Limits().unlimited and not base.unlimited


def test_rpm_exact_then_rejects_with_retry_after(make_limiter) -> None:
    async def go():
        async with make_limiter() as lim:
            L = Limits(rpm=5)
            for _ in range(5):
                await lim.settle(await lim.admit("k", "t", "m", 10, L), 10)
            with pytest.raises(LimitExceeded) as ei:
                await lim.admit("k", "t", "m", 10, L)
            e = ei.value
            assert (e.status, e.limit, e.scope, e.type, e.code) == (
                429,
                "rpm",
                "key",
                "requests",
                "rate_limit_exceeded",
            )
            assert "requests per minute (RPM)" in e.message and "limit 5" in e.message
            assert 55.0 < e.retry_after_s <= 60.0  # the oldest of the 5 leaves the window in ~60 s
            assert e.headers()["Retry-After"] == "60"
            assert isinstance(e, GatewayError)
            # another key is independent
            await lim.admit("k2", "t", "m", 10, L)

    run(go())


def test_sliding_window_readmits_after_the_oldest_leaves(make_limiter) -> None:
    async def go():
        async with make_limiter(window_s=1.0) as lim:
            L = Limits(rpm=2)
            await lim.admit("k", "t", "m", 0, L)
            await asyncio.sleep(0.5)
            await lim.admit("k", "t", "m", 0, L)
            with pytest.raises(LimitExceeded):
                await lim.admit("k", "t", "m", 0, L)
            await asyncio.sleep(0.6)  # the first left the window, the second (0.6 s old) is still in
            await lim.admit("k", "t", "m", 0, L)
            with pytest.raises(LimitExceeded) as ei:
                await lim.admit("k", "t", "m", 0, L)
            assert 0.0 < ei.value.retry_after_s <= 0.41  # until the second one leaves (it is >= 0.6 s old)

    run(go())


def test_tpm_reserve_then_settle_corrects_to_actual(make_limiter) -> None:
    async def go():
        async with make_limiter() as lim:
            L = Limits(tpm=1000)
            a = await lim.admit("k", "t", "m", 600, L)
            with pytest.raises(LimitExceeded) as ei:
                await lim.admit("k", "t", "m", 500, L)  # 600 + 500 > 1000
            assert (ei.value.limit, ei.value.type) == ("tpm", "tokens")
            assert "used 600, requested 500" in ei.value.message
            await lim.settle(a, 100)  # only 100 used: 900 free in the window
            b = await lim.admit("k", "t", "m", 850, L)
            with pytest.raises(LimitExceeded):
                await lim.admit("k", "t", "m", 51, L)  # 100 + 850 + 51 > 1000
            await lim.settle(b, 900)  # used more than reserved: 100 + 900 = 1000, nothing left
            with pytest.raises(LimitExceeded):
                await lim.admit("k", "t", "m", 1, L)
            await lim.admit("k", "t", "m", 0, L)
            with pytest.raises(LimitExceeded) as ei:
                await lim.admit("k2", "t", "m", 1001, L)  # can never fit: no retry hint
            assert ei.value.retry_after_s is None and "Request too large" in ei.value.message

    run(go())


def test_concurrency_released_by_settle_and_settle_exactly_once(make_limiter) -> None:
    async def go():
        async with make_limiter() as lim:
            L = Limits(max_concurrency=2)
            a = await lim.admit("k", "t", "m", 1, L)
            b = await lim.admit("k", "t", "m", 1, L)
            with pytest.raises(LimitExceeded) as ei:
                await lim.admit("k", "t", "m", 1, L)
            assert ei.value.limit == "concurrency" and "in flight" in ei.value.message
            await lim.settle(a, 1)
            c = await lim.admit("k", "t", "m", 1, L)
            with pytest.raises(RuntimeError, match="settled twice"):
                await lim.settle(a, 1)
            for x in (b, c):
                await lim.settle(x, 0)
            for _ in range(2):
                await lim.admit("k", "t", "m", 1, L)

    run(go())


def test_budget_exhausted_is_insufficient_quota(make_limiter) -> None:
    async def go():
        async with make_limiter() as lim:
            L = Limits(token_budget=100)
            a = await lim.admit("k", "t", "m", 80, L)
            with pytest.raises(LimitExceeded) as ei:
                await lim.admit("k", "t", "m", 30, L)  # 80 reserved + 30 > 100
            e = ei.value
            assert (e.status, e.limit, e.type, e.code, e.retry_after_s) == (
                429,
                "budget",
                "insufficient_quota",
                "insufficient_quota",
                None,
            )
            assert "20 tokens left" in e.message
            await lim.settle(a, 50)  # refund 30
            await lim.settle(await lim.admit("k", "t", "m", 50, L), 50)
            with pytest.raises(LimitExceeded) as ei:
                await lim.admit("k", "t", "m", 1, L)
            assert "is used up" in ei.value.message

    run(go())


def test_tenant_limits_shared_by_its_keys_atomically(make_limiter) -> None:
    async def go():
        async with make_limiter() as lim:
            key_l, ten_l = Limits(rpm=10), Limits(rpm=3, token_budget=1000)
            await lim.admit("a", "t", "m", 10, key_l, ten_l)
            await lim.admit("b", "t", "m", 10, key_l, ten_l)
            await lim.admit("c", "t", "m", 10, key_l, ten_l)
            with pytest.raises(LimitExceeded) as ei:
                await lim.admit("d", "t", "m", 10, key_l, ten_l)
            assert ei.value.scope == "tenant" and "your team (t)" in ei.value.message
            # the rejected admission reserved nothing in the key scope: key "d" still has all 10 requests
            await lim.admit("d", "other", "m", 10, Limits(rpm=1))
            await lim.admit("d", "t2", "m", 10, key_l, Limits(rpm=100))

    run(go())


def test_unlimited_needs_no_state(redis_url) -> None:
    async def go():
        lim = RedisLimiter("redis://127.0.0.1:1/0")  # nothing listens there: must not be contacted
        a = await lim.admit("k", "t", "m", 10, Limits(), Limits())
        await lim.settle(a, 5)
        with pytest.raises(GatewayError) as ei:  # a limit needs Redis: fail closed, 503
            await lim.admit("k", "t", "m", 10, Limits(rpm=1))
        assert ei.value.status == 503 and ei.value.code == "limits_unavailable"
        await lim.close()

    run(go())


def test_redis_keys_have_ttls_and_time_comes_from_redis(redis_url) -> None:
    async def go():
        lim = RedisLimiter(redis_url, window_s=5.0, lease_s=30.0, prefix="ttl")
        a = await lim.admit("k", "t{x}", "m", 10, Limits(rpm=5, tpm=100, max_concurrency=3, token_budget=1000))
        await lim.close()
        return a

    a = run(go())
    r = redis.Redis.from_url(redis_url)
    keys = sorted(k.decode() for k in r.keys("ttl:*"))
    marker = f"ttl:{{t%7Bx%7D}}:a:{a.uid}"  # the admission's marker: settle deletes it (idempotent settle)
    assert keys == [marker] + [f"ttl:{{t%7Bx%7D}}:k:k:{s}" for s in ("budget", "conc", "rpm", "tpm", "tpm_sum")]
    assert 3635000 - 1000 < r.pttl(marker) <= 3635000  # lease_s + window_s + 1 h
    base = "ttl:{t%7Bx%7D}:k:k:"
    for s in ("rpm", "tpm", "tpm_sum"):
        assert 5000 < r.pttl(base + s) <= 6000
    assert 30000 < r.pttl(base + "conc") <= 31000
    assert r.pttl(base + "budget") == -1  # the budget persists
    sec, usec = r.time()
    assert abs((sec + usec / 1e6) - a.admitted_ts) < 5.0


# ------------------------------------------------------------------ 4 processes, one Redis
_WORKER = textwrap.dedent("""
    import asyncio, random, sys, time, orjson
    from servelab.gateway.limits import LimitExceeded, Limits, RedisLimiter
    url, mode, prefix, start_at, dur_s, window_s, n = sys.argv[1:8]
    start_at, dur_s, window_s, n = float(start_at), float(dur_s), float(window_s), int(n)
    async def main():
        lim = RedisLimiter(url, window_s=window_s, prefix=prefix)
        L = Limits(rpm=n) if mode == "rpm" else Limits(max_concurrency=n)
        got, rejected = [], 0
        await asyncio.sleep(max(0.0, start_at - time.time()))
        end = time.monotonic() + dur_s
        async def hammer():
            nonlocal rejected
            while time.monotonic() < end:
                try:
                    a = await lim.admit("shared", "t", "m", 1, L)
                except LimitExceeded:
                    rejected += 1
                    await asyncio.sleep(0.001 if mode == "rpm" else 0.0005)
                    continue
                if mode == "rpm":
                    got.append([a.admitted_ts, a.admitted_ts])
                    await lim.settle(a, 1)
                else:
                    await asyncio.sleep(random.uniform(0.0, 0.01))
                    got.append([a.admitted_ts, await lim.settle(a, 1)])
        await asyncio.gather(*(hammer() for _ in range(8)))
        await lim.close()
        sys.stdout.write(orjson.dumps({"got": got, "rejected": rejected}).decode())
    asyncio.run(main())
""")


def _run_workers(url: str, mode: str, window_s: float, n: int, dur_s: float, procs: int = 4) -> tuple[list, int]:
    prefix = f"mp{time.monotonic_ns()}"
    start_at = time.time() + 2.0  # all 4 start together, after their imports
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    ps = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, url, mode, prefix, str(start_at), str(dur_s), str(window_s), str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for _ in range(procs)
    ]
    got, rejected = [], 0
    for p in ps:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()[-2000:]
        res = orjson.loads(out)
        got += res["got"]
        rejected += res["rejected"]
    return got, rejected


def test_four_processes_share_one_rpm_limit(redis_url) -> None:
    """rpm=N over one real minute window, 4 processes x 8 tasks hammering for 3 s: exactly N admitted
    (never more: the sliding log is exact on the Redis clock; not fewer: attempts far exceed N)."""
    n = 40
    got, rejected = _run_workers(redis_url, "rpm", 60.0, n, 3.0)
    assert len(got) == n
    assert rejected > n


def test_four_processes_sliding_window_never_exceeds_rpm(redis_url) -> None:
    """Short window (1 s, rpm=N per window) over 3.5 s: in every window (t - 1 s, t] on the Redis clock at
    most N admissions; and the limit is used (>= 3N admitted over 3.5 windows)."""
    n, window_s = 15, 1.0
    got, rejected = _run_workers(redis_url, "rpm", window_s, n, 3.5)
    ts = sorted(t for t, _ in got)
    worst = max(sum(1 for u in ts if t - window_s < u <= t) for t in ts)
    assert worst <= n, worst
    assert worst == n
    assert len(ts) >= 3 * n and rejected > 0


def test_four_processes_share_one_concurrency_limit(redis_url) -> None:
    """max_concurrency=C, 4 processes x 8 tasks holding slots 0-10 ms: the admitted intervals
    [admit, settle] on the Redis clock never overlap more than C deep, and reach C."""
    c = 3
    got, rejected = _run_workers(redis_url, "concurrency", 60.0, c, 2.0)
    events = sorted([(t0, 1) for t0, _ in got] + [(t1, -1) for _, t1 in got], key=lambda e: (e[0], e[1]))
    depth = peak = 0
    for _, d in events:
        depth += d
        peak = max(peak, depth)
    assert peak == c, peak
    assert len(got) > 50 and rejected > 0


# ------------------------------------------------------------------ end to end: 4 gateways, one Redis
def test_four_gateway_processes_share_one_rpm_limit(redis_url, gateway, mock_engine) -> None:
    """4 ``servelab gateway`` processes with ``state.redis_url`` = one redis-server, in front of the mock
    engine, key of a tenant with rpm=N: 6N requests spread over the 4 gateways within a few seconds (one
    RPM window) get exactly N answers 200 and 429s for the rest (``rate_limit_exceeded``, RPM named,
    ``Retry-After``)."""
    import aiohttp
    from conftest import gateway_key

    n = 12
    eng = mock_engine("--dialect", "vllm", "--output-tokens", "2")
    key, entry = gateway_key("k1", "t")
    cfg = {
        "state": {"redis_url": redis_url.replace("/0", "/1")},  # db 1: no keys from the tests above
        "backends": [{"name": "b", "kind": "mock", "base_url": eng.root, "models": ["m"]}],
        "models": {"m": {"targets": [{"backend": "b"}]}},
        "tenants": {"t": {"rpm": n}},
        "keys": [entry],
    }
    gws = [gateway(cfg) for _ in range(4)]

    async def go():
        statuses, bodies, retry_after = [], [], []
        async with aiohttp.ClientSession() as s:

            async def one(i):
                gw = gws[i % 4]
                async with s.post(
                    f"{gw.url}/chat/completions",
                    headers={"Authorization": f"Bearer {key}"},
                    json={"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": f"hi {i}"}]},
                ) as r:
                    statuses.append(r.status)
                    body = orjson.loads(await r.read())
                    if r.status == 429:
                        bodies.append(body["error"])
                        retry_after.append(r.headers.get("Retry-After"))

            await asyncio.gather(*(one(i) for i in range(6 * n)))
        return statuses, bodies, retry_after

    t0 = time.monotonic()
    statuses, bodies, retry_after = asyncio.run(go())
    assert time.monotonic() - t0 < 50  # all inside one minute window
    assert statuses.count(200) == n, statuses
    assert statuses.count(429) == 5 * n
    assert all(b["code"] == "rate_limit_exceeded" and "RPM" in b["message"] for b in bodies)
    assert all(ra is not None and 1 <= int(ra) <= 60 for ra in retry_after)
