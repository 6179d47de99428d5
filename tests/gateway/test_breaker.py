"""Circuit breaker state machine (fake clock), retry budget, backoff, and the open state shared by two
gateway replicas through a real redis-server started on a free port."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator

import pytest
from services import free_port, redis_server

from servelab.gateway.breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    BreakerBoard,
    BreakerSettings,
    CircuitBreaker,
    RetryBudget,
    backoff_s,
)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def mk(**kw) -> tuple[CircuitBreaker, Clock]:
    c = Clock()
    return CircuitBreaker("b", BreakerSettings(**kw), clock=c), c


def fail(br: CircuitBreaker, n: int = 1) -> None:
    for _ in range(n):
        assert br.allow()
        br.on_failure()


def ok(br: CircuitBreaker, n: int = 1) -> None:
    for _ in range(n):
        assert br.allow()
        br.on_success()


# ------------------------------------------------------------------ state machine
def test_opens_after_n_consecutive_failures_and_a_success_resets_the_count() -> None:
    br, _ = mk(consecutive_failures=3, min_requests=100)
    fail(br, 2)
    ok(br)
    fail(br, 2)
    assert br.state == CLOSED
    fail(br)
    assert br.state == OPEN and br.open_reason == "consecutive"
    assert not br.allow() and not br.available()


def test_error_rate_over_window_needs_min_requests_and_forgets_old_events() -> None:
    br, c = mk(consecutive_failures=100, error_rate=0.5, window_s=10, min_requests=10)
    for _ in range(4):  # 8 requests, 4 failed: 50 % but below min_requests
        ok(br)
        fail(br)
    assert br.state == CLOSED
    c.t += 11  # the window forgets them
    for _ in range(4):
        ok(br)
        fail(br)
    ok(br)
    assert br.state == CLOSED  # 9 requests in the window
    fail(br)  # 10 requests, 5 failed -> 50 %
    assert br.state == OPEN and br.open_reason == "error_rate"


def test_error_rate_below_threshold_stays_closed() -> None:
    br, c = mk(consecutive_failures=100, error_rate=0.5, window_s=10, min_requests=10)
    for _ in range(100):
        c.t += 0.05
        ok(br, 2)
        fail(br)  # 33 %
    assert br.state == CLOSED


def test_open_then_half_open_probes_limited_success_closes() -> None:
    br, c = mk(consecutive_failures=1, open_s=5, half_open_probes=2, half_open_successes=2)
    fail(br)
    assert br.state == OPEN and 4.99 < br.open_remaining_s <= 5
    c.t += 4.9
    assert not br.allow()
    c.t += 0.2
    assert br.state == HALF_OPEN
    assert br.allow() and br.allow() and not br.allow()  # two probes at a time
    br.on_success()
    assert br.state == HALF_OPEN
    assert br.allow()
    br.on_neutral()  # a probe that said nothing frees its slot
    assert br.allow()
    br.on_success()
    assert br.state == CLOSED
    ok(br, 3)


def test_half_open_failure_reopens_for_a_full_period() -> None:
    br, c = mk(consecutive_failures=1, open_s=5)
    fail(br)
    c.t += 5
    assert br.allow()
    br.on_failure()
    assert br.state == OPEN and br.open_reason == "probe"
    c.t += 4.9
    assert br.state == OPEN


def test_force_open_extends_and_health_up_lets_probes_in() -> None:
    br, c = mk(open_s=5)
    br.force_open("health")
    c.t += 3
    br.force_open("health")
    assert br.open_remaining_s == pytest.approx(5)
    br.health_up()
    assert br.state == HALF_OPEN
    # health_up does not cut short an opening caused by real traffic failures
    br2, _ = mk(consecutive_failures=1)
    fail(br2)
    br2.health_up()
    assert br2.state == OPEN


def test_late_outcomes_of_requests_admitted_before_opening_change_nothing() -> None:
    br, c = mk(consecutive_failures=2, open_s=5)
    assert br.allow() and br.allow() and br.allow()
    br.on_failure()
    br.on_failure()
    assert br.state == OPEN
    until = br.open_remaining_s
    br.on_failure()
    br.on_success()
    assert br.state == OPEN and br.open_remaining_s == until


def test_reconfigure_keeps_state_and_applies_new_thresholds() -> None:
    c = Clock()
    board = BreakerBoard(BreakerSettings(consecutive_failures=5), clock=c)
    fail(board.get("a"), 2)
    board.get("b").force_open("health")
    board.reconfigure(BreakerSettings(consecutive_failures=3))
    assert board.get("b").state == OPEN and board.get("a").state == CLOSED
    fail(board.get("a"))  # third in a row: opens under the new threshold
    assert board.get("a").state == OPEN
    assert board.snapshot()["a"]["open_reason"] == "consecutive"


@pytest.mark.parametrize(
    "kw",
    [dict(consecutive_failures=0), dict(error_rate=0), dict(error_rate=1.5), dict(open_s=0), dict(half_open_probes=0)],
)
def test_bad_settings_raise(kw: dict) -> None:
    with pytest.raises(ValueError):
        BreakerSettings(**kw)


# ------------------------------------------------------------------ retry budget and backoff
def test_retry_budget_is_ratio_of_recent_requests_plus_floor() -> None:
    c = Clock()
    b = RetryBudget(ratio=0.2, min_retries=3, window_s=10, clock=c)
    assert sum(b.try_retry() for _ in range(10)) == 3  # floor only
    c.t += 11
    for _ in range(100):
        b.record_request()
    assert b.remaining() == 23
    assert sum(b.try_retry() for _ in range(50)) == 23
    c.t += 5  # still in the window
    assert not b.try_retry()
    c.t += 6  # requests and retries expired together
    assert b.remaining() == 3


def test_backoff_full_jitter_bounds_and_spread() -> None:
    rng = random.Random(7)
    xs = [backoff_s(3, base_s=0.1, cap_s=10, rng=rng) for _ in range(4000)]
    assert min(xs) >= 0 and max(xs) <= 0.4
    assert 0.18 < sum(xs) / len(xs) < 0.22  # uniform(0, 0.4): mean 0.2
    assert max(backoff_s(50, base_s=0.1, cap_s=2.0, rng=rng) for _ in range(200)) <= 2.0
    with pytest.raises(ValueError):
        backoff_s(0)


# ------------------------------------------------------------------ shared state through real Redis
@pytest.fixture(scope="module")
def redis_port() -> Iterator[int]:
    with redis_server() as r:
        yield r.port


async def _boards(port: int, open_s: float, prefix: str) -> tuple[BreakerBoard, BreakerBoard, object, object]:
    import redis.asyncio as aioredis

    ra = aioredis.Redis(host="127.0.0.1", port=port)
    rb = aioredis.Redis(host="127.0.0.1", port=port)
    s = BreakerSettings(consecutive_failures=2, open_s=open_s)
    return (
        BreakerBoard(s, redis=ra, prefix=prefix, sync_interval_s=0.05),
        BreakerBoard(s, redis=rb, prefix=prefix, sync_interval_s=0.05),
        ra,
        rb,
    )


def test_open_state_is_shared_between_replicas_and_expires_by_itself(redis_port: int) -> None:
    async def main() -> dict[str, float]:
        a, b, ra, rb = await _boards(redis_port, open_s=1.5, prefix="t1")
        b.get("llama-a")
        await b.start()
        try:
            t0 = time.monotonic()
            fail(a.get("llama-a"), 2)  # replica A sees two failures in a row
            assert a.get("llama-a").state == OPEN
            while b.get("llama-a").state != OPEN:
                assert time.monotonic() - t0 < 2, "replica B never saw the open breaker"
                await asyncio.sleep(0.01)
            seen_s = time.monotonic() - t0
            assert b.get("llama-a").open_reason == "shared"
            assert 0.5 < b.get("llama-a").open_remaining_s <= 1.5
            ttl_ms = await ra.pttl(a.key("llama-a"))
            assert 0 < ttl_ms <= 1500
            # the first opener's period stands (SET NX)
            assert not await b.publish_open("llama-a", 60)
            # B's own open state was not re-published with a new period
            assert await ra.pttl(a.key("llama-a")) <= ttl_ms
            await asyncio.sleep(1.7)
            assert await ra.exists(a.key("llama-a")) == 0
            assert b.get("llama-a").state == HALF_OPEN and a.get("llama-a").state == HALF_OPEN
            return {"seen_s": seen_s}
        finally:
            await a.close(), await b.close()
            await ra.aclose(), await rb.aclose()

    res = asyncio.run(main())
    assert res["seen_s"] < 0.5  # sync every 50 ms; generous margin for a busy box


def test_redis_down_keeps_local_breakers_working(caplog: pytest.LogCaptureFixture) -> None:
    import redis.asyncio as aioredis

    async def main() -> None:
        r = aioredis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5)
        board = BreakerBoard(BreakerSettings(consecutive_failures=1), redis=r)
        fail(board.get("x"))
        assert board.get("x").state == OPEN
        await board.close()  # waits for the failed publication
        await r.aclose()

    asyncio.run(main())
    assert "could not share the open state" in caplog.text
