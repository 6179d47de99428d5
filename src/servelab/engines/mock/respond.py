"""How the mock engine writes one planned answer of ``/v1/chat/completions`` or ``/v1/completions``
(:func:`respond`): streamed, each token-carrying chunk at its scheduled time (the fixed schedule
``recv + ttft_ms + i x itl_ms``, or the continuous-batching law of :mod:`servelab.engines.mock.batch`) in the
dialect's wire shape (:mod:`servelab.engines.mock.encoders`), or whole, as one JSON body after the last
token's time; with the injected failure the request drew (an error event, a cut connection, a stall then a
cut, an error status, or the crash of ``crash_after_requests``). Every write's time lands in the request's
:class:`~servelab.engines.mock.record.MockRecord`. Which requests are served, and from when, is
:mod:`servelab.engines.mock.admission`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from aiohttp import web

from servelab.engines.mock.batch import DecodeBatch
from servelab.engines.mock.cache import PrefixCache
from servelab.engines.mock.config import MockConfig
from servelab.engines.mock.encoders import DONE, HOLD_HEADERS, REASONING_FIELD, Encoder, error_body, stream_trailer
from servelab.engines.mock.plan import Plan
from servelab.engines.mock.record import MockRecord
from servelab.wire.dialects import stream_rules

__all__ = ["Answer", "Responder", "abort", "crash_now", "error_response", "respond"]

_now = time.monotonic_ns

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class Responder(Protocol):
    """What the writer uses of :class:`servelab.engines.mock.server.MockServer`."""

    config: MockConfig
    cache: PrefixCache | None
    batch: DecodeBatch | None
    completed: int
    received: int

    @property
    def delays_ns(self) -> tuple[int, int]: ...


@dataclass(frozen=True, slots=True)
class Answer:
    """One admitted ``/v1/chat/completions`` or ``/v1/completions`` request and the answer planned for it:
    what :func:`respond` writes."""

    request: web.Request
    rec: MockRecord
    """The request's record; the writer stamps its write times (monotonic ns) and status in it."""
    body: dict[str, Any]
    """The request's JSON body."""
    chat: bool
    """The chat route (else ``/v1/completions``)."""
    plan: Plan
    kind: str | None
    """The injected failure the writer plays (``stream_error``, ``cut_off``, ``hang`` or ``crash``), or None."""
    seq: int
    """The request's number on this server."""
    stream: bool
    """Streamed (SSE) rather than one JSON body."""


def error_response(dialect: str, status: int, message: str) -> web.Response:
    """An error answer with ``status`` and the dialect's error body saying ``message``."""
    return web.Response(status=status, body=error_body(dialect, status, message), content_type="application/json")


def crash_now(received: int) -> None:
    """Exit the process at once with status 3 (no cleanup, no flushing of Python buffers): the injected
    crash of ``crash_after_requests``. Bytes already handed to the kernel still reach the client."""
    with contextlib.suppress(OSError):
        os.write(
            2,
            f"servelab mock-engine: injected crash at completion request {received}; exiting with status 3\n".encode(),
        )
    os._exit(3)


def abort(request: web.Request) -> None:
    """Close the connection now (buffered bytes still go out): the body ends without its last chunk."""
    tr = request.transport
    if tr is not None:
        tr.close()


async def _fail_stream(
    server: Responder, request: web.Request, resp: web.StreamResponse, rec: MockRecord, enc: Encoder, kind: str | None
) -> web.StreamResponse:
    """Inject ``kind`` into a started stream: error event, cut connection, or stall then cut."""
    if not resp.prepared:
        await resp.prepare(request)
        rec.headers_ns = _now()
    if kind == "crash":
        writer = await resp.prepare(request)  # the prepared writer; held headers still buffered
        if callable(send_headers := getattr(writer, "send_headers", None)):
            send_headers()  # so the crash is mid-response: status line and headers went out
        crash_now(server.received)
    if kind == "stream_error":
        data = enc.error_event(server.config.error_message or "mock-engine injected error during generation")
        if enc.done_after_error:
            data += DONE
        await resp.write(data)
        if enc.done_after_error:
            await resp.write_eof()
        else:
            abort(request)
    elif kind == "hang":
        await asyncio.sleep(server.config.hang_s)
        abort(request)
    else:
        abort(request)
    rec.done_ns = _now()
    return resp


async def respond(server: Responder, a: Answer, origin: int) -> web.StreamResponse:
    """Write the answer ``a`` (``origin``: when service started, monotonic ns, the schedule's zero)."""
    rec = a.rec
    model = rec.model or server.config.model
    enc = Encoder(server.config, server.config.dialect, a.chat, model, a.seq, rec.prompt_tokens, a.plan)
    enc.cached = rec.cached_tokens
    if a.stream:
        so = a.body.get("stream_options")
        include_usage = isinstance(so, dict) and bool(so.get("include_usage"))
        return await _stream(server, a, enc, include_usage, origin)
    return await _whole(server, a, enc, model, origin)


async def _stream(server: Responder, a: Answer, enc: Encoder, include_usage: bool, origin: int) -> web.StreamResponse:
    request, rec, plan, kind = a.request, a.rec, a.plan, a.kind
    d = server.config.dialect
    ttft_ns, itl_ns = server.delays_ns
    law = server.batch
    delay = ttft_ns > 0 or itl_ns > 0 or law is not None
    target = gap = 0
    sleep = asyncio.sleep
    hold = d in HOLD_HEADERS
    resp = web.StreamResponse(status=200, headers=_SSE_HEADERS)
    resp.enable_chunked_encoding()
    rec.status = 200
    role = enc.role_chunk()
    if not hold:
        writer = await resp.prepare(request)
        rec.headers_ns = _now()
        if role:  # vLLM: headers and role chunk go out at once (case 20)
            await resp.write(role)
            role = b""
        elif callable(send_headers := getattr(writer, "send_headers", None)):
            send_headers()  # TGI, /v1/completions: headers at once, no body yet
        else:  # pragma: no cover - older aiohttp buffers headers until the first body bytes
            await resp.write(b": mock\n\n")
    chunks = plan.chunks
    n = len(chunks)
    cut_at = max(1, n // 2) if kind in ("stream_error", "cut_off") else (1 if kind == "hang" else -1)
    if kind == "crash":
        cut_at = n // 2  # 0 (before any token) when there are fewer than two chunks
    chat = enc.chat
    # the trailer after the last token chunk: finish, usage, [DONE] (one write with the last token)
    last_finish, last_usage, last_extra, trailer = stream_trailer(enc, plan, d, include_usage)
    write = resp.write
    token_write_ns = rec.token_write_ns
    token_counts = rec.token_counts
    first_tool = True
    try:
        for i in range(n):
            if i == cut_at:
                return await _fail_stream(server, request, resp, rec, enc, kind)
            ck, text, ntok = chunks[i]
            if i == n - 1:
                data = enc.token(ck, text, first_tool and ck == "t", last_finish, last_usage, last_extra) + trailer
            else:
                data = enc.token(ck, text, first_tool and ck == "t", None)
            if ck == "t":
                first_tool = False
            if delay:
                target = (
                    origin + ttft_ns + i * itl_ns
                    if law is None
                    else law.target_ns(origin, i, target, gap, rec.prompt_tokens - rec.cached_tokens)
                )
                rem = target - _now()
                if rem > 0:
                    await sleep(rem / 1e9)
            if role or i == 0 and hold:
                data = role + data
                role = b""
                await resp.prepare(request)  # buffers the held headers; they leave with this write
                rec.headers_ns = _now()
            t = _now()
            token_write_ns.append(t)
            await write(data)
            token_counts.append(ntok)
            if law is not None:
                gap = law.wrote(i)  # joins the running batch at its first chunk (left in finally)
        if n == 0 and kind == "crash":
            return await _fail_stream(server, request, resp, rec, enc, kind)
        if n == 0:
            if hold:
                await resp.prepare(request)
                rec.headers_ns = _now()
            await write(
                role
                + (
                    enc.finish_chunk(plan.finish)
                    if chat and not enc.w.finish_with_last_token
                    else enc.head
                    + (b'{"content":""}' if chat else b'""')
                    + enc.mid
                    + b'"'
                    + plan.finish.encode()
                    + b'"'
                    + enc.tail
                )
                + trailer
            )
        if n == cut_at:  # one-chunk streams: fail after the only token
            return await _fail_stream(server, request, resp, rec, enc, kind)
        await resp.write_eof()
    except (ConnectionError, asyncio.CancelledError):
        rec.done_ns = _now()
        raise
    finally:
        if law is not None and token_counts:
            law.decoding -= 1  # it left the running batch (finished, failed or cut)
    rec.done_ns = _now()
    server.completed += 1
    return resp


async def _whole(server: Responder, a: Answer, enc: Encoder, model: str, origin: int) -> web.StreamResponse:
    request, rec, plan, kind, chat = a.request, a.rec, a.plan, a.kind, a.chat
    ttft_ns, itl_ns = server.delays_ns
    n = len(plan.chunks)
    if ttft_ns or itl_ns:
        rem = origin + ttft_ns + max(0, n - 1) * itl_ns - _now()
        if rem > 0:
            await asyncio.sleep(rem / 1e9)
    if kind == "crash":
        crash_now(server.received)
    if kind in ("hang", "cut_off"):
        if kind == "hang":
            await asyncio.sleep(server.config.hang_s)
        abort(request)
        rec.done_ns = _now()
        return web.Response(status=200)
    if kind == "stream_error":
        rec.status = 500
        rec.done_ns = _now()
        return error_response(
            server.config.dialect, 500, server.config.error_message or "mock-engine injected error during generation"
        )
    content = "".join(t for k, t, _ in plan.chunks if k == "c")
    reasoning = "".join(t for k, t, _ in plan.chunks if k == "r")
    args = "".join(t for k, t, _ in plan.chunks if k == "t")
    usage: dict[str, Any] = {
        "prompt_tokens": rec.prompt_tokens,
        "completion_tokens": plan.generated,
        "total_tokens": rec.prompt_tokens + plan.generated,
    }
    if server.cache is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": rec.cached_tokens}
    fr = plan.finish
    if fr == "stop":
        fr = stream_rules(server.config.dialect).stop_finish
    if chat:
        msg: dict[str, Any] = {"role": "assistant", "content": content if not args else None}
        if reasoning:
            msg[REASONING_FIELD[server.config.dialect]] = reasoning
        if plan.tool_name is not None:
            msg["tool_calls"] = [
                {"id": plan.tool_id, "type": "function", "function": {"name": plan.tool_name, "arguments": args}}
            ]
        choice: dict[str, Any] = {"index": 0, "message": msg}
    else:
        choice = {"index": 0, "text": content}
    out = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-mock{rec.request_id}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{**choice, "logprobs": None, "finish_reason": fr}],
        "usage": usage,
    }
    payload = orjson.dumps(out)
    rec.status = 200
    rec.headers_ns = t = _now()
    rec.token_write_ns.append(t)
    rec.token_counts.append(plan.generated)
    resp = web.Response(status=200, body=payload, content_type="application/json")
    rec.done_ns = _now()
    server.completed += 1
    return resp
