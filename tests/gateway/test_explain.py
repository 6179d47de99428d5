"""Issue 24 items 1 and 5: every request's timeline in the access log and ``servelab gateway explain REQUEST_ID``.

Real gateway processes: a request refused by a tenant's RPM limit is explained by that limit; a request
whose first attempt got a 503 from one backend and was answered by another names the failed attempt
(mock engines: the real engine adds nothing to either). The saturated case runs the REAL llama-server with
one slot and more concurrent streams than slots: the last request's wait is named as the engine's queue,
with llama.cpp's own ``timings`` (prefill) in the timeline, and the gateway's /metrics re-exports the
engine's queue, running and slot gauges labelled by backend.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import gateway_key, launch_llama

from servelab.gateway.explain import explain, format_explanation
from servelab.gateway.explain import find_record as _find_record
from servelab.gateway.timeline import engine_account
from servelab.wire.errors import ConfigError


def find_record(path: Any, rid: str, wait_s: float = 10.0) -> dict[str, Any]:
    """The access-log line of ``rid``, waiting up to ``wait_s`` for it: the gateway writes the line after the
    last byte went out, so a client that has its answer can read the log a moment before the line is there."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return _find_record(path, rid)
        except ConfigError:
            if time.monotonic() > deadline or not Path(path).exists():
                raise
            time.sleep(0.05)


def _post(url: str, key: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    async def go() -> tuple[int, str, bytes]:
        async with (
            aiohttp.ClientSession() as s,
            s.post(url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r,
        ):
            return r.status, r.headers["X-Request-ID"], await r.read()

    return asyncio.run(go())


def _cli_explain(log: Path, rid: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servelab.cli", "gateway", "explain", rid, "--log", str(log), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


CHAT = {"model": "chat", "stream": True, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def test_rate_limited_and_retried_requests_are_explained(gateway, mock_engine) -> None:
    ok = mock_engine("--dialect", "vllm", "--model", "m", "--output-tokens", "4")
    bad = mock_engine("--dialect", "vllm", "--model", "m", "--fail-http-rate", "1", "--fail-http-status", "503")
    key, entry = gateway_key("k1", "t")
    lkey, lentry = gateway_key("k2", "lim")
    gw = gateway(
        {
            "backends": [
                {"name": "bad", "kind": "mock", "base_url": bad.root, "models": ["m"]},
                {"name": "good", "kind": "mock", "base_url": ok.root, "models": ["m"]},
            ],
            # the bad backend first on every request: a weight of 0 for good would drop it from the split, so the
            # order comes from a fallback model served only by the good backend
            "models": {
                "chat": {"targets": [{"backend": "bad", "model": "m"}], "fallback": [{"model": "spare"}]},
                "spare": {"targets": [{"backend": "good", "model": "m"}]},
            },
            "tenants": {
                "t": {"allowed_models": ["chat", "spare"]},
                "lim": {"allowed_models": ["chat", "spare"], "rpm": 1},
            },
            "keys": [entry, lentry],
            "retry": {"attempts": 2, "backoff_s": 0.01},
            "breaker": {"consecutive_failures": 1000, "min_requests": 100_000},
            "health": {"enabled": False},
        }
    )
    status, rid, body = _post(gw.url, key, CHAT)
    assert status == 200, body
    status2, rid2, _ = _post(gw.url, lkey, CHAT)
    status3, rid3, body3 = _post(gw.url, lkey, CHAT)
    assert (status2, status3) == (200, 429), body3

    retried = find_record(gw.access_log, rid)
    names = [e[0] for e in retried["timeline"]]
    for ev in (
        "received",
        "checked",
        "admitted",
        "routed",
        "attempt",
        "headers",
        "failed",
        "connected",
        "first_token",
        "last_token",
        "done",
    ):
        assert ev in names, (ev, retried["timeline"])
    # the connector's account: the first request opened its connections, the next one reused them
    assert [e[2] for e in retried["timeline"] if e[0] == "connected"][0] == {"reused": False}, retried["timeline"]
    again = [e[2] for e in find_record(gw.access_log, rid2)["timeline"] if e[0] == "connected"]
    assert again and all(a == {"reused": True} for a in again), again
    exp = explain(retried)
    assert exp.cause == "failed_attempts" or "failed attempt" in exp.diagnosis, exp.diagnosis
    assert "attempt 1 on bad failed (503 model_busy)" in exp.diagnosis, exp.diagnosis
    assert retried["backend"] == "good" and retried["retries"] == 1
    print(format_explanation(retried, exp))

    limited = find_record(gw.access_log, rid3)
    exp3 = explain(limited)
    assert exp3.cause == "limit"
    assert exp3.diagnosis.startswith("refused by the rpm limit on the key"), exp3.diagnosis
    assert "the client was told to retry in 60 s" in exp3.diagnosis
    assert "429 rate_limit_exceeded" in exp3.diagnosis and "nothing was sent" in exp3.diagnosis

    # the command itself, as the on-call engineer runs it
    out = _cli_explain(gw.access_log, rid3)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == f"diagnosis: {exp3.diagnosis}"
    assert f"request {rid3}" in out.stdout and "refused" in out.stdout
    missing = _cli_explain(gw.access_log, "nope")
    assert missing.returncode != 0
    assert "'nope' is not in the access log" in missing.stderr and "Traceback" not in missing.stderr


@pytest.fixture(scope="module")
def one_slot_llama(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A real llama-server with a single slot (module-scoped)."""
    yield from launch_llama(tmp_path_factory, ctx_size=1024, parallel=1)


def test_saturated_llama_server_is_explained_as_its_queue(gateway, one_slot_llama) -> None:
    key, entry = gateway_key("k1", "t")
    gw = gateway(
        {
            "backends": [
                {"name": "llama-a", "kind": "llamacpp", "base_url": one_slot_llama.base_url, "models": ["gemma"]}
            ],
            "models": {"chat": {"targets": [{"backend": "llama-a", "model": "gemma"}]}},
            "tenants": {"t": {"allowed_models": ["chat"]}},
            "keys": [entry],
            "health": {"interval_s": 0.2},
        }
    )
    body = {**CHAT, "max_tokens": 48, "temperature": 0, "messages": [{"role": "user", "content": "Count to fifty."}]}

    async def burst() -> list[tuple[int, str]]:
        async def one(s: aiohttp.ClientSession, delay_s: float) -> tuple[int, str]:
            await asyncio.sleep(delay_s)  # in order: the last one queues behind the others in the one slot
            async with s.post(gw.url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
                await r.read()
                return r.status, r.headers["X-Request-ID"]

        async with aiohttp.ClientSession() as s:
            return await asyncio.gather(*(one(s, 0.05 * i) for i in range(3)))

    res = asyncio.run(burst())
    assert [st for st, _ in res] == [200, 200, 200]
    rec = find_record(gw.access_log, res[-1][1])
    eng = next(e[2] for e in rec["timeline"] if e[0] == "engine")
    assert eng["prompt_n"] >= 1 and eng["predicted_n"] >= 1 and eng["prompt_ms"] > 0  # llama.cpp's own timings
    att = next(e[2] for e in rec["timeline"] if e[0] == "attempt")
    assert att["in_flight"] == 2, att
    assert att["slots"] == 1, att  # the engine's own account, scraped by the gateway (enginegauges)
    exp = explain(rec, ttft_slo_s=0.05)
    assert exp.cause == "engine_queue", (exp.diagnosis, exp.parts_ms)
    assert "waiting in backend llama-a's queue (2 other requests in flight there" in exp.diagnosis
    assert "the TTFT SLO is 0.05 s (missed)" in exp.diagnosis
    print(format_explanation(rec, exp))  # shown with -s: the acceptance output

    # issue 24 item 5: the engine's gauges re-exported by the gateway, labelled by backend
    from servelab.wire.prometheus import parse_prometheus_text

    async def metrics() -> str:
        async with (
            aiohttp.ClientSession() as s,
            s.get(gw.admin_url + "/metrics", headers={"Authorization": f"Bearer {gw.admin_token}"}) as r,
        ):
            assert r.status == 200
            return await r.text()

    m = parse_prometheus_text(asyncio.run(metrics()))
    lab = '{backend="llama-a",kind="llamacpp"}'
    assert m["servelab_gateway_engine_slots" + lab] == 1
    assert m["servelab_gateway_engine_scrape_up" + lab] == 1
    assert m["servelab_gateway_engine_requests_running" + lab] in (0, 1)  # at most the one slot (scrape 0.2 s old)
    assert m["servelab_gateway_engine_requests_waiting" + lab] >= 0
    assert 0 <= m["servelab_gateway_engine_scrape_age_seconds" + lab] < 5


def test_explain_refuses_a_line_without_timeline_in_one_line(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text('{"request_id": "abc", "status": 200}\nnot json\n')
    with pytest.raises(ConfigError, match="has no timeline"):
        explain(_find_record(log, "abc"))
    with pytest.raises(ConfigError, match="cannot read the access log"):
        _find_record(tmp_path / "missing.log", "abc")


def test_engine_account_reads_llamacpp_timings_and_cached_tokens() -> None:
    ev = {
        "usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 4}},
        "timings": {
            "prompt_n": 5,
            "prompt_ms": 12.3456,
            "cache_n": 4,
            "predicted_n": 7,
            "predicted_ms": 70.0,
            "predicted_per_second": 100.0,
        },
    }
    assert engine_account(ev) == {
        "prompt_n": 5,
        "prompt_ms": 12.346,
        "cache_n": 4,
        "predicted_n": 7,
        "predicted_ms": 70.0,
        "cached_tokens": 4,
    }
    assert engine_account({"usage": {"prompt_tokens": 3}}) is None
