"""Anthropic Messages and OpenAI Responses through the real gateway (servelab.gateway.apis), with the official
SDKs as clients and mock engines as backends: text, usage equal to the ledger's row, the exact streamed
event sequence, a tool call round trip, the same output cap and refusals as chat completions, errors in
each API's shape (bad input, wrong key, rate limit, a dead backend).

One gateway and its mocks per module (started once, a few seconds); every test is a handful of requests.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
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

LIMIT = 512  # server.max_tokens_limit
TOOL = {
    "name": "get_weather",
    "description": "weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A gateway with model ``m`` (a vLLM-dialect mock, 6 tokens, 2 reasoning tokens), ``t`` (an Ollama-dialect
    mock: tool calls come whole), ``dead`` (nothing listens) and keys ``key`` and ``slow`` (rpm 1)."""
    tmp = tmp_path_factory.mktemp("apis")
    mocks = [
        start_mock_process("--dialect", "vllm", "--output-tokens", "6", "--reasoning-tokens", "2"),
        start_mock_process("--dialect", "ollama", "--output-tokens", "5"),
    ]
    key, entry = gateway_key("k1", "t")
    slow, slow_entry = gateway_key("k2", "t")
    cfg = {
        "server": {"max_tokens_limit": LIMIT},
        "backends": [
            {"name": "b", "kind": "mock", "base_url": mocks[0].root, "models": ["m"]},
            {"name": "o", "kind": "mock", "base_url": mocks[1].root, "models": ["m"]},
            {"name": "gone", "kind": "vllm", "base_url": f"http://127.0.0.1:{_free_port()}", "models": ["m"]},
        ],
        "models": {
            "m": {"targets": [{"backend": "b"}], "capabilities": {"tools": True}},
            "t": {"targets": [{"backend": "o"}], "capabilities": {"tools": True}},
            "dead": {"targets": [{"backend": "gone"}]},
        },
        "retry": {"attempts": 0},
        "tenants": {"t": {}},
        "keys": [entry, {**slow_entry, "rpm": 1}],
    }
    proc = start_gateway(cfg, tmp / "gw")
    try:
        yield gateway_view(proc, key, slow=slow)
    finally:
        stop_gateway(proc.proc)
        for m in mocks:
            stop_mock_process(m.proc)


def _claude(gw: Any, key: str | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.root, api_key=key or gw.key, max_retries=0)


def _oai(gw: Any, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url, api_key=key or gw.key, max_retries=0)


# ------------------------------------------------------------------------------------------ Anthropic Messages


def test_messages_create_text_thinking_and_ledger_usage(gw: Any) -> None:
    """A whole answer: the engine's reasoning as a thinking block, its text, stop_reason, and usage equal to
    the ledger's row for the request."""
    raw = _claude(gw).messages.with_raw_response.create(
        model="m", max_tokens=64, system="be brief", messages=[{"role": "user", "content": "hello"}]
    )
    msg = raw.parse()
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == " think0 think1"
    assert msg.content[1].text == " tok0 tok1 tok2 tok3 tok4 tok5"
    assert msg.stop_reason == "end_turn" and msg.model == "m" and msg.role == "assistant"
    rid = raw.headers["x-request-id"]
    assert msg.id == f"msg_{rid}"
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == ledger_usage(gw.db, rid)
    assert msg.usage.output_tokens == 8  # 2 reasoning + 6 answer tokens, as the engine counted


def test_messages_stream_event_sequence_exact(gw: Any) -> None:
    """The stream as sent, event by event: message_start, ping, one block per kind with its start/deltas/stop,
    message_delta with stop_reason and the ledger's usage, message_stop; the SDK's accumulated message
    agrees; max_tokens cuts it (stop_reason max_tokens)."""
    body = {"model": "m", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    rid, events = sse_events(gw.root, "/v1/messages", body, {"x-api-key": gw.key})
    assert all(name == data["type"] for name, data in events)
    seq = [(n, d.get("index"), (d.get("delta") or d.get("content_block") or {}).get("type")) for n, d in events]
    assert seq == [
        ("message_start", None, None),
        ("ping", None, None),
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"),
        *[("content_block_delta", 1, "text_delta")] * 3,
        ("content_block_stop", 1, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert (delta["usage"]["input_tokens"], delta["usage"]["output_tokens"]) == ledger_usage(gw.db, rid)
    with _claude(gw).messages.stream(model="m", max_tokens=5, messages=body["messages"]) as s:
        final = s.get_final_message()
    assert final.content[1].text == " tok0 tok1 tok2" and final.stop_reason == "max_tokens"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (delta["usage"]["input_tokens"], 5)


@pytest.mark.parametrize("model", ["m", "t"])  # tool-call arguments in fragments (vLLM) and whole (Ollama)
def test_messages_tool_use_round_trip(gw: Any, model: str) -> None:
    """tool_use comes back with parsed input and stop_reason tool_use, streamed or not; the tool_result sent
    back is answered in text."""
    client = _claude(gw)
    msgs: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
    msg = client.messages.create(model=model, max_tokens=64, messages=msgs, tools=[TOOL])
    call = next(b for b in msg.content if b.type == "tool_use")
    assert msg.stop_reason == "tool_use" and call.name == "get_weather" and isinstance(call.input["city"], str)
    with client.messages.stream(
        model=model, max_tokens=64, messages=msgs, tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"}
    ) as s:
        streamed = s.get_final_message()
    scall = next(b for b in streamed.content if b.type == "tool_use")
    assert (scall.name, scall.input, streamed.stop_reason) == ("get_weather", call.input, "tool_use")
    msgs += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]},
    ]
    answer = client.messages.create(model=model, max_tokens=64, messages=msgs, tools=[TOOL])
    assert answer.stop_reason == "end_turn" and any(b.type == "text" and b.text for b in answer.content)


def test_messages_stop_sequences_and_count_tokens(gw: Any) -> None:
    """stop_sequences ends the text before the stop string; count_tokens answers the engine's prompt count
    (the same as a real request's input_tokens)."""
    client = _claude(gw)
    msg = client.messages.create(
        model="m", max_tokens=64, stop_sequences=[" tok2"], messages=[{"role": "user", "content": "count"}]
    )
    assert msg.content[-1].text == " tok0 tok1"
    n = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "count"}])
    assert n.input_tokens == msg.usage.input_tokens > 0


def test_messages_errors_in_anthropic_shape(gw: Any) -> None:
    """Bad input, an over-cap max_tokens (refused like chat's), a wrong key, a rate limit and a dead
    backend: each the SDK's exception for its status with Anthropic's error type; x-api-key and Bearer
    both authenticate."""
    client = _claude(gw)
    hello = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", max_tokens=LIMIT + 1, messages=hello)  # type: ignore[arg-type]
    assert e.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert f"limit of {LIMIT}" in e.value.body["error"]["message"]  # type: ignore[index]
    r = httpx.post(gw.root + "/v1/messages", headers={"x-api-key": gw.key}, json={"model": "m", "messages": hello})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("'max_tokens' is required")
    assert r.json()["type"] == "error" and r.json()["request_id"] == r.headers["x-request-id"]
    with pytest.raises(anthropic.AuthenticationError) as e:
        _claude(gw, "sk-sl-k1-" + "0" * 64).messages.create(model="m", max_tokens=8, messages=hello)  # type: ignore[arg-type]
    assert e.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    bearer = anthropic.Anthropic(base_url=gw.root, auth_token=gw.key, max_retries=0)
    assert bearer.messages.create(model="m", max_tokens=4, messages=hello).usage.output_tokens == 4  # type: ignore[arg-type]
    # an empty x-api-key (a proxy or client that sets the header unconditionally) does not hide the Bearer key
    r = httpx.post(
        gw.root + "/v1/messages",
        headers={"x-api-key": "", "Authorization": f"Bearer {gw.key}"},
        json={"model": "m", "max_tokens": 2, "messages": hello},
    )
    assert r.status_code == 200, r.text
    r = httpx.post(
        gw.root + "/v1/messages", headers={"x-api-key": ""}, json={"model": "m", "max_tokens": 2, "messages": hello}
    )
    assert r.status_code == 401 and "x-api-key: sk-sl-" in r.json()["error"]["message"], r.text
    with pytest.raises(anthropic.InternalServerError) as e:
        client.messages.create(model="dead", max_tokens=8, messages=hello)  # type: ignore[arg-type]
    assert e.value.status_code == 503 and e.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert "127.0.0.1" not in str(e.value.body)
    slow = _claude(gw, gw.slow)
    slow.messages.create(model="m", max_tokens=2, messages=hello)  # type: ignore[arg-type]
    with pytest.raises(anthropic.RateLimitError) as e:
        slow.messages.create(model="m", max_tokens=2, messages=hello)  # type: ignore[arg-type]
    assert e.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError, match="server tool"):
        client.messages.create(
            model="m",
            max_tokens=8,
            messages=hello,  # type: ignore[arg-type]
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
        )  # type: ignore[list-item]


def test_messages_paths_unknown_or_wrong_method_answer_in_anthropic_shape(gw: Any) -> None:
    """``GET /v1/messages`` (405) and ``POST /v1/messages/batches`` (404) answered in OpenAI's error shape;
    under /v1/messages the Anthropic SDK parses Anthropic's. Other paths keep OpenAI's."""
    r = httpx.get(gw.root + "/v1/messages", headers={"x-api-key": gw.key})
    assert r.status_code == 405 and r.headers["allow"] == "POST", r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert r.json()["request_id"] == r.headers["x-request-id"]
    r = httpx.post(gw.root + "/v1/messages/batches", headers={"x-api-key": gw.key}, json={"requests": []})
    assert r.status_code == 404 and r.json()["type"] == "error", r.text
    assert r.json()["error"]["type"] == "not_found_error" and "no such endpoint" in r.json()["error"]["message"]
    r = httpx.get(gw.root + "/v1/chat/completions", headers={"Authorization": f"Bearer {gw.key}"})
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed", r.text


# ------------------------------------------------------------------------------------------ OpenAI Responses


def test_responses_create_and_ledger_usage(gw: Any) -> None:
    """input as text with instructions: reasoning and message items, output_text, usage = the ledger's row;
    max_output_tokens cuts it (status incomplete)."""
    raw = _oai(gw).responses.with_raw_response.create(model="m", input="hello", instructions="be brief")
    resp = raw.parse()
    assert [o.type for o in resp.output] == ["reasoning", "message"]
    assert resp.output_text == " tok0 tok1 tok2 tok3 tok4 tok5" and resp.status == "completed"
    assert resp.store is False and resp.id == f"resp_{raw.headers['x-request-id']}"
    assert resp.usage is not None
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == ledger_usage(gw.db, raw.headers["x-request-id"])
    cut = _oai(gw).responses.create(model="m", input="hello", max_output_tokens=4)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"


def test_responses_stream_event_sequence_exact(gw: Any) -> None:
    """The typed stream as sent, event by event, sequence numbers 0, 1, 2, ...; the terminal event carries
    the whole output and the ledger's usage; the SDK parses every event."""
    body = {"model": "m", "input": [{"role": "user", "content": "hi"}], "stream": True, "max_output_tokens": 5}
    rid, events = sse_events(gw.root, "/v1/responses", body, {"Authorization": f"Bearer {gw.key}"})
    assert all(name == data["type"] for name, data in events)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert [n for n, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    usage = events[-1][1]["response"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == ledger_usage(gw.db, rid)
    parsed = list(_oai(gw).responses.create(**body))
    assert [e.type for e in parsed] == [n for n, _ in events]
    done = parsed[-1].response  # type: ignore[union-attr]
    assert done.output_text == " tok0 tok1 tok2" and done.usage is not None and done.usage.output_tokens == 5


@pytest.mark.parametrize("model", ["m", "t"])
def test_responses_function_call_round_trip(gw: Any, model: str) -> None:
    """A function_call item (streamed: argument deltas then done), and its function_call_output sent back
    as input is answered in text."""
    client = _oai(gw)
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": TOOL["input_schema"]}]
    stream = client.responses.create(model=model, input="weather?", tools=tools, stream=True)
    events = list(stream)
    assert "response.function_call_arguments.delta" in [e.type for e in events]
    call = next(o for o in events[-1].response.output if o.type == "function_call")  # type: ignore[union-attr]
    assert call.name == "get_weather" and "city" in call.arguments
    answer = client.responses.create(
        model=model,
        tools=tools,
        input=[
            {"role": "user", "content": "weather?"},
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
    )
    assert answer.output_text and answer.status == "completed"


def test_responses_refusals(gw: Any) -> None:
    """previous_response_id (stateless gateway), an over-cap max_output_tokens named as such, a built-in
    tool: OpenAI-shaped 400s naming the field."""
    client = _oai(gw)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input="x", previous_response_id="resp_1")
    assert e.value.param == "previous_response_id" and "keeps no responses" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input="x", max_output_tokens=LIMIT + 1)
    assert e.value.param == "max_output_tokens" and e.value.code == "max_tokens_too_large"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input="x", tools=[{"type": "web_search"}])  # type: ignore[list-item]
    assert e.value.param == "tools[0]"
