"""The gateway keeps its upstream keep-alive connections across streamed requests
(servelab.gateway.relay.drain_tail): an engine's chunked stream ends with ``data: [DONE]`` and then its closing
chunk, often in a later TCP segment; a response closed before that end of body closes its connection, so the
next request would open a new one. An engine served from this process (aiohttp, in a thread) sends the closing
chunk a set delay after ``[DONE]``: within the gateway's wait the connection is reused by the next request (the
access log's ``connected`` event says ``reused: true``); far beyond it the connection is given up (a new one
next time) and the request's E2E does not include the wait."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web
from conftest import gateway_key

from servelab.gateway.explain import find_record
from servelab.wire.errors import ConfigError

CHUNK = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m"}


class Engine:
    """A chat-completions stream server in a thread; ``delay_s``: the wait between ``[DONE]`` and the end of
    the chunked body."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait(10)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ch in (
            {
                **CHUNK,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": None}],
            },
            {
                **CHUNK,
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            },
        ):
            await resp.write(b"data: " + orjson.dumps(ch) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await asyncio.sleep(self.delay_s)
        with contextlib.suppress(ConnectionResetError):  # the gateway gave up waiting and closed the connection
            await resp.write_eof()
        return resp

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()
        self.loop.run_forever()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture()
def engine() -> Iterator[Engine]:
    e = Engine()
    try:
        yield e
    finally:
        e.stop()


def _connected(gw: Any, key: str) -> tuple[list[Any], float]:
    r = httpx.post(
        gw.url + "/chat/completions",
        json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert r.status_code == 200 and b"[DONE]" in r.content, r.content
    deadline = time.monotonic() + 5
    while True:  # the access-log line is written just after the answer
        try:
            rec = find_record(gw.access_log, r.headers["x-request-id"])
            break
        except ConfigError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    return [e[2] for e in rec["timeline"] if e[0] == "connected"], rec["e2e_ms"]


def test_the_next_request_reuses_the_connection_and_a_slow_end_of_body_is_given_up(gateway, engine) -> None:
    key, entry = gateway_key("k1", "t")
    gw = gateway(
        {
            "backends": [{"name": "b", "kind": "vllm", "base_url": f"http://127.0.0.1:{engine.port}", "models": ["m"]}],
            "models": {"m": {"targets": [{"backend": "b"}]}},
            "tenants": {"t": {}},
            "keys": [entry],
            "health": {"enabled": False},
        }
    )
    engine.delay_s = 0.01  # the closing chunk 10 ms after [DONE]: read, the connection goes back to the pool
    assert _connected(gw, key)[0] == [{"reused": False}]
    assert _connected(gw, key)[0] == [{"reused": True}]
    engine.delay_s = 1.0  # far beyond the wait: this connection is closed, not waited for
    got, e2e_ms = _connected(gw, key)
    assert got == [{"reused": True}] and e2e_ms < 1000, (got, e2e_ms)
    engine.delay_s = 0.0
    assert _connected(gw, key)[0] == [{"reused": False}]
