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

A backend that lists ``responses`` in ``native_apis`` gets OpenAI Responses ``POST /v1/responses`` unchanged
(vLLM serves it in ``vllm/entrypoints/openai/responses``, but no kind does by default: see the vllm entry of
:mod:`servelab.wire.dialects` for the doubled BOS token on that route); the same rules apply with
Responses' fields. The body keeps the client's ``input``, ``instructions``, tools, ``text``, ``reasoning``
and ``include`` (the engine's own support answers); ``max_output_tokens`` is bounded
by ``r.out_cap`` as ``max_tokens`` is; ``temperature``/``top_p`` are the policy's outcome (Responses has no
``top_k`` or stop strings: a policy's ``top_k``/``stop`` are not carried to a Responses engine);
``store: false`` is always sent (this gateway keeps no responses and refuses ``previous_response_id``
before routing, so an engine-side store would only hold prompts nobody can read back); ``metadata``,
``user``, ``safety_identifier``, ``service_tier``, ``prompt_cache_key`` and ``stream_options`` are dropped
as in the translation. Usage: Responses' ``input_tokens`` already counts its cached tokens
(``input_tokens_details.cached_tokens`` is a part of it), unlike Anthropic's. The stream's TTFT is its
first content delta (``response.output_text.delta``...), never ``response.created``; an engine ``error``
or ``response.failed`` event is never forwarded: before the first byte a retryable failure, after it one
``response.failed`` from the adapter, numbered after the engine's last ``sequence_number``.
"""

from __future__ import annotations

import asyncio
import logging
import re
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
from servelab.wire.apis import ANTHROPIC_VERSION, MessagesStreamParser, ResponsesStreamParser, usage_counts
from servelab.wire.dialects import dialect_of
from servelab.wire.types import RequestRecord

__all__ = ["CAP_FIELD", "NATIVE_PATH", "native_body", "native_headers", "pipe", "serves_natively"]

log = logging.getLogger("servelab.gateway")
_now = time.monotonic_ns

#: the engine path of each API forwarded natively
NATIVE_PATH = {"messages": "/v1/messages", "responses": "/v1/responses"}
#: each API's output-length field (bounded by the request's output cap)
CAP_FIELD = {"messages": "max_tokens", "responses": "max_output_tokens"}
#: client fields the translation does not forward either (a user id is not the engine's business)
_DROPPED = {
    "messages": ("metadata", "service_tier"),
    "responses": ("metadata", "user", "safety_identifier", "service_tier", "prompt_cache_key", "stream_options"),
}
#: the sampling fields each API has (taken from the policy's outcome on the chat translation)
_SAMPLING = {"messages": ("temperature", "top_p", "top_k"), "responses": ("temperature", "top_p")}
_PARSER = {"messages": MessagesStreamParser, "responses": ResponsesStreamParser}
_SEQ = re.compile(rb'"sequence_number":\s*(\d+)')


def serves_natively(backend: Backend, api: str | None) -> bool:
    """True when ``backend`` is to get requests of ``api`` unchanged: its ``native_apis`` when set, else
    its kind's (dialect table)."""
    if api is None or api not in NATIVE_PATH:
        return False
    if backend.native_apis is not None:
        return api in backend.native_apis
    d = dialect_of(backend.kind)
    return d is not None and api in d.native_apis


def native_body(
    source: dict[str, Any], chat: dict[str, Any], upstream_model: str, out_cap: int, api: str = "messages"
) -> dict[str, Any]:
    """The ``api`` body for the engine (module doc): the client's ``source`` with the decisions admission
    took on its chat translation ``chat`` (sampling, stop strings) and the output bound ``out_cap``
    (tokens; 0 = the client's own)."""
    up = {k: v for k, v in source.items() if k not in _DROPPED[api]}
    up["model"] = upstream_model
    field = CAP_FIELD[api]
    asked = source.get(field)
    if out_cap:
        up[field] = min(asked, out_cap) if isinstance(asked, int) else out_cap
    for k in _SAMPLING[api]:
        if k in chat:
            up[k] = chat[k]
        else:
            up.pop(k, None)
    if api == "responses":
        up["store"] = False
        return up
    stop = chat.get("stop")
    if stop:
        up["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    else:
        up.pop("stop_sequences", None)
    return up


def native_headers(base: dict[str, str], api: str = "messages") -> dict[str, str]:
    """``base`` plus, for Messages, the ``anthropic-version`` the Anthropic SDKs send (engines accept it or
    ignore it)."""
    return {**base, "anthropic-version": ANTHROPIC_VERSION} if api == "messages" else base


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


def _api(r: RequestState) -> str:
    return r.api.native if r.api is not None and r.api.native else "messages"


def _texts(api: str, ev: Any) -> list[str] | None:
    """The answer texts of a whole ``api`` answer ``ev`` (Messages ``text`` blocks; Responses ``output_text``
    parts of its ``message`` items), None when ``ev`` is not of the API's shape."""
    if not isinstance(ev, dict):
        return None
    if api == "responses":
        if ev.get("object") != "response" or not isinstance(ev.get("output"), list):
            return None
        parts = [
            p
            for it in ev["output"]
            if isinstance(it, dict) and it.get("type") == "message" and isinstance(it.get("content"), list)
            for p in it["content"]
        ]
        return [p["text"] for p in parts if isinstance(p, dict) and p.get("type") == "output_text" and _is_str(p)]
    if not isinstance(ev.get("content"), list):
        return None
    return [b["text"] for b in ev["content"] if isinstance(b, dict) and _is_str(b)]


def _is_str(d: dict[str, Any]) -> bool:
    return isinstance(d.get("text"), str)


async def _whole(hide: tuple[str, ...], r: RequestState, resp: Any) -> tuple[web.StreamResponse, bool]:
    raw = await resp.read()
    ev = whole_answer(raw, r, hide)
    texts = _texts(_api(r), ev)
    if texts is None:
        gerr = GatewayError(502, "the model answered in an unknown shape; retry", type="server_error")
        raise UpstreamFailed(gerr, True, "protocol")
    assert isinstance(ev, dict)
    if ev.get("status") == "failed":  # a Responses object that failed: an engine error, never relayed
        gerr = scrub.from_event({"error": ev.get("error") or {}}, r.rid, r.backend, hide) or GatewayError(
            502, "the model failed to answer; retry", type="server_error"
        )
        raise UpstreamFailed(gerr, degrade.another_target(gerr), "protocol")
    _take_usage(r, ev.get("usage"))
    r.served = True
    r.status = 200
    r.ttft_ns = _now() - r.t0_ns
    if r.shadow is not None:  # what the client got, as the shadow report compares it
        rec = RequestRecord(request_id=0)
        rec.content.extend(texts)
        r.shadow.capture.rec = rec
    sent = public_model(raw, r)
    return web.Response(
        body=sent, content_type="application/json", headers={"X-Request-ID": r.rid, "request-id": r.rid}
    ), True


def _screen(block: bytes, hide: tuple[str, ...], r: RequestState) -> tuple[bytes, GatewayError | None]:
    """``block`` up to its first error event (never forwarded: engine text), and that error scrubbed."""
    if b'"error"' not in block and b"response.failed" not in block:
        return block, None
    kept: list[bytes] = []
    for ev_bytes, payload in events(block):
        try:
            ev = orjson.loads(payload) if payload else None
        except orjson.JSONDecodeError:
            ev = None
        gerr = scrub.from_event(_error_of(ev), r.rid, r.backend, hide) if isinstance(ev, dict) else None
        if gerr is not None:
            return (b"\n\n".join(kept) + b"\n\n") if kept else b"", gerr
        kept.append(ev_bytes)
    return block, None


def _error_of(ev: dict[str, Any]) -> dict[str, Any]:
    """``ev`` in the ``{"error": {...}}`` shape the scrubber reads: a Responses ``error`` event carries its
    message at the top, ``response.failed`` in ``response.error`` (with ``{}`` for a failure without one)."""
    kind = ev.get("type")
    if kind == "error" and "error" not in ev:
        return {"error": {k: ev.get(k) for k in ("message", "code", "type") if ev.get(k) is not None}}
    if kind == "response.failed":
        resp = ev.get("response")
        err = resp.get("error") if isinstance(resp, dict) else None
        return {"error": err if isinstance(err, dict) else {"message": "response.failed"}}
    return ev


def _last_seq(block: bytes, seq: int) -> int:
    """The last Responses ``sequence_number`` in ``block``, else ``seq``."""
    found = _SEQ.findall(block)
    return int(found[-1]) if found else seq


async def _stream(
    metrics: GatewayMetrics, relay: Relay, request: web.Request, hide: tuple[str, ...], r: RequestState, resp: Any
) -> tuple[web.StreamResponse, bool | None]:
    rec = RequestRecord(request_id=0)
    parser = _PARSER[_api(r)](rec)
    seq = -1  # the engine's last sequence_number (Responses)
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
            seq = _last_seq(block, seq)
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
        await _fail(metrics, r, out, error, seq)
    r.upstream_done = rec.saw_done and error is None
    await out.write_eof()
    return out, error is None


async def _fail(
    metrics: GatewayMetrics, r: RequestState, out: web.StreamResponse, error: GatewayError, seq: int
) -> None:
    """End a stream the engine opened with the API's error event alone: the engine's own ``message_start``
    / ``response.created`` is already with the client, so the adapter's opening events are not sent again;
    a Responses ``response.failed`` is numbered after the engine's last ``sequence_number`` ``seq``."""
    metrics.stream_errors.labels(r.model, r.backend or "none").inc()
    r.outcome = "error"
    r.error_code = error.code
    assert r.api is not None
    if isinstance(r.api, StreamingApi):
        r.api.started = True
    if seq >= 0 and hasattr(r.api, "seq"):
        r.api.seq = seq + 1
    await out.write(r.api.stream_error(error, r))
