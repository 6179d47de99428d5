"""Native pass-through decisions in-process (servelab.gateway.apis.native): which backends get a Messages body
unchanged, and what of admission's decisions that body carries. The end-to-end proof against the real
llama-server is tests/gateway/test_apis_llama.py."""

from __future__ import annotations

from typing import Any

import pytest

from servelab.gateway.apis.messages import CountTokensApi, MessagesApi
from servelab.gateway.apis.native import native_body, serves_natively
from servelab.gateway.apis.responses import ResponsesApi
from servelab.gateway.config import Backend


def _backend(kind: str, native: list[str] | None = None) -> Backend:
    return Backend(name="b", kind=kind, base_url="http://127.0.0.1:9", models=["m"], native_apis=native)


@pytest.mark.parametrize(
    ("kind", "native", "api", "expected"),
    [
        ("llamacpp", None, "messages", True),
        ("vllm", None, "messages", True),
        ("sglang", None, "messages", False),
        ("mock", None, "messages", False),
        ("ollama", None, "messages", False),
        ("llamacpp", [], "messages", False),  # the operator's "always translate"
        ("openai", ["messages"], "messages", True),  # the operator's "this one serves it"
        ("vllm", None, None, False),  # an API that is always translated
    ],
)
def test_serves_natively_by_kind_and_override(
    kind: str, native: list[str] | None, api: str | None, expected: bool
) -> None:
    assert serves_natively(_backend(kind, native), api) is expected


def test_messages_and_responses_requests_are_passed_through() -> None:
    assert MessagesApi.native == "messages" and ResponsesApi.native == "responses"
    assert CountTokensApi.native is None


@pytest.mark.parametrize(
    ("kind", "native", "expected"),
    [
        ("vllm", None, False),  # vLLM doubles a template's BOS on /v1/responses (wire/dialects.py): opt-in only
        ("vllm", ["messages", "responses"], True),
        ("llamacpp", None, False),
        ("mock", None, False),
        ("mock", ["responses"], True),
    ],
)
def test_responses_served_natively_only_where_a_backend_opts_in(
    kind: str, native: list[str] | None, expected: bool
) -> None:
    assert serves_natively(_backend(kind, native), "responses") is expected


def test_native_responses_body_carries_admissions_decisions() -> None:
    source = {
        "model": "public",
        "input": "hi",
        "instructions": "be brief",
        "max_output_tokens": 500,
        "temperature": 1.7,
        "metadata": {"k": "v"},
        "user": "u1",
        "safety_identifier": "s",
        "service_tier": "auto",
        "prompt_cache_key": "p",
        "store": True,
        "stream": True,
        "stream_options": {"include_obfuscation": False},
        "reasoning": {"effort": "low"},
    }
    chat = {"temperature": 1.0, "top_p": 0.9, "top_k": 5, "stop": ["END"]}
    up = native_body(source, chat, "engine-model", 128, "responses")
    assert up["model"] == "engine-model" and up["max_output_tokens"] == 128 and "max_tokens" not in up
    assert (up["temperature"], up["top_p"]) == (1.0, 0.9)
    assert "top_k" not in up and "stop" not in up and "stop_sequences" not in up  # Responses has neither
    assert up["store"] is False  # the gateway keeps no responses: the engine must not either
    for k in ("metadata", "user", "safety_identifier", "service_tier", "prompt_cache_key", "stream_options"):
        assert k not in up, k
    assert (up["input"], up["instructions"], up["reasoning"], up["stream"]) == (
        "hi",
        "be brief",
        {"effort": "low"},
        True,
    )
    assert source["max_output_tokens"] == 500 and source["store"] is True  # the client's body is not changed
    assert native_body(source, {}, "e", 1000, "responses")["max_output_tokens"] == 500
    assert native_body({"input": "x"}, {}, "e", 64, "responses")["max_output_tokens"] == 64  # absent: the cap


def test_native_body_carries_admissions_decisions() -> None:
    source = {
        "model": "public",
        "max_tokens": 500,
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 1.7,
        "top_k": 5,
        "metadata": {"user_id": "u1"},
        "stream": True,
        "stop_sequences": ["x"],
    }
    # the chat translation after policy: temperature clamped, top_k left, a stop list, top_p defaulted
    chat = {"temperature": 1.0, "top_k": 5, "top_p": 0.9, "stop": ["x", "END"]}
    up = native_body(source, chat, "engine-model", 128)
    assert up["model"] == "engine-model" and up["max_tokens"] == 128
    assert (up["temperature"], up["top_k"], up["top_p"]) == (1.0, 5, 0.9)
    assert up["stop_sequences"] == ["x", "END"]
    assert "metadata" not in up and up["stream"] is True and up["messages"] == source["messages"]
    assert source["max_tokens"] == 500  # the client's body is not changed
    assert native_body(source, {}, "e", 1000)["max_tokens"] == 500  # never above what the client asked
    bare = native_body(source, {}, "e", 0)  # no policy decision: the client's own sampling is not kept either
    assert "temperature" not in bare and "stop_sequences" not in bare


def _engine_that_dies_mid_stream() -> tuple[str, Any]:
    """An Anthropic-speaking server on a thread (an engine fault no real engine can be made to show on cue):
    ``/v1/messages`` streams message_start, one text delta, then closes the connection."""
    import asyncio
    import json
    import threading

    from aiohttp import web

    def ev(name: str, data: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

    async def messages(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(
            ev(
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_e",
                        "type": "message",
                        "role": "assistant",
                        "model": "/srv/models/secret.gguf",
                        "content": [],
                        "stop_reason": None,
                        "usage": {"input_tokens": 3, "output_tokens": 0},
                    },
                },
            )
        )
        await resp.write(
            ev(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            )
        )
        await resp.write(
            ev(
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hello"}},
            )
        )
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.close()
        return resp

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/messages", messages)
    app.router.add_get("/health", ok)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)

    return f"http://127.0.0.1:{port}", stop


def test_pass_through_stream_cut_mid_way_ends_in_one_error_event(gateway: Any) -> None:
    """The engine's own message_start opened the stream: a cut after it adds only an ``error`` event (no
    second message_start or ping), scrubbed, and the model name the client sees is the public one."""
    from conftest import gateway_key, sse_events

    base, stop = _engine_that_dies_mid_stream()
    try:
        key, entry = gateway_key("k1", "t")
        gw = gateway(
            {
                "backends": [{"name": "v", "kind": "vllm", "base_url": base, "models": ["m"]}],
                "models": {"pub": {"targets": [{"backend": "v"}]}},
                "retry": {"attempts": 0},
                "tenants": {"t": {}},
                "keys": [entry],
            }
        )
        _, evs = sse_events(
            gw.root,
            "/v1/messages",
            {"model": "pub", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            {"x-api-key": key, "anthropic-version": "2023-06-01"},
        )
    finally:
        stop()
    names = [n for n, _ in evs]
    assert names == ["message_start", "content_block_start", "content_block_delta", "error"], names
    assert evs[0][1]["message"]["model"] == "pub"
    err = evs[-1][1]
    assert err["type"] == "error" and err["error"]["type"] == "api_error"
    assert "127.0.0.1" not in err["error"]["message"] and "/srv" not in err["error"]["message"]
