"""Anthropic Messages and OpenAI Responses through the gateway against the REAL llama-server, with the official
SDKs as clients: text arrives, usage equals the ledger's row, the streams' event order is exact, and the two
ways a Messages request can reach llama-server agree — passed through to its own ``/v1/messages``
(servelab.gateway.apis.native; model ``native``) and translated to chat completions (model ``chat``: the same
engine, ``native_apis: []``) give the same text and the same usage at temperature 0.

One llama-server and one gateway per module; each request generates at most 8 tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from conftest import gateway_key, gateway_view, launch_llama, ledger_usage, sse_events, start_gateway, stop_gateway

MSGS: Any = [{"role": "user", "content": "Name three colours."}]
N = 8  # max_tokens of every request


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from launch_llama(tmp_path_factory, ctx_size=1024, parallel=1)


@pytest.fixture(scope="module")
def gw(llama: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Models ``native`` (kind llamacpp: Messages passed through) and ``chat`` (the same llama-server,
    always translated), key ``key``, output cap 64."""
    key, entry = gateway_key("k1", "t")
    root = llama.base_url.removesuffix("/v1")
    cfg = {
        "server": {"max_tokens_limit": 64},
        "backends": [
            {"name": "n", "kind": "llamacpp", "base_url": root, "models": ["gemma"]},
            {"name": "c", "kind": "llamacpp", "base_url": root, "models": ["gemma"], "native_apis": []},
        ],
        "models": {"native": {"targets": [{"backend": "n"}]}, "chat": {"targets": [{"backend": "c"}]}},
        "retry": {"attempts": 0},
        "tenants": {"t": {}},
        "keys": [entry],
    }
    proc = start_gateway(cfg, tmp_path_factory.mktemp("apis-llama") / "gw")
    try:
        yield gateway_view(proc, key)
    finally:
        stop_gateway(proc.proc)


def _claude(gw: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.root, api_key=gw.key, max_retries=0, timeout=120)


def _prompt_tokens(u: Any) -> int:
    """Anthropic usage's whole prompt: ``input_tokens`` excludes cached tokens (servelab.wire.apis.usage_counts)."""
    return int(u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0))


def test_messages_create_native_and_translated_agree(gw: Any) -> None:
    """messages.create through both paths at temperature 0: text, stop_reason and usage (prompt incl. cached
    tokens, output) the same; each equals its ledger row; the access log says what was forwarded."""
    got = {}
    for model in ("native", "chat"):
        raw = _claude(gw).messages.with_raw_response.create(model=model, max_tokens=N, temperature=0, messages=MSGS)
        msg = raw.parse()
        rid = raw.headers["x-request-id"]
        text = "".join(b.text for b in msg.content if b.type == "text")
        assert text, f"{model}: no text"
        assert msg.model == model
        usage = (_prompt_tokens(msg.usage), msg.usage.output_tokens)
        assert usage == ledger_usage(gw.db, rid)
        assert gw.proc.access_record(rid)["endpoint"] == ("messages" if model == "native" else "chat")
        got[model] = (text, msg.stop_reason, usage)
    assert got["native"] == got["chat"]


def test_messages_stream_native_and_translated(gw: Any) -> None:
    """A Messages stream through both paths, event by event as sent: exact order (the translation sends
    Anthropic's ``ping`` after ``message_start``; llama-server sends none, and the pass-through forwards
    what it sends), each event's ``type`` matching its name, the same text, usage (message_start's input
    and cached tokens, message_delta's output tokens) equal to the ledger's row; then messages.stream (the
    SDK, which skips pings) reads the same text and usage."""
    got = {}
    for model in ("native", "chat"):
        body = {"model": model, "max_tokens": N, "temperature": 0, "stream": True, "messages": MSGS}
        rid, events = sse_events(gw.root, "/v1/messages", body, {"x-api-key": gw.key}, timeout_s=120)
        names = [n for n, _ in events]
        assert all(n == d["type"] for n, d in events)
        deltas = names.count("content_block_delta")
        head = ["message_start", "ping"] if model == "chat" else ["message_start"]
        assert names == [
            *head,
            "content_block_start",
            *["content_block_delta"] * deltas,
            "content_block_stop",
            "message_delta",
            "message_stop",
        ], names
        assert 1 <= deltas <= N
        start, delta = events[0][1]["message"], events[-2][1]
        assert start["model"] == model
        usage = {**start["usage"], **delta["usage"]}  # message_delta's counts are cumulative
        prompt = (
            usage["input_tokens"]
            + usage.get("cache_read_input_tokens", 0)
            + usage.get("cache_creation_input_tokens", 0)
        )
        assert (prompt, usage["output_tokens"]) == ledger_usage(gw.db, rid)
        text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
        got[model] = (text, delta["delta"]["stop_reason"], (prompt, usage["output_tokens"]))
        with _claude(gw).messages.stream(model=model, max_tokens=N, temperature=0, messages=MSGS) as s:
            final = s.get_final_message()
            sdk_rid = s.response.headers["x-request-id"]
        assert "".join(b.text for b in final.content if b.type == "text") == text
        assert (_prompt_tokens(final.usage), final.usage.output_tokens) == ledger_usage(gw.db, sdk_rid)
    assert got["native"] == got["chat"]


def test_responses_stream_against_llama_server(gw: Any) -> None:
    """openai responses.create(stream=True) (translated: llama-server does not serve Responses): the typed
    events in exact order with sequence numbers 0, 1, ...; text arrives; usage equals the ledger's row."""
    client = openai.OpenAI(base_url=gw.url, api_key=gw.key, max_retries=0, timeout=120)
    with client.responses.with_streaming_response.create(
        model="native", input=MSGS, max_output_tokens=N, temperature=0, stream=True
    ) as raw:
        rid = raw.headers["x-request-id"]
        events = list(raw.parse())
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        kinds[-1],
    ], kinds
    assert kinds[-1] in ("response.completed", "response.incomplete") and deltas >= 1
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1].response  # type: ignore[union-attr]
    assert done.output_text
    assert done.usage is not None
    assert (done.usage.input_tokens, done.usage.output_tokens) == ledger_usage(gw.db, rid)


def test_native_over_cap_and_bad_input_refused_like_chat(gw: Any) -> None:
    """The output cap and the body checks happen at admission, before the pass-through: Anthropic-shaped 400s."""
    client = _claude(gw)
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="native", max_tokens=65, messages=MSGS)
    assert "max_tokens" in str(e.value) and "64" in str(e.value)
    resp = httpx.post(
        gw.root + "/v1/messages",
        json={"model": "native", "max_tokens": 4, "messages": []},
        headers={"x-api-key": gw.key},
        timeout=30,
    )
    assert resp.status_code == 400 and resp.json()["type"] == "error"
    assert resp.json()["error"]["type"] == "invalid_request_error"


def test_native_stream_when_llama_server_dies_mid_answer(llama: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A second real llama-server (``llama`` only gives this test its engine tier) is killed with SIGKILL right
    after the first text delta of a pass-through stream: the client gets the engine's own opening events, the
    deltas it sent, then exactly one Anthropic ``error`` event, no second ``message_start``, nothing internal;
    the access log says the request was cut off."""
    import signal

    eng_gen = launch_llama(tmp_path_factory, ctx_size=1024, parallel=1)
    eng = next(eng_gen)
    key, entry = gateway_key("k1", "t")
    cfg = {
        "backends": [
            {"name": "n", "kind": "llamacpp", "base_url": eng.base_url.removesuffix("/v1"), "models": ["gemma"]}
        ],
        "models": {"native": {"targets": [{"backend": "n"}]}},
        "retry": {"attempts": 0},
        "tenants": {"t": {}},
        "keys": [entry],
    }
    proc = start_gateway(cfg, tmp_path_factory.mktemp("apis-llama-die") / "gw")
    try:
        body = {
            "model": "native",
            "max_tokens": 512,
            "stream": True,
            "temperature": 0,
            "messages": [{"role": "user", "content": "Count from one to two hundred in words."}],
        }
        names: list[str] = []
        last = b""
        with httpx.stream("POST", proc.root + "/v1/messages", json=body, headers={"x-api-key": key}, timeout=120) as r:
            assert r.status_code == 200
            rid = r.headers["x-request-id"]
            for line in r.iter_lines():
                if line.startswith("event: "):
                    names.append(line.removeprefix("event: "))
                    if names[-1] == "content_block_delta" and names.count("content_block_delta") == 1:
                        eng.process.send_signal(signal.SIGKILL)
                elif line.startswith("data: "):
                    last = line.encode()
        assert names.count("message_start") == 1 and names[-1] == "error", names
        assert "message_stop" not in names and names.index("content_block_delta") < len(names) - 1
        err = orjson.loads(last.removeprefix(b"data: "))
        assert err["type"] == "error" and err["error"]["type"] == "api_error"
        assert "127.0.0.1" not in err["error"]["message"] and "gguf" not in err["error"]["message"]
        rec = next(orjson.loads(x) for x in proc.access_log.read_text().splitlines() if rid in x)
        assert rec["outcome"] == "error" and rec["error_code"] == "upstream_cut_off", rec
    finally:
        stop_gateway(proc.proc)
        eng_gen.close()
