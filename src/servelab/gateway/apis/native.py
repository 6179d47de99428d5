"""Native pass-through: an API request forwarded unchanged to a backend whose engine serves that API itself.

vLLM (``vllm/entrypoints/anthropic``, vllm-project/vllm#21313) and llama-server (ggml-org/llama.cpp PR
#17570) serve Anthropic ``POST /v1/messages``; the dialect table says so per kind
(:attr:`servelab.wire.dialects.Dialect.native_apis`) and a backend may override it (``native_apis``;
``[]`` = always translate). For such a target the gateway sends the client's own Messages body instead of
its chat translation, so the engine's own Anthropic support (its template, thinking, tool parsing) answers.

Admission is the translated request's, unchanged: keys and permissions, limits and budgets, the output
cap, sampling policy and degrade rules are decided on the chat translation, and the forwarded body carries
their outcome (:func:`native_body`): ``model`` = the target's upstream name, ``max_tokens`` = the
request's output bound (never above ``r.out_cap``), ``temperature``/``top_p``/``top_k`` and
``stop_sequences`` as the policy left them; ``metadata`` and ``service_tier`` are dropped as in the
translation. The answer is relayed as the engine sent it (:func:`pipe`), with the public model name in
``model``. Usage comes from the API's own fields (:func:`servelab.wire.apis.usage_counts`): prompt tokens =
``input_tokens`` + ``cache_read_input_tokens`` + ``cache_creation_input_tokens`` (Anthropic's
``input_tokens`` excludes cached tokens, and llama-server reports its prompt cache there), completion
tokens = ``output_tokens``: that is what the ledger records. The stream's TTFT is its first content
delta (``content_block_delta``), never ``message_start``. An error event from the engine is never
forwarded: before the first byte it is a retryable failure like any other, after it one Anthropic
``error`` event with the gateway's scrubbed message (and no second ``message_start``: the engine's opened
the stream).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from servelab.gateway import degrade, scrub
from servelab.gateway.apis import StreamingApi
from servelab.gateway.config import Backend
from servelab.gateway.errors import GatewayError
from servelab.gateway.metrics import GatewayMetrics
from servelab.gateway.relay import Relay, public_model, whole_answer
from servelab.gateway.reqstate import RequestState, UpstreamFailed
from servelab.gateway.sse import events, split_complete
from servelab.wire.apis import ANTHROPIC_VERSION, MessagesStreamParser, usage_counts
from servelab.wire.dialects import dialect_of
from servelab.wire.types import RequestRecord

__all__ = ["NATIVE_PATH", "native_body", "native_headers", "pipe", "serves_natively"]

log = logging.getLogger("servelab.gateway")
_now = time.monotonic_ns

#: the engine path of each API forwarded natively
NATIVE_PATH = {"messages": "/v1/messages"}
#: client fields the translation does not forward either (a user id is not the engine's business)
_DROPPED = ("metadata", "service_tier")
_SAMPLING = ("temperature", "top_p", "top_k")


def serves_natively(backend: Backend, api: str | None) -> bool:
    """True when ``backend`` is to get requests of ``api`` unchanged: its ``native_apis`` when set, else
    its kind's (dialect table)."""
    if api is None or api not in NATIVE_PATH:
        return False
    if backend.native_apis is not None:
        return api in backend.native_apis
    d = dialect_of(backend.kind)
    return d is not None and api in d.native_apis


def native_body(source: dict[str, Any], chat: dict[str, Any], upstream_model: str, out_cap: int) -> dict[str, Any]:
    """The Messages body for the engine (module doc): the client's ``source`` with the decisions admission
    took on its chat translation ``chat`` (sampling, stop strings) and the output bound ``out_cap``
    (tokens; 0 = the client's own)."""
    up = {k: v for k, v in source.items() if k not in _DROPPED}
    up["model"] = upstream_model
    asked = source.get("max_tokens")
    if out_cap:
        up["max_tokens"] = min(asked, out_cap) if isinstance(asked, int) else out_cap
    for k in _SAMPLING:
        if k in chat:
            up[k] = chat[k]
        else:
            up.pop(k, None)
    stop = chat.get("stop")
    if stop:
        up["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    else:
        up.pop("stop_sequences", None)
    return up


def native_headers(base: dict[str, str]) -> dict[str, str]:
    """``base`` plus the ``anthropic-version`` the Anthropic SDKs send (engines accept it or ignore it)."""
    return {**base, "anthropic-version": ANTHROPIC_VERSION}


def _take_usage(r: RequestState, usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    prompt, completion, _ = usage_counts(usage)
    if prompt is not None:
        r.prompt_tokens = prompt
    if completion is not None:
        r.completion_tokens = completion


async def pipe(
    metrics: GatewayMetrics, relay: Relay, request: web.Request, hide: tuple[str, ...], r: RequestState, resp: Any
) -> tuple[web.StreamResponse, bool | None]:
    """Relay a native answer, whole or streamed (module doc). Returns (response, complete) as
    :meth:`servelab.gateway.relay.Relay.pipe_stream` does; raises :class:`UpstreamFailed` when it fails
    before any byte reached the client."""
    if r.stream and "text/event-stream" in resp.headers.get("Content-Type", ""):
        return await _stream(metrics, relay, request, hide, r, resp)
    return await _whole(hide, r, resp)


async def _whole(hide: tuple[str, ...], r: RequestState, resp: Any) -> tuple[web.StreamResponse, bool]:
    raw = await resp.read()
    ev = whole_answer(raw, r, hide)
    if not (isinstance(ev, dict) and isinstance(ev.get("content"), list)):
        gerr = GatewayError(502, "the model answered in an unknown shape; retry", type="server_error")
        raise UpstreamFailed(gerr, True, "protocol")
    _take_usage(r, ev.get("usage"))
    r.served = True
    r.status = 200
    r.ttft_ns = _now() - r.t0_ns
    if r.shadow is not None:  # what the client got, as the shadow report compares it
        rec = RequestRecord(request_id=0)
        rec.content.extend(b["text"] for b in ev["content"] if isinstance(b, dict) and isinstance(b.get("text"), str))
        r.shadow.capture.rec = rec
    sent = public_model(raw, r)
    return web.Response(
        body=sent, content_type="application/json", headers={"X-Request-ID": r.rid, "request-id": r.rid}
    ), True


def _screen(block: bytes, hide: tuple[str, ...], r: RequestState) -> tuple[bytes, GatewayError | None]:
    """``block`` up to its first error event (never forwarded: engine text), and that error scrubbed."""
    if b'"error"' not in block:
        return block, None
    kept: list[bytes] = []
    for ev_bytes, payload in events(block):
        try:
            ev = orjson.loads(payload) if payload else None
        except orjson.JSONDecodeError:
            ev = None
        gerr = scrub.from_event(ev, r.rid, r.backend, hide) if isinstance(ev, dict) else None
        if gerr is not None:
            return (b"\n\n".join(kept) + b"\n\n") if kept else b"", gerr
        kept.append(ev_bytes)
    return block, None


async def _stream(
    metrics: GatewayMetrics, relay: Relay, request: web.Request, hide: tuple[str, ...], r: RequestState, resp: Any
) -> tuple[web.StreamResponse, bool | None]:
    rec = RequestRecord(request_id=0)
    parser = MessagesStreamParser(rec)
    ttft_h, itl, _, _ = metrics.model(r.model, r.backend)
    out: web.StreamResponse | None = None
    buf = b""
    error: GatewayError | None = None
    last_ns = 0
    try:
        async for data in resp.content.iter_any():
            buf = buf + data if buf else data
            split = split_complete(buf)
            if split is None:
                continue
            block, buf = split
            block, error = _screen(block, hide, r)
            if error is not None and out is None and not block:
                raise UpstreamFailed(error, degrade.another_target(error), "stream_error")
            t = _now()
            before = len(rec.chunk_ns)
            parser.feed(block, t)
            ntok = len(rec.chunk_ns) - before
            r.token_events += ntok
            _take_usage(r, rec.usage)
            if b'"model"' in block:
                block = public_model(block, r)
            if block:
                try:
                    if out is None:
                        out, _ = await relay.prepare(request, r)
                    await out.write(block)
                except (ConnectionResetError, aiohttp.ClientConnectionResetError):
                    r.outcome = "client_disconnect"
                    return (out if out is not None else web.Response(status=499)), None
            if ntok:
                if r.ttft_ns is None:
                    r.ttft_ns = t - r.t0_ns
                    ttft_h.observe(r.ttft_ns / 1e9)
                    r.timeline.mark("first_token", None, t)
                    ntok -= 1
                elif last_ns and ntok:
                    itl.add((t - last_ns) / 1e9 / ntok, ntok)
                last_ns = t
            if rec.saw_done or error is not None:
                break
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, TimeoutError) as e:
        if out is None:
            raise
        log.info("request %s: upstream stream broke after the first byte: %s", r.rid, type(e).__name__)
    except asyncio.CancelledError:
        raise
    if last_ns:
        r.timeline.mark("last_token", None, last_ns)
    if out is None:
        raise UpstreamFailed(
            GatewayError(
                502,
                "the model closed the connection without answering; retry",
                type="server_error",
                code="upstream_error",
            ),
            True,
            "connect",
        )
    if error is None and not rec.saw_done:
        error = GatewayError(
            502, "the model stopped answering mid-way; retry the request", type="server_error", code="upstream_cut_off"
        )
    if r.shadow is not None:
        r.shadow.capture.rec = rec
    if error is not None:
        await _fail(metrics, r, out, error)
    await out.write_eof()
    return out, error is None


async def _fail(metrics: GatewayMetrics, r: RequestState, out: web.StreamResponse, error: GatewayError) -> None:
    """End a stream the engine opened with the API's error event alone: the engine's own ``message_start``
    is already with the client, so the adapter's opening events are not sent again."""
    metrics.stream_errors.labels(r.model, r.backend or "none").inc()
    r.outcome = "error"
    r.error_code = error.code
    assert r.api is not None
    if isinstance(r.api, StreamingApi):
        r.api.started = True
    await out.write(r.api.stream_error(error, r))
