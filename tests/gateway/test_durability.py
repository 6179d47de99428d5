"""Usage survives what an unlucky operator does to the gateway (issue 9, defect 7): kill -9 mid-stream,
PostgreSQL down at SIGTERM, a restart, a Redis without persistence.

Everything runs through real ``servelab gateway`` processes over ``servelab mock-engine`` (streams slow
enough to be in flight), with SQLite, a real PostgreSQL 15 and a real Redis (tests/services.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from conftest import ADMIN_TOKEN, GatewayProcess, gateway_key, start_gateway, stop_gateway
from services import PG_VERSION, _wait_port, postgres_cluster, redis_server

PROMPT = [{"role": "user", "content": "tell me a long story about durable ledgers"}]
_LEFT = re.compile(r"\((\d+) tokens\) (?:has (\d+) tokens left|is used up)")


def _config(eng_root: str, entry: dict[str, str], tenant: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "backends": [{"name": "b", "kind": "mock", "base_url": eng_root, "models": ["m"]}],
        "models": {"m": {"targets": [{"backend": "b"}]}},
        "tenants": {"t": tenant},
        "keys": [entry],
        **extra,
    }


def _usage(gw: GatewayProcess, group_by: str = "outcome") -> dict[Any, dict[str, Any]]:
    req = urllib.request.Request(
        f"{gw.admin_url}/admin/usage?group_by={group_by}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return {t[group_by]: t for t in orjson.loads(r.read())["totals"]}


async def _chat(s: aiohttp.ClientSession, gw: GatewayProcess, key: str, max_tokens: int) -> tuple[int, dict[str, Any]]:
    async with s.post(
        f"{gw.url}/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "m", "messages": PROMPT, "max_tokens": max_tokens},
    ) as r:
        return r.status, await r.json()


def _finished(gw: GatewayProcess, key: str, n: int, max_tokens: int) -> tuple[int, int]:
    """``n`` non-streamed requests; returns (total tokens the engine reported, prompt tokens of one)."""

    async def go() -> list[dict[str, Any]]:
        async with aiohttp.ClientSession() as s:
            out = []
            for _ in range(n):
                st, body = await _chat(s, gw, key, max_tokens)
                assert st == 200, body
                out.append(body["usage"])
            return out

    usages = asyncio.run(go())
    return sum(u["total_tokens"] for u in usages), usages[0]["prompt_tokens"]


def _probe_spend(gw: GatewayProcess, key: str, budget: int, max_tokens: int) -> int:
    """Send one request that the budget must refuse; return the spend the 429 reveals (budget - left)."""

    async def go() -> tuple[int, dict[str, Any]]:
        async with aiohttp.ClientSession() as s:
            return await _chat(s, gw, key, max_tokens)

    st, body = asyncio.run(go())
    assert st == 429, f"the budget forgot the spend before the restart: got {st} {body}"
    assert body["error"]["code"] == "insufficient_quota", body
    m = _LEFT.search(body["error"]["message"])
    assert m and int(m.group(1)) == budget, body
    return budget - int(m.group(2)) if m.group(2) else budget


@pytest.fixture(scope="module")
def pg_dsn() -> Any:
    with postgres_cluster() as pg:
        yield pg.dsn


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_kill9_mid_stream_leaves_incomplete_rows_and_budget_counts_them(
    tmp_path: Path, mock_engine, store: str, request: pytest.FixtureRequest
) -> None:
    eng = mock_engine("--dialect", "vllm", "--itl-ms", "50", "--output-tokens", "400")
    key, entry = gateway_key("k1", "t")
    folder = tmp_path / "gw"
    # PostgreSQL: the module's cluster (only this test writes to it)
    ledger = {"ledger": {"postgres_dsn": request.getfixturevalue("pg_dsn")}} if store == "postgres" else {}
    cfg = _config(eng.root, entry, {"token_budget": 10**9}, **ledger)
    gw = start_gateway(cfg, folder)
    n_streams, n_done = 6, 4
    try:
        done_tokens, prompt_tokens = _finished(gw, key, n_done, 5)
        received = [0] * n_streams

        async def stream(i: int, s: aiohttp.ClientSession) -> None:
            async with s.post(
                f"{gw.url}/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={"model": "m", "messages": PROMPT, "max_tokens": 400, "stream": True},
            ) as r:
                assert r.status == 200
                with contextlib.suppress(aiohttp.ClientError):  # the gateway dies under the stream
                    async for line in r.content:
                        if line.startswith(b"data: {") and b'"content"' in line:
                            received[i] += 1

        async def run() -> None:
            async with aiohttp.ClientSession() as s:
                tasks = [asyncio.create_task(stream(i, s)) for i in range(n_streams)]
                deadline = time.monotonic() + 30
                while min(received) < 30 and time.monotonic() < deadline:  # >= 1.5 s in flight: progress written
                    await asyncio.sleep(0.05)
                assert min(received) >= 30, received
                gw.proc.send_signal(signal.SIGKILL)
                gw.proc.wait(10)
                await asyncio.gather(*tasks)

        asyncio.run(run())
    finally:
        stop_gateway(gw.proc)
    served = done_tokens + sum(prompt_tokens + c for c in received)  # every token served before the kill

    budget, probe_max = served + 100, 300  # after the restart: refused iff the spend >= served - ~200
    gw2 = start_gateway(_config(eng.root, entry, {"token_budget": budget}, **ledger), folder)
    try:
        rows = _usage(gw2)
        assert rows["ok"]["requests"] == n_done, rows
        assert "incomplete" in rows, f"the {n_streams} streams in flight at kill -9 left no ledger row: {rows}"
        inc = rows["incomplete"]
        assert inc["requests"] == n_streams, rows
        assert inc["reserved_tokens"] >= n_streams * 400, inc
        # served-so-far from the journal's progress lines: known, and never more than what was received
        assert 0 < inc["completion_tokens"] <= n_streams * 400, (inc, received)
        spend = _probe_spend(gw2, key, budget, probe_max)
        assert spend >= served, (spend, served)
        assert f"{n_streams} of them incomplete" in gw2.stderr(), gw2.stderr()  # the replay's log line
    finally:
        stop_gateway(gw2.proc)


def _pg(cluster: Any, action: str) -> None:
    fast = ["-m", "fast"] if action == "stop" else []
    r = subprocess.run(
        ["pg_ctlcluster", PG_VERSION, cluster.name, action, *fast], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    if action == "start":
        assert _wait_port(cluster.port, 30)


def test_postgres_down_at_sigterm_spools_rows_and_replays_them(tmp_path: Path, mock_engine) -> None:
    eng = mock_engine("--dialect", "vllm")
    key, entry = gateway_key("k1", "t")
    folder = tmp_path / "gw"
    spool = folder / "gateway-usage.spool"  # the default: next to the config file
    with postgres_cluster() as pg:
        cfg = _config(eng.root, entry, {}, ledger={"postgres_dsn": pg.dsn})
        gw = start_gateway(cfg, folder)
        try:
            _pg(pg, "stop")
            _finished(gw, key, 20, 4)
            gw.proc.send_signal(signal.SIGTERM)
            assert gw.proc.wait(30) == 0
        finally:
            stop_gateway(gw.proc)
        err = gw.stderr()
        assert "not written at close" not in err, err
        _pg(pg, "start")
        gw2 = start_gateway(cfg, folder)
        try:
            rows = _usage(gw2)
            assert rows.get("ok", {}).get("requests") == 20, f"usage rows lost while PostgreSQL was down: {rows}"
        finally:
            stop_gateway(gw2.proc)
        assert f"20 usage rows spooled in {spool}" in err, err  # one line: how many, and where
        assert list(spool.glob("seg-*")) == []  # replayed and cleaned up at the second close


def test_spool_path_is_configurable_and_a_bad_one_is_one_line(tmp_path: Path, mock_engine) -> None:
    eng = mock_engine("--dialect", "vllm")
    key, entry = gateway_key("k1", "t")
    cfg = _config(eng.root, entry, {}, ledger={"sqlite_path": "u.db", "spool_path": "wal"})
    gw = start_gateway(cfg, tmp_path / "ok")
    try:
        assert (tmp_path / "ok" / "wal").is_dir() and len(list((tmp_path / "ok" / "wal").glob("seg-*.jsonl"))) == 1
    finally:
        stop_gateway(gw.proc)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(RuntimeError) as e:
        start_gateway(
            _config(eng.root, entry, {}, ledger={"sqlite_path": "u.db", "spool_path": str(blocker)}), tmp_path / "bad"
        )
    err = (tmp_path / "bad" / "gateway.stderr").read_text().strip()
    assert err.startswith("servelab: error: ") and err.count("\n") == 0 and "Traceback" not in err, err
    assert f"ledger.spool_path: cannot use {blocker}" in err, (err, e.value)


@pytest.mark.parametrize("state", ["sqlite", "redis_flushed"])
def test_token_budget_survives_restart(tmp_path: Path, mock_engine, state: str) -> None:
    eng = mock_engine("--dialect", "vllm")
    key, entry = gateway_key("k1", "t")
    folder = tmp_path / "gw"
    with redis_server() as rs:
        extra = {"state": {"redis_url": rs.url}} if state == "redis_flushed" else {}

        # SQLite: the key's own budget (memory limiter); Redis: the tenant's shared budget (tenant scope)
        def tenant(b: int) -> dict[str, Any]:
            return {"token_budget": b} if state == "sqlite" else {"shared_limits": {"token_budget": b}}

        gw = start_gateway(_config(eng.root, entry, tenant(10**9), **extra), folder)
        try:
            spent, _ = _finished(gw, key, 6, 20)
        finally:
            stop_gateway(gw.proc)
        assert gw.proc.returncode == 0
        if state == "redis_flushed":
            import redis

            redis.Redis.from_url(rs.url).flushall()
        budget = spent + 50
        gw2 = start_gateway(_config(eng.root, entry, tenant(budget), **extra), folder)
        try:
            assert _probe_spend(gw2, key, budget, 100) == spent
        finally:
            stop_gateway(gw2.proc)


@pytest.mark.parametrize("scope", ["key", "tenant"])
def test_redis_flushed_while_running_keeps_budget(tmp_path: Path, mock_engine, scope: str) -> None:
    """Break-it report on 4b30bb7, defect 2: ``redis-cli flushall`` while the gateway runs reset every
    budget (budget 350 refused after 330, then 850 tokens served). The gateway now finds its tenant's
    seeded marker gone and seeds the counters again from the ledger before admitting."""
    import redis

    eng = mock_engine("--dialect", "vllm")
    key, entry = gateway_key("k1", "t")
    with redis_server() as rs:
        budget = 3000
        lim = {"token_budget": budget} if scope == "key" else {"shared_limits": {"token_budget": budget}}
        gw = start_gateway(_config(eng.root, entry, lim, state={"redis_url": rs.url}), tmp_path / "gw")
        try:
            spent, _ = _finished(gw, key, 5, 20)
            time.sleep(0.6)  # the settles and the SQLite writer
            redis.Redis.from_url(rs.url).flushall()
            # the 429 of a request reserving more than is left reveals the spend the counter holds
            assert _probe_spend(gw, key, budget, 4000) == spent
            spent2, _ = _finished(gw, key, 2, 20)
            time.sleep(0.6)
            redis.Redis.from_url(rs.url).flushall()
            assert _probe_spend(gw, key, budget, 4000) == spent + spent2
        finally:
            stop_gateway(gw.proc)
        assert "seeded again from the ledger" in gw.stderr()


def test_postgres_outage_is_one_line_and_a_summary(tmp_path: Path, mock_engine) -> None:
    """Break-it report on 4b30bb7 (lesser): while PostgreSQL was down the gateway logged "PostgreSQL write
    failed" every 0.2 s plus asyncpg tracebacks. Now one line per outage, and one when it is back."""
    eng = mock_engine("--dialect", "vllm")
    key, entry = gateway_key("k1", "t")
    with postgres_cluster() as pg:
        gw = start_gateway(_config(eng.root, entry, {}, ledger={"postgres_dsn": pg.dsn}), tmp_path / "gw")
        try:
            _pg(pg, "stop")
            _finished(gw, key, 5, 4)
            time.sleep(3)  # ~15 flush attempts
            _pg(pg, "start")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and "PostgreSQL is back" not in gw.stderr():
                time.sleep(0.3)
            assert _usage(gw).get("ok", {}).get("requests") == 5
        finally:
            stop_gateway(gw.proc)
    err = gw.stderr()
    assert err.count("PostgreSQL write failed") == 1 and "PostgreSQL is back after" in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]


def _get(url: str, key: str | None = None) -> tuple[int, dict[str, str], dict[str, Any]]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), orjson.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), orjson.loads(e.read())


def test_gateway_starts_while_postgres_is_down_and_serves_once_it_is_back(tmp_path: Path, mock_engine) -> None:
    """Issue 9: the gateway refused to start while PostgreSQL was down (a crash loop under an orchestrator).
    Now it starts, is not ready (/health 503 naming the field, requests 503 + Retry-After with nothing
    internal) until the database answers, then serves and writes usage to it."""
    eng = mock_engine("--dialect", "vllm", "--output-tokens", "3")
    key, entry = gateway_key("k1", "t")
    with postgres_cluster() as pg:
        _pg(pg, "stop")
        gw = start_gateway(
            _config(eng.root, entry, {"token_budget": 10_000}, ledger={"postgres_dsn": pg.dsn}), tmp_path / "gw"
        )
        try:
            st, _, health = _get(gw.url.removesuffix("/v1") + "/health")
            assert st == 503 and health["status"] == "unavailable", health
            assert any("ledger.postgres_dsn" in r and "unreachable" in r for r in health["reasons"]), health
            assert _get(gw.url.removesuffix("/v1") + "/health/live")[0] == 200
            req = urllib.request.Request(
                f"{gw.url}/chat/completions",
                data=orjson.dumps({"model": "m", "messages": PROMPT, "max_tokens": 3}),
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            )
            try:
                urllib.request.urlopen(req, timeout=10)
                raise AssertionError("served while the ledger was down at start")
            except urllib.error.HTTPError as e:
                body = e.read()
                assert e.code == 503 and e.headers.get("Retry-After"), (e.code, body)
            err = orjson.loads(body)["error"]
            assert err["code"] == "service_starting", err
            assert str(pg.port) not in err["message"] and "postgres" not in err["message"].lower(), err
            st, _, adm = _get(f"{gw.admin_url}/admin/keys", ADMIN_TOKEN)
            assert st == 503 and adm["error"]["code"] == "database_unavailable", adm
            _pg(pg, "start")
            deadline = time.monotonic() + 30
            while _get(gw.url.removesuffix("/v1") + "/health")[0] != 200:
                assert time.monotonic() < deadline, gw.stderr()
                time.sleep(0.3)
            total, _ = _finished(gw, key, 2, 3)
            assert total > 0
            deadline = time.monotonic() + 10
            while _usage(gw).get("ok", {}).get("requests") != 2:
                assert time.monotonic() < deadline, _usage(gw)
                time.sleep(0.3)
            assert "the gateway starts but answers 503" in gw.stderr() and "gateway is ready" in gw.stderr()
        finally:
            stop_gateway(gw.proc)
