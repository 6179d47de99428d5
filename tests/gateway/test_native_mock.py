"""Native pass-through of Anthropic Messages and OpenAI Responses through a real gateway process, against the
mock engine's own ``/v1/messages`` and ``/v1/responses`` (servelab.engines.mock.apis):

- pass-through (``native_apis`` set) and translation (``native_apis: []``) of the same request to the same
  mock give the same text and usage, whole and streamed, each equal to the ledger's row; the native stream's
  event order is checked event by event against the translation's;
- the engine got the client's API body with the gateway's decisions (the mock's record: its endpoint, the
  bounded ``max_output_tokens``, ``store: false``, no ``metadata``/``user``); an over-cap length field is
  refused before any engine sees it;
- a pass-through target that fails before the first byte falls back to a translated one: the client still
  gets a correct answer in its API, and the access log and ledger name the backend that served;
- an engine failure mid-way through a native stream ends in exactly one ``response.failed`` (Responses) or
  ``error`` (Messages), never the engine's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from conftest import (
    gateway_key,
    gateway_view,
    ledger_usage,
    sse_events,
    start_gateway,
    start_mock_process,
    stop_gateway,
    stop_mock_process,
)

pytestmark = pytest.mark.timeout(180)

LIMIT = 256  # server.max_tokens_limit
BOTH = ["messages", "responses"]
PATH = {"messages": "/v1/messages", "responses": "/v1/responses"}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Models ``n`` (the vLLM-dialect mock, passed through), ``t`` (the same mock, translated), ``fb`` (a mock
    that answers 503 to everything, passed through, falling back to ``t``) and ``cut`` (a mock whose streams
    break mid-way, passed through)."""
    tmp = tmp_path_factory.mktemp("native")
    args = ("--dialect", "vllm", "--output-tokens", "6", "--reasoning-tokens", "2")
    mocks = {
        "ok": start_mock_process(*args),
        "down": start_mock_process(*args, "--fail-http-rate", "1", "--fail-http-status", "503"),
        "cut": start_mock_process(*args, "--stream-error-rate", "1"),
    }
    key, entry = gateway_key("k1", "t")

    def backend(name: str, mock: str, native: list[str]) -> dict[str, Any]:
        return {"name": name, "kind": "mock", "base_url": mocks[mock].root, "models": ["m"], "native_apis": native}

    cfg = {
        "server": {"max_tokens_limit": LIMIT},
        "backends": [
            backend("nat", "ok", BOTH),
            backend("tr", "ok", []),
            backend("down", "down", BOTH),
            backend("cut", "cut", BOTH),
        ],
        "models": {
            "n": {"targets": [{"backend": "nat"}]},
            "t": {"targets": [{"backend": "tr"}]},
            "fb": {"targets": [{"backend": "down"}], "fallback": [{"model": "t"}]},
            "cut": {"targets": [{"backend": "cut"}]},
        },
        "retry": {"attempts": 1, "backoff_s": 0.01},  # the fallback is the one retry
        "breaker": {"consecutive_failures": 1000, "min_requests": 100_000},
        "tenants": {"t": {}},
        "keys": [entry],
    }
    proc = start_gateway(cfg, tmp / "gw")
    try:
        yield gateway_view(proc, key, mocks=mocks)
    finally:
        stop_gateway(proc.proc)
        for m in mocks.values():
            stop_mock_process(m.proc)


def _headers(gw: Any, api: str) -> dict[str, str]:
    if api == "messages":
        return {"x-api-key": gw.key, "anthropic-version": "2023-06-01"}
    return {"Authorization": f"Bearer {gw.key}"}


def _body(api: str, model: str, stream: bool = False, **kw: Any) -> dict[str, Any]:
    if api == "messages":
        body = {
            "model": model,
            "max_tokens": 64,
            "system": "be brief",
            "messages": [{"role": "user", "content": "hello there"}],
        }
    else:
        body = {"model": model, "instructions": "be brief", "input": "hello there", "max_output_tokens": 64}
    return {**body, "stream": stream, **kw}


def _records(mock: Any) -> list[dict[str, Any]]:
    r = httpx.get(mock.root + "/mock/records", timeout=10)
    r.raise_for_status()
    out: list[dict[str, Any]] = r.json()
    return out


def _access(gw: Any, rid: str) -> dict[str, Any]:
    import time

    for _ in range(100):
        for r in gw.proc.access_records():
            if r["request_id"] == rid:
                return r
        time.sleep(0.05)
    raise AssertionError(f"no access record for {rid}")


def _whole(gw: Any, api: str, model: str, **kw: Any) -> tuple[str, dict[str, Any]]:
    r = httpx.post(gw.root + PATH[api], json=_body(api, model, **kw), headers=_headers(gw, api), timeout=20)
    assert r.status_code == 200, r.text
    return r.headers["x-request-id"], r.json()


def _text_and_usage(api: str, ans: dict[str, Any]) -> tuple[str, str, tuple[int, int]]:
    """(answer text, reasoning text, (prompt tokens, output tokens)) of a whole answer in ``api``."""
    u = ans["usage"]
    if api == "messages":
        text = "".join(b.get("text", "") for b in ans["content"] if b["type"] == "text")
        thought = "".join(b.get("thinking", "") for b in ans["content"] if b["type"] == "thinking")
        return text, thought, (u["input_tokens"] + u.get("cache_read_input_tokens", 0), u["output_tokens"])
    parts = [p for it in ans["output"] for p in it.get("content") or []]
    text = "".join(p["text"] for p in parts if p["type"] == "output_text")
    thought = "".join(p["text"] for p in parts if p["type"] == "reasoning_text")
    return text, thought, (u["input_tokens"], u["output_tokens"])


@pytest.mark.parametrize("api", BOTH)
def test_whole_pass_through_and_translation_agree(gw: Any, api: str) -> None:
    """Same text, reasoning and usage both ways, each usage equal to the ledger's row; the pass-through's
    request reached the engine's own route (the mock's record), the translation its chat route; the access
    log names the API for the pass-through, chat for the translation."""
    seen = {}
    for model in ("n", "t"):
        rid, ans = _whole(gw, api, model)
        text, thought, usage = _text_and_usage(api, ans)
        assert usage == ledger_usage(gw.db, rid), (model, ans)
        assert ans["model"] == model  # the public name, never the engine's
        assert _records(gw.mocks["ok"])[-1]["endpoint"] == (api if model == "n" else "chat")
        assert _access(gw, rid)["endpoint"] == (api if model == "n" else "chat")
        seen[model] = (text, thought, usage)
    assert seen["n"] == seen["t"], seen
    assert seen["n"][0] == " tok0 tok1 tok2 tok3 tok4 tok5" and seen["n"][2][1] == 8  # 2 reasoning + 6 answer


def _stream(gw: Any, api: str, model: str, **kw: Any) -> tuple[str, list[tuple[str, Any]]]:
    return sse_events(gw.root, PATH[api], _body(api, model, stream=True, **kw), _headers(gw, api))


def _stream_text_and_usage(api: str, events: list[tuple[str, Any]]) -> tuple[str, tuple[int, int]]:
    if api == "messages":
        text = "".join(d["delta"].get("text", "") for n, d in events if n == "content_block_delta")
        u = {**events[0][1]["message"]["usage"], **events[-2][1]["usage"]}
        assert events[-2][0] == "message_delta"
        return text, (u["input_tokens"] + u.get("cache_read_input_tokens", 0), u["output_tokens"])
    text = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    u = events[-1][1]["response"]["usage"]
    return text, (u["input_tokens"], u["output_tokens"])


@pytest.mark.parametrize("api", BOTH)
def test_stream_pass_through_and_translation_agree_event_by_event(gw: Any, api: str) -> None:
    """The native stream, event by event, is the sequence the translation sends (the API's documented
    order); the same text and usage, equal to the ledger's row; Responses' sequence numbers run 0, 1, 2..."""
    names = {}
    for model in ("n", "t"):
        rid, events = _stream(gw, api, model)
        text, usage = _stream_text_and_usage(api, events)
        assert text == " tok0 tok1 tok2 tok3 tok4 tok5" and usage == ledger_usage(gw.db, rid), (model, events)
        assert all(n == d["type"] for n, d in events)
        names[model] = [n for n, _ in events]
        if api == "responses":
            assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
            assert events[0][1]["response"]["model"] == model
        else:
            assert events[0][1]["message"]["model"] == model
    assert names["n"] == names["t"], names
    first, last = ("message_start", "message_stop") if api == "messages" else ("response.created", "response.completed")
    assert names["n"][0] == first and names["n"][-1] == last


def test_sdks_parse_the_native_answers(gw: Any) -> None:
    """The official SDKs read the pass-through's answers (whole and streamed)."""
    claude = anthropic.Anthropic(base_url=gw.root, api_key=gw.key, max_retries=0)
    msg = claude.messages.create(model="n", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    assert [b.type for b in msg.content] == ["thinking", "text"] and msg.stop_reason == "end_turn"
    with claude.messages.stream(model="n", max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as s:
        assert s.get_final_message().content[-1].text == " tok0 tok1 tok2 tok3 tok4 tok5"  # type: ignore[union-attr]
    oai = openai.OpenAI(base_url=gw.url, api_key=gw.key, max_retries=0)
    assert oai.responses.create(model="n", input="hi").output_text == " tok0 tok1 tok2 tok3 tok4 tok5"
    done = list(oai.responses.create(model="n", input="hi", stream=True))[-1]
    assert done.type == "response.completed" and done.response.output_text == " tok0 tok1 tok2 tok3 tok4 tok5"


def test_engine_gets_the_native_body_with_the_gateways_decisions(gw: Any) -> None:
    """What reached the engine's /v1/responses: the output bound (the client's, as it is under the cap),
    store false whatever the client asked, no metadata or user; the Messages body likewise."""
    mock = gw.mocks["ok"]
    _whole(gw, "responses", "n", max_output_tokens=5, store=True, metadata={"k": "v"}, user="u1", temperature=0.5)
    rec = _records(mock)[-1]
    assert rec["endpoint"] == "responses" and rec["output_tokens"] == 5 and rec["finish_reason"] == "length"
    assert rec["sampling"] == {"max_output_tokens": 5, "store": False, "temperature": 0.5}, rec
    _whole(gw, "messages", "n", max_tokens=7, metadata={"user_id": "u1"}, top_k=3)
    rec = _records(mock)[-1]
    assert rec["endpoint"] == "messages" and rec["sampling"] == {"max_tokens": 7, "top_k": 3}, rec


@pytest.mark.parametrize(("api", "field"), [("responses", "max_output_tokens"), ("messages", "max_tokens")])
def test_over_cap_length_refused_before_the_engine(gw: Any, api: str, field: str) -> None:
    """An over-cap length field is a 400 naming it, as a chat request's max_tokens is; no engine sees it."""
    before = len(_records(gw.mocks["ok"]))
    body = _body(api, "n", **{field: LIMIT + 1})
    r = httpx.post(gw.root + PATH[api], json=body, headers=_headers(gw, api), timeout=20)
    assert r.status_code == 400, r.text
    assert field in r.text and str(LIMIT) in r.text
    chat = httpx.post(
        gw.url + "/chat/completions",
        json={"model": "n", "max_tokens": LIMIT + 1, "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {gw.key}"},
        timeout=20,
    )
    assert chat.status_code == 400 and "max_tokens" in chat.text
    assert len(_records(gw.mocks["ok"])) == before


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", BOTH)
def test_pass_through_target_failing_falls_back_to_a_translated_one(gw: Any, api: str, stream: bool) -> None:
    """``fb``'s native backend answers 503 before any byte: the native attempt is made (the failing mock's
    record is at its API route), then the fallback model's translated backend answers, in the client's API;
    the access log and the ledger name the backend that served."""
    down = gw.mocks["down"]
    n_down = len(_records(down))
    if stream:
        rid, events = _stream(gw, api, "fb")
        text, usage = _stream_text_and_usage(api, events)
    else:
        rid, ans = _whole(gw, api, "fb")
        text, _, usage = _text_and_usage(api, ans)
    assert text == " tok0 tok1 tok2 tok3 tok4 tok5" and usage == ledger_usage(gw.db, rid)
    tried = _records(down)[n_down:]
    assert [r["endpoint"] for r in tried] == [api] and tried[0]["status"] == 503
    assert _records(gw.mocks["ok"])[-1]["endpoint"] == "chat"  # the fallback was translated
    rec = _access(gw, rid)
    assert rec["backend"] == "tr" and rec["fallback"] is True and rec["endpoint"] == "chat", rec
    import sqlite3

    with sqlite3.connect(gw.db) as con:
        row = con.execute("SELECT backend FROM servelab_usage WHERE request_id = ?", (rid,)).fetchone()
    assert row == ("tr",)


def test_native_responses_stream_broken_mid_way_ends_in_one_response_failed(gw: Any) -> None:
    """The engine sends its ``error`` and ``response.failed`` after a few deltas: the client gets the
    engine's events up to there, then exactly one ``response.failed`` (the gateway's, scrubbed), numbered
    after the engine's last event, and no ``error`` event."""
    rid, events = _stream(gw, "responses", "cut")
    names = [n for n, _ in events]
    assert names.count("response.failed") == 1 and names[-1] == "response.failed", names
    assert "error" not in names and "response.completed" not in names
    assert "response.output_text.delta" in names or "response.reasoning_text.delta" in names
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    failed = events[-1][1]["response"]
    assert failed["status"] == "failed" and failed["model"] == "cut"
    assert "mock-engine" not in failed["error"]["message"]  # the engine's text is never relayed
    assert _access(gw, rid)["outcome"] == "error"


def test_native_messages_stream_broken_mid_way_ends_in_one_error(gw: Any) -> None:
    _, events = _stream(gw, "messages", "cut")
    names = [n for n, _ in events]
    assert names.count("error") == 1 and names[-1] == "error" and names[0] == "message_start", names
    assert names.count("message_start") == 1 and "message_stop" not in names


@pytest.mark.parametrize("api", BOTH)
def test_bench_against_the_mocks_native_route(tmp_path: Path, api: str) -> None:
    """``servelab bench --endpoint messages|responses`` straight at the mock measures its native stream: every
    request reached the API's own route, tokens are the API's usage (= what the mock generated), and TTFT is
    the first content delta: the opening events (``message_start``/``response.created``, written with the
    headers) reach the client before the mock writes its first token, the first token after it."""
    import json
    import subprocess
    import sys

    n = 4
    mock = start_mock_process("--dialect", "vllm", "--output-tokens", "5", "--ttft-ms", "40", "--itl-ms", "2")
    try:
        out = tmp_path / "run"
        cmd = [sys.executable, "-m", "servelab.cli", "bench", "--url", mock.root + "/v1", "--model", "m"]
        cmd += ["--endpoint", api, "-w", "short-qa", "--set", "output_tokens=32", "--concurrency", "1"]
        cmd += ["--requests", str(n), "--warmup", "0", "--out", str(out)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        written = _records(mock)
    finally:
        stop_mock_process(mock.proc)
    (step,) = json.loads((out / "summary.json").read_text())["steps"]
    assert step["counts"]["succeeded"] == n and step["tokens"]["output_source"] == {"usage": n}
    lines = sorted(
        (json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()), key=lambda x: x["t_ns"]["sent"]
    )
    assert [w["endpoint"] for w in written] == [api] * n
    for x, w in zip(lines, written, strict=True):
        t = x["t_ns"]
        assert (x["prompt_tokens"], x["output_tokens"]) == (w["prompt_tokens"], w["output_tokens"])
        assert x["output_tokens"] == 5 and x["prompt_tokens"] > 0
        assert t["first_event"] < w["token_write_ns"][0] <= t["first_token"], (t, w)
        assert t["first_token"] - t["sent"] >= 40e6 - 1.5e6  # the mock's schedule (uvloop ticks in whole ms)
