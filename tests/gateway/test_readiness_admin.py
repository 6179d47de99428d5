"""Issue 9, defect 8 (parts): ``/health`` says whether the replica can serve (real Redis stopped -> 503
with the reason; real PostgreSQL stopped -> the ledger is reported unusable), ``/health/live`` stays 200;
the admin API answers OpenAI-shaped JSON when PostgreSQL is down (was aiohttp's plain-text 500) and
validates its input like the config (``limits.rpm: 0``, ``since_ts=nan`` were accepted)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from typing import Any

import aiohttp
import orjson
import pytest
from conftest import ADMIN_TOKEN, gateway_key
from gateway.test_admin import TOKEN, admin_server, call
from gateway.test_server import post
from services import PG_VERSION, postgres_cluster, redis_server


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_ADMIN_TOKEN", TOKEN)  # the in-process admin app's credential (test_admin)


def _cfg(entry: dict[str, str], **over: Any) -> dict[str, Any]:
    return {
        "backends": [{"name": "b", "kind": "mock", "base_url": "http://127.0.0.1:9", "models": ["m"]}],
        "models": {"m": {"targets": [{"backend": "b"}]}},
        "tenants": {"t": {}},
        "keys": [entry],
        "health": {"enabled": False},
        **over,
    }


def _health(gw: Any) -> tuple[int, dict[str, Any]]:
    st, _, raw = post(gw.root + "/health", None)
    return st, orjson.loads(raw)


def _wait_health(gw: Any, status: int, timeout_s: float = 8.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        st, body = _health(gw)
        if st == status or time.monotonic() > deadline:
            assert st == status, body
            return body
        time.sleep(0.2)


def _admin(gw: Any, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], dict[str, Any]]:
    st, h, raw = post(gw.admin_url + path, body, ADMIN_TOKEN, method=method)
    return st, h, orjson.loads(raw)  # always JSON


def test_health_is_503_while_redis_is_down(gateway: Any) -> None:
    _, entry = gateway_key("k1", "t")
    with redis_server() as r:
        gw = gateway(_cfg(entry, state={"redis_url": r.url}))
        body = _wait_health(gw, 200)
        assert body["status"] == "ok" and body["checks"]["redis"] == "ok" and body["checks"]["ledger"] == "ok"
        r.stop()
        body = _wait_health(gw, 503)
        assert body["status"] == "unavailable" and any("Redis" in x for x in body["reasons"]), body
        assert "127.0.0.1" not in orjson.dumps(body).decode()  # the public probe names no address
        st, _, raw = post(gw.root + "/health/live", None)
        assert st == 200 and orjson.loads(raw)["status"] == "alive"
    assert gw.stderr().count("health: Redis does not answer PING") == 1  # logged once, not per probe


def _pg(cluster: Any, action: str) -> None:
    subprocess.run(
        ["pg_ctlcluster", PG_VERSION, cluster.name, action, *(["-m", "fast"] if action == "stop" else [])],
        capture_output=True,
        timeout=60,
        check=True,
    )


def test_admin_answers_json_and_health_reports_the_ledger_when_postgres_is_down(gateway: Any) -> None:
    _, entry = gateway_key("k1", "t")
    with postgres_cluster() as pg:
        gw = gateway(_cfg(entry, ledger={"postgres_dsn": pg.dsn}))
        st, _, made = _admin(gw, "POST", "/admin/keys", {"tenant": "t"})
        assert st == 201, made
        _pg(pg, "stop")
        try:
            for method, path, body in (
                ("POST", "/admin/keys", {"tenant": "t"}),
                ("GET", "/admin/usage", None),
                ("DELETE", f"/admin/keys/{made['key_id']}", {}),
            ):
                st, h, out = _admin(gw, method, path, body)
                assert st == 503 and out["error"]["code"] == "database_unavailable", (path, st, out)
                assert h.get("Content-Type", "").startswith("application/json") and "Retry-After" in h
            body = _wait_health(gw, 200)
            deadline = time.monotonic() + 8
            while body["status"] != "degraded" and time.monotonic() < deadline:
                time.sleep(0.3)
                body = _health(gw)[1]
            assert body["status"] == "degraded" and body["checks"]["ledger"].startswith("unusable"), body
            lines = gw.stderr().splitlines()
            # ours are one line each (asyncpg's own pool logger prints tracebacks of its reconnects)
            after = [lines[i - 1] for i, x in enumerate(lines) if x.startswith("Traceback") and i]
            assert all("asyncpg" in x for x in after), after
            assert sum("database is unavailable" in x for x in lines) == 3
        finally:
            _pg(pg, "start")


@pytest.mark.parametrize(
    "limits, word",
    [
        ({"rpm": 0}, "limits.rpm"),
        ({"tpm": -5}, "limits.tpm"),
        ({"rpm": "60"}, "limits.rpm"),
        ({"max_concurrency": True}, "limits.max_concurrency"),
        ({"token_budget": 1.5}, "limits.token_budget"),
        ({"rps": 3}, "limits.rps"),
    ],
)
def test_admin_limits_are_validated_like_the_config(tmp_path: Any, limits: dict[str, Any], word: str) -> None:
    async def go() -> None:
        async with admin_server(tmp_path) as (base, ks, _), aiohttp.ClientSession() as s:
            st, body, _ = await call(s, "POST", base + "/admin/keys", json={"tenant": "ta", "limits": limits})
            assert st == 400 and word in body["error"]["message"] and body["error"]["param"] == "limits", body
            assert ks.list() == []
            st, body, _ = await call(s, "POST", base + "/admin/keys", json={"tenant": "ta", "limits": {"rpm": 1}})
            assert st == 201, body

    asyncio.run(go())


def test_admin_usage_times_and_unknown_paths(tmp_path: Any) -> None:
    async def go() -> None:
        async with admin_server(tmp_path) as (base, _, _), aiohttp.ClientSession() as s:
            for q in (
                "since_ts=nan",
                "since_ts=inf",
                "until_ts=-inf",
                "since_ts=-1",
                "since_ts=abc",
                "since_ts=20&until_ts=10",
            ):
                st, body, _ = await call(s, "GET", base + "/admin/usage?" + q)
                assert st == 400 and body["error"]["code"] == "bad_query", (q, body)
            st, body, _ = await call(s, "GET", base + "/admin/usage?since_ts=0&until_ts=10")
            assert st == 200 and body == {"totals": []}
            st, body, _ = await call(s, "GET", base + "/admin/nothing")
            assert st == 404 and body["error"]["code"] == "unknown_path"
            st, body, _ = await call(s, "PUT", base + "/admin/reload")
            assert st == 405 and body["error"]["code"] == "method_not_allowed"

    asyncio.run(go())
