"""Issue 26 item 1 through the real gateway process: the ``engine`` endpoint picker over three vLLM-dialect
mock engines with prefix caches (``--prefix-cache-blocks``), scraping their /metrics.

- multi-turn sessions stay on one replica and find their previous turn cached (the engines' own
  ``cached_tokens``), and each request's access-log line carries the choice and every replica's scores;
- a replica the engine reports busy (requests running, sent around the gateway) gets no new request;
- with health checks off there are no gauges: the picker falls back to least outstanding, never blocks,
  and counts it in ``servelab_gateway_picker_decisions_total``.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from conftest import gateway_key, start_gateway, start_mock_process, stop_gateway, stop_mock_process

from servelab.engines.mock.cache import BLOCK_WORDS

MOCK = (
    "--dialect",
    "vllm",
    "--model",
    "m",
    "--output-tokens",
    "100",
    "--itl-ms",
    "20",
    "--prefix-cache-blocks",
    "4000",
)


def _config(mocks: list[Any], key_entry: dict[str, str], health: bool) -> dict[str, Any]:
    return {
        "backends": [
            {"name": n, "kind": "vllm", "base_url": m.root, "models": ["m"]} for n, m in zip("abc", mocks, strict=True)
        ],
        "models": {"chat": {"targets": [{"backend": n, "model": "m"} for n in "abc"]}},
        "tenants": {"t": {"allowed_models": ["chat"]}},
        "keys": [key_entry],
        "health": {"enabled": health, "interval_s": 0.2},
        "routing": {"picker": {"policy": "engine", "stale_after_s": 2.0}},
    }


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    mocks = [start_mock_process(*MOCK) for _ in range(3)]
    key, entry = gateway_key("k1", "t")
    gw = None
    try:
        gw = start_gateway(_config(mocks, entry, True), tmp_path_factory.mktemp("picker"))
        yield {"gw": gw, "key": key, "mocks": dict(zip("abc", mocks, strict=True)), "entry": entry}
    finally:
        if gw is not None:
            stop_gateway(gw.proc)
        for m in mocks:
            stop_mock_process(m.proc)


async def _chat(s: aiohttp.ClientSession, url: str, key: str, text: str, max_tokens: int = 2) -> dict[str, Any]:
    body = {"model": "chat", "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}]}
    async with s.post(url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        assert r.status == 200, await r.text()
        out: dict[str, Any] = await r.json()
        out["_rid"] = r.headers["X-Request-ID"]
        return out


def _metrics(gw: Any) -> str:
    """The gateway's /metrics page (admin port)."""
    req = urllib.request.Request(gw.admin_url + "/metrics", headers={"Authorization": f"Bearer {gw.admin_token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return str(r.read().decode())


def _wait_scraped(gw: Any, n: int = 3, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = _metrics(gw)
        if (
            sum(
                1
                for ln in text.splitlines()
                if ln.startswith("servelab_gateway_engine_scrape_up{") and ln.endswith(" 1.0")
            )
            >= n
        ):
            return
        time.sleep(0.1)
    raise AssertionError("the gateway never scraped every engine's /metrics")


def _picks(gw: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    """request id -> (backend that answered, the pick event's attributes); every line must have one."""
    out = {}
    for rec in gw.access_records():
        pick = next((ev[2] for ev in rec.get("timeline", []) if ev[0] == "pick"), None)
        assert isinstance(pick, dict), f"no pick event in {rec['request_id']}'s timeline"
        out[rec["request_id"]] = (str(rec["backend"]), pick)
    return out


def test_sessions_stay_on_their_replica_and_find_the_previous_turn_cached(fleet: dict[str, Any]) -> None:
    gw, key = fleet["gw"], fleet["key"]
    _wait_scraped(gw)
    sessions, turns = 5, 3  # 5 sessions over 3 replicas: round robin would move every session each turn

    async def go() -> list[list[dict[str, Any]]]:
        async with aiohttp.ClientSession() as s:
            out: list[list[dict[str, Any]]] = [[] for _ in range(sessions)]
            for t in range(turns):  # turn by turn, like chat users: turn t extends turn t-1 by 2 blocks
                for i in range(sessions):
                    text = " ".join(f"s{i}w{k}" for k in range((t + 1) * 2 * BLOCK_WORDS))
                    out[i].append(await _chat(s, gw.url, key, text))
            return out

    answers = asyncio.run(go())
    time.sleep(0.3)  # the access-log line is written after the last byte
    picks = _picks(gw)
    for i, turns_of in enumerate(answers):
        backends = {picks[a["_rid"]][0] for a in turns_of}
        assert len(backends) == 1, f"session {i} moved: {backends}"
        cached = [a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in turns_of]
        assert cached == [0, 2 * BLOCK_WORDS, 4 * BLOCK_WORDS], f"session {i}: {cached}"
    pick = picks[answers[0][2]["_rid"]][1]
    assert pick["policy"] == "engine" and pick["how"] == "scored" and set(pick["scores"]) == set("abc")
    assert {"queue", "running", "prefix", "total", "load"} <= set(pick["scores"][pick["chosen"]])
    assert pick["scores"][pick["chosen"]]["prefix"] > 0
    assert len({b for b, _ in picks.values()}) >= 2  # new sessions spread over replicas


def test_a_replica_the_engine_reports_busy_gets_no_new_request(fleet: dict[str, Any]) -> None:
    gw, key, busy = fleet["gw"], fleet["key"], fleet["mocks"]["a"]

    async def go() -> list[dict[str, Any]]:
        async with aiohttp.ClientSession() as s:
            # 4 long answers straight to engine a (2 s each, around the gateway): only its /metrics shows them
            hold = [asyncio.create_task(_chat(s, busy.base_url, "x", f"hold {i}", max_tokens=100)) for i in range(4)]
            await asyncio.sleep(0.8)  # > 2 scrape intervals
            out = [await _chat(s, gw.url, key, f"fresh prompt number {i} " * 20) for i in range(6)]
            for h in hold:
                h.cancel()
            await asyncio.gather(*hold, return_exceptions=True)
            return out

    answers = asyncio.run(go())
    time.sleep(0.3)
    picks = _picks(gw)
    chosen = [picks[a["_rid"]][0] for a in answers]
    assert "a" not in chosen, chosen
    scores = picks[answers[0]["_rid"]][1]["scores"]
    assert scores["a"]["load"] >= 4 and scores["a"]["running"] < scores[chosen[0]]["running"]


def test_without_gauges_the_picker_falls_back_to_least_outstanding_and_counts_it(
    fleet: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    mocks = list(fleet["mocks"].values())
    gw = start_gateway(_config(mocks, fleet["entry"], False), tmp_path_factory.mktemp("picker-nohealth"))
    try:

        async def go() -> list[dict[str, Any]]:
            async with aiohttp.ClientSession() as s:
                return [await _chat(s, gw.url, fleet["key"], f"q {i}") for i in range(4)]

        answers = asyncio.run(go())
        time.sleep(0.3)
        picks = _picks(gw)
        assert all(picks[a["_rid"]][1]["how"] == "fallback_stale" for a in answers)
        text = _metrics(gw)
        assert 'servelab_gateway_picker_decisions_total{how="fallback_stale",policy="engine"} 4.0' in text
    finally:
        stop_gateway(gw.proc)
