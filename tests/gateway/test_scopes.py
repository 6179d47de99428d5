"""Issue 14 item 1: limits scoped by application (bound to the key), model and client IP, shared through a
real redis-server by 2 ``servelab gateway`` replicas: exactly the configured number answered per scope,
OpenAI-shaped 429s with Retry-After and a message naming the scope; a spoofed X-Forwarded-For from an
untrusted peer never changes the IP counted; behind a trusted proxy the rightmost untrusted hop counts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest
from conftest import gateway_key
from services import redis_server

from servelab.gateway.clientip import client_ip, trusted_networks

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as r:
        yield r.url


def _send(gws: list[Any], plan: list[tuple[str, str, dict[str, str]]]) -> list[tuple[int, dict[str, Any], Any]]:
    """All requests of ``plan`` ((key, model, headers)) at once, spread over ``gws``; (status, body, Retry-After)."""

    async def go() -> list[tuple[int, dict[str, Any], Any]]:
        async with aiohttp.ClientSession() as s:

            async def one(i: int, key: str, model: str, headers: dict[str, str]) -> tuple[int, dict[str, Any], Any]:
                async with s.post(
                    gws[i % len(gws)].url + "/chat/completions",
                    json={"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": f"hi {i}"}]},
                    headers={"Authorization": f"Bearer {key}", **headers},
                ) as r:
                    return r.status, orjson.loads(await r.read()), r.headers.get("Retry-After")

            return list(await asyncio.gather(*(one(i, *p) for i, p in enumerate(plan))))

    return asyncio.run(go())


def _ok(results: list[tuple[int, dict[str, Any], Any]]) -> int:
    return sum(st == 200 for st, _, _ in results)


def _config(redis: str, eng: Any, entries: list[dict[str, Any]], trusted: list[str]) -> dict[str, Any]:
    return {
        "state": {"redis_url": redis},
        "server": {"trusted_proxies": trusted},
        "backends": [{"name": "b", "kind": "mock", "base_url": eng.root, "models": ["m"]}],
        "models": {"m": {"targets": [{"backend": "b"}]}, "m2": {"targets": [{"backend": "b"}]}},
        "tenants": {
            "apps": {"application_limits": {"web": {"rpm": 4}}},
            "models": {"model_limits": {"m2": {"rpm": 3}}},
            "ips": {"ip_limits": {"rpm": 3}},
        },
        "keys": entries,
        "health": {"enabled": False},
    }


def test_application_model_and_ip_scopes_across_two_replicas(redis_url: str, gateway: Any, mock_engine: Any) -> None:
    eng = mock_engine("--dialect", "vllm", "--output-tokens", "2")
    keys: dict[str, str] = {}
    entries = []
    for kid, tenant, app in (
        ("a1", "apps", "web"),
        ("a2", "apps", "web"),
        ("a3", "apps", "batch"),
        ("m1", "models", None),
        ("i1", "ips", None),
        ("i2", "ips", None),
    ):
        keys[kid], entry = gateway_key(kid, tenant)
        if app:
            entry["application"] = app
        entries.append(entry)
    untrusted = [gateway(_config(redis_url.replace("/0", "/2"), eng, entries, ["10.0.0.0/8"])) for _ in range(2)]
    # application "web" (keys a1 and a2 together): 4 of 12; application "batch" is not limited
    res = _send(untrusted, [(keys["a1" if i % 2 else "a2"], "m", {}) for i in range(12)])
    assert _ok(res) == 4, res
    busy = [(b, ra) for st, b, ra in res if st == 429]
    assert all(
        b["error"]["code"] == "rate_limit_exceeded"
        and "your application (web)" in b["error"]["message"]
        and ra is not None
        and 1 <= int(ra) <= 60
        for b, ra in busy
    ), busy
    assert _ok(_send(untrusted, [(keys["a3"], "m", {})] * 5)) == 5
    # model m2 for tenant "models": 3 of 10; model m is not limited
    res = _send(untrusted, [(keys["m1"], "m2", {})] * 10)
    assert _ok(res) == 3 and all("the model m2" in b["error"]["message"] for st, b, _ in res if st == 429), res
    assert _ok(_send(untrusted, [(keys["m1"], "m", {})] * 5)) == 5
    # client IP, peer 127.0.0.1 not a trusted proxy: every spoofed X-Forwarded-For counts as 127.0.0.1
    res = _send(
        untrusted, [(keys["i1" if i % 2 else "i2"], "m", {"X-Forwarded-For": f"198.51.100.{i}"}) for i in range(10)]
    )
    assert _ok(res) == 3, res
    assert all("your network address" in b["error"]["message"] for st, b, _ in res if st == 429)
    recs = [r for gw in untrusted for r in gw.access_records() if r["key_id"] in ("i1", "i2")]
    assert {r["client_ip"] for r in recs} == {"127.0.0.1"}
    assert {r.get("application") for gw in untrusted for r in gw.access_records() if r["key_id"] == "a1"} == {"web"}

    # behind a trusted proxy (127.0.0.1/32): each forwarded client has its own 3; a client-written left
    # part of the header ("6.6.6.6, ...") does not move the count off the hop the proxy appended
    trusted = [gateway(_config(redis_url.replace("/0", "/3"), eng, entries, ["127.0.0.1/32"])) for _ in range(2)]
    plan = [(keys["i1"], "m", {"X-Forwarded-For": f"6.6.6.{i}, 203.0.113.{i % 2 + 1}"}) for i in range(12)]
    res = _send(trusted, plan)
    assert _ok(res) == 6, res
    recs = [r for gw in trusted for r in gw.access_records() if r["key_id"] == "i1" and r["status"] == 200]
    assert sorted(r["client_ip"] for r in recs) == ["203.0.113.1"] * 3 + ["203.0.113.2"] * 3


def test_client_ip_rules() -> None:
    """nginx realip with real_ip_recursive on: untrusted peer = the peer; trusted peer = the rightmost
    untrusted hop; all trusted = the leftmost; garbage stops at the hop before it."""
    nets = trusted_networks(("10.0.0.0/8", "::1/128"))
    assert client_ip("203.0.113.5", ["1.2.3.4"], nets) == "203.0.113.5"
    assert client_ip("10.1.1.1", ["1.2.3.4, 198.51.100.7, 10.2.2.2"], nets) == "198.51.100.7"
    assert client_ip("10.1.1.1", ["10.3.3.3", "10.2.2.2"], nets) == "10.3.3.3"
    assert client_ip("10.1.1.1", ["1.2.3.4, garbage"], nets) == "10.1.1.1"
    assert client_ip("::1", ["[2001:db8::1]:443"], nets) == "2001:db8::1"
    assert client_ip("10.1.1.1", ["198.51.100.7:5100"], nets) == "198.51.100.7"
    assert client_ip("10.1.1.1", [], nets) == "10.1.1.1"
    assert client_ip("127.0.0.1", ["1.2.3.4"], ()) == "127.0.0.1"
    assert client_ip(None, ["1.2.3.4"], nets) == "unknown"
