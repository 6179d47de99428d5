"""HealthChecker against servelab's real mock engine processes: ready, killed (connection refused),
stopped (SIGSTOP: the check times out), a non-2xx readiness path, and recovery on the same port."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from urllib.parse import urlparse

import pytest

from servelab.gateway.breaker import CLOSED, HALF_OPEN, OPEN, BreakerBoard, BreakerSettings
from servelab.gateway.health import HealthChecker, health_url
from servelab.gateway.routespec import Backend


def backend(mp, name: str = "m1", kind: str = "mock", **kw) -> Backend:
    return Backend(name, kind, mp.base_url, ("mock",), **kw)


def test_health_urls_by_kind() -> None:
    assert health_url(Backend("a", "llamacpp", "http://h:1/v1/")) == "http://h:1/health"
    assert health_url(Backend("a", "ollama", "http://h:1")) == "http://h:1/"
    assert health_url(Backend("a", "openai", "http://h:1/v1")) == "http://h:1/v1/models"
    assert (
        health_url(Backend("a", "sglang", "http://h:1", health_path="health_generate")) == "http://h:1/health_generate"
    )
    with pytest.raises(ValueError, match="set health_path"):
        health_url(Backend("a", "triton", "http://h:1"))
    with pytest.raises(ValueError, match="interval_s"):
        HealthChecker([], BreakerBoard(), interval_s=0)


def test_ready_engine_passes_and_a_bad_path_fails_without_opening_others(mock_engine) -> None:
    mp = mock_engine("--dialect", "llamacpp")

    async def main() -> None:
        board = BreakerBoard()
        hc = HealthChecker(
            [backend(mp, "good", "llamacpp"), backend(mp, "bad", health_path="/no-such-path")], board, timeout_s=5
        )
        try:
            assert await hc.check_all() == {"good": True, "bad": False}
        finally:
            await hc.close()
        assert hc.status["good"].up is True and hc.status["good"].status_code == 200
        assert hc.status["bad"].up is False and hc.status["bad"].detail == "http 404"
        assert board.get("good").state == CLOSED
        assert board.get("bad").state == OPEN and board.get("bad").open_reason == "health"
        assert hc.is_up("good") and not hc.is_up("bad") and hc.is_up("never-checked")

    asyncio.run(main())


def test_killed_engine_opens_its_breaker_within_one_second_and_recovers(mock_engine) -> None:
    mp = mock_engine()
    port = urlparse(mp.base_url).port
    changes: list[tuple[str, bool | None]] = []

    async def main() -> dict[str, float]:
        board = BreakerBoard(BreakerSettings(open_s=30))
        hc = HealthChecker(
            [backend(mp)], board, interval_s=0.2, timeout_s=1.0, on_change=lambda n, s: changes.append((n, s.up))
        )
        await hc.start()
        try:
            while hc.status["m1"].up is not True:
                await asyncio.sleep(0.02)
            t_kill = time.monotonic()
            mp.proc.kill()  # SIGKILL: the engine is gone, connections are refused
            await asyncio.get_running_loop().run_in_executor(None, mp.proc.wait)
            while board.get("m1").state != OPEN:
                assert time.monotonic() - t_kill < 5, "breaker never opened"
                await asyncio.sleep(0.01)
            open_after_s = time.monotonic() - t_kill
            assert hc.status["m1"].detail == "connect"
            # the engine comes back on the same port: the breaker lets probes through long before open_s
            mock_engine("--port", str(port))
            t_back = time.monotonic()
            while board.get("m1").state != HALF_OPEN:
                assert time.monotonic() - t_back < 5, "breaker did not go half-open after recovery"
                await asyncio.sleep(0.01)
            recover_s = time.monotonic() - t_back
            br = board.get("m1")
            assert br.allow()
            br.on_success()
            assert br.state == CLOSED
            return {"open_after_s": open_after_s, "recover_s": recover_s}
        finally:
            await hc.close()

    res = asyncio.run(main())
    print(
        f"breaker open {res['open_after_s'] * 1000:.0f} ms after SIGKILL; "
        f"half-open {res['recover_s'] * 1000:.0f} ms after restart"
    )
    assert res["open_after_s"] < 1.0
    assert ("m1", False) in changes and changes[-1] == ("m1", True)


def test_stopped_engine_times_out(mock_engine) -> None:
    mp = mock_engine()

    async def main() -> None:
        board = BreakerBoard()
        hc = HealthChecker([backend(mp)], board, timeout_s=0.5)
        try:
            assert await hc.check_once("m1")
            os.kill(mp.proc.pid, signal.SIGSTOP)  # alive but not answering (a wedged engine)
            try:
                t0 = time.monotonic()
                assert not await hc.check_once("m1")
                took = time.monotonic() - t0
            finally:
                os.kill(mp.proc.pid, signal.SIGCONT)
            assert 0.4 < took < 3
            assert hc.status["m1"].detail.startswith("timeout") and board.get("m1").state == OPEN
            assert await hc.check_once("m1")
            assert board.get("m1").state == HALF_OPEN
        finally:
            await hc.close()

    asyncio.run(main())


def test_fall_and_rise_thresholds(mock_engine) -> None:
    mp = mock_engine()

    async def main() -> None:
        board = BreakerBoard()
        good = backend(mp)
        bad = Backend("m1", "mock", good.base_url, health_path="/missing")
        hc = HealthChecker([bad], board, fall=2, rise=2)
        try:
            assert not await hc.check_once("m1")
            assert hc.status["m1"].up is None and board.get("m1").state == CLOSED  # one failure < fall
            assert not await hc.check_once("m1")
            assert hc.status["m1"].up is False and board.get("m1").state == OPEN
            hc.urls["m1"] = health_url(good)
            assert await hc.check_once("m1")
            assert hc.status["m1"].up is False  # one pass < rise
            assert await hc.check_once("m1")
            assert hc.status["m1"].up is True and board.get("m1").state == HALF_OPEN
        finally:
            await hc.close()

    asyncio.run(main())
